// Building, ordering and explaining the unit graph.
#include "units.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <set>

#include "rewrite.h"
#include "tandem/core/error.h"

namespace tandem::schedule::detail {

using dsl::Op;
using dsl::OpKind;
using dsl::Program;
using dsl::Stage;

namespace {

UnitKind kind_of(const Stage& s) {
  switch (dsl::op_kind(s.op)) {
    case OpKind::Elementwise:
      return s.type.shape.rank() == 0 ? UnitKind::Scalar : UnitKind::Loop;
    case OpKind::Update:
      return UnitKind::Loop;
    case OpKind::Reduction:
      return is_accumulator(s) ? UnitKind::Accumulate : UnitKind::Reduce;
    case OpKind::Matmul:
      return UnitKind::Matmul;
    case OpKind::Collective:
      return UnitKind::Collective;
    case OpKind::Transfer:
      return s.op == Op::Send ? UnitKind::Send : UnitKind::Recv;
    default:
      internal_error(fmt::format("stage {} makes no unit", s.id));
  }
}

}  // namespace

int producer_unit(const Program& p, const UnitGraph& g, int stage) {
  while (true) {
    const int u = g.unit_of[static_cast<size_t>(stage)];
    if (u >= 0) return u;
    const Stage& s = p.stage(stage);
    if (s.op != Op::Scatter) return -1;
    stage = s.args[0];
  }
}

UnitGraph build_units(const Program& p, const std::vector<FusedStage>& fused,
                      const std::vector<Overlap>& overlaps) {
  UnitGraph g;
  const size_t n = p.stages().size();
  g.unit_of.assign(n, -1);
  for (size_t f = 0; f < fused.size(); ++f) {
    Unit u;
    u.stages = fused[f].stages;
    u.fused = static_cast<int>(f);
    u.collective = fused[f].collective;
    u.kind = u.collective >= 0 ? UnitKind::Collective : UnitKind::Loop;
    u.group = p.stage(u.stages.front()).type.group;
    for (int s : u.stages) g.unit_of[static_cast<size_t>(s)] = static_cast<int>(g.units.size());
    g.units.push_back(std::move(u));
  }
  for (const Stage& s : p.stages()) {
    if (g.unit_of[static_cast<size_t>(s.id)] >= 0) continue;
    const OpKind k = dsl::op_kind(s.op);
    if (k == OpKind::Source || k == OpKind::Scatter) continue;
    Unit u;
    u.kind = kind_of(s);
    u.stages = {s.id};
    if (u.kind == UnitKind::Collective) u.collective = s.id;
    u.group = s.type.group;
    if (s.op == Op::Send) u.group = p.stage(s.args[0]).type.group;
    g.unit_of[static_cast<size_t>(s.id)] = static_cast<int>(g.units.size());
    g.units.push_back(std::move(u));
  }
  for (size_t o = 0; o < overlaps.size(); ++o)
    for (int s : overlaps[o].stages) {
      const int u = g.unit_of[static_cast<size_t>(s)];
      if (u >= 0) g.units[static_cast<size_t>(u)].overlap = static_cast<int>(o);
    }

  g.preds.assign(g.units.size(), {});
  auto edge = [&](int from, int to, int why_from, int why_to) {
    if (from < 0 || to < 0 || from == to) return;
    auto& list = g.preds[static_cast<size_t>(to)];
    if (std::find(list.begin(), list.end(), from) == list.end()) {
      list.push_back(from);
      g.why[{from, to}] = {why_from, why_to};
    }
  };
  for (const Stage& s : p.stages()) {
    const int u = g.unit_of[static_cast<size_t>(s.id)];
    if (u < 0) continue;
    for (int a : s.args) {
      int src = a;
      while (g.unit_of[static_cast<size_t>(src)] < 0 && p.stage(src).op == Op::Scatter)
        src = p.stage(src).args[0];
      edge(producer_unit(p, g, a), u, src, s.id);
    }
  }
  // Anti-dependencies: whoever reads an input (directly or through a scatter of it) runs before
  // the unit that overwrites it in place.
  const auto users = all_users(p);
  for (const Stage& s : p.stages()) {
    if (s.op != Op::Update) continue;
    const int t = s.args[0];
    const int uu = g.unit_of[static_cast<size_t>(s.id)];
    std::vector<int> frontier{t};
    while (!frontier.empty()) {
      const int v = frontier.back();
      frontier.pop_back();
      for (int r : users[static_cast<size_t>(v)]) {
        if (r == s.id) continue;
        if (p.stage(r).op == Op::Scatter) {
          frontier.push_back(r);
          continue;
        }
        edge(g.unit_of[static_cast<size_t>(r)], uu, r, s.id);
      }
    }
  }
  return g;
}

UnitOrder order_units(const Program& p, const UnitGraph& g) {
  const int nu = static_cast<int>(g.units.size());
  // Nodes: a unit, or one (overlap, group) cluster of units.
  std::map<std::pair<int, int>, int> cluster_id;
  std::vector<int> node_of(static_cast<size_t>(nu));
  std::vector<std::vector<int>> members;
  for (int u = 0; u < nu; ++u) {
    const Unit& unit = g.units[static_cast<size_t>(u)];
    if (unit.overlap >= 0) {
      auto [it, fresh] = cluster_id.emplace(std::make_pair(unit.overlap, unit.group),
                                            static_cast<int>(members.size()));
      if (fresh) members.emplace_back();
      node_of[static_cast<size_t>(u)] = it->second;
      members[static_cast<size_t>(it->second)].push_back(u);
    } else {
      node_of[static_cast<size_t>(u)] = static_cast<int>(members.size());
      members.push_back({u});
    }
  }
  const int nn = static_cast<int>(members.size());
  auto first_stage = [&](int u) { return g.units[static_cast<size_t>(u)].stages.front(); };
  std::vector<int> node_key(static_cast<size_t>(nn), 1 << 30);
  for (int v = 0; v < nn; ++v)
    for (int u : members[static_cast<size_t>(v)])
      node_key[static_cast<size_t>(v)] = std::min(node_key[static_cast<size_t>(v)], first_stage(u));

  std::vector<std::set<int>> node_preds(static_cast<size_t>(nn));
  for (int u = 0; u < nu; ++u)
    for (int q : g.preds[static_cast<size_t>(u)])
      if (node_of[static_cast<size_t>(q)] != node_of[static_cast<size_t>(u)])
        node_preds[static_cast<size_t>(node_of[static_cast<size_t>(u)])].insert(
            node_of[static_cast<size_t>(q)]);

  // Kahn's algorithm with the smallest key first.
  auto kahn = [](int n, const std::vector<std::set<int>>& preds,
                 const std::function<int(int)>& key) {
    std::vector<int> missing(static_cast<size_t>(n));
    std::vector<std::vector<int>> succ(static_cast<size_t>(n));
    for (int v = 0; v < n; ++v) {
      missing[static_cast<size_t>(v)] = static_cast<int>(preds[static_cast<size_t>(v)].size());
      for (int q : preds[static_cast<size_t>(v)]) succ[static_cast<size_t>(q)].push_back(v);
    }
    std::set<std::pair<int, int>> ready;
    for (int v = 0; v < n; ++v)
      if (missing[static_cast<size_t>(v)] == 0) ready.insert({key(v), v});
    std::vector<int> out;
    while (!ready.empty()) {
      const int v = ready.begin()->second;
      ready.erase(ready.begin());
      out.push_back(v);
      for (int s : succ[static_cast<size_t>(v)])
        if (--missing[static_cast<size_t>(s)] == 0) ready.insert({key(s), s});
    }
    return out;
  };

  UnitOrder result;
  const std::vector<int> nodes =
      kahn(nn, node_preds, [&](int v) { return node_key[static_cast<size_t>(v)]; });
  if (static_cast<int>(nodes.size()) == nn) {
    for (int v : nodes) {
      const std::vector<int>& m = members[static_cast<size_t>(v)];
      if (m.size() == 1) {
        result.order.push_back(m[0]);
        continue;
      }
      // Order the cluster's units among themselves.
      std::vector<std::set<int>> local(m.size());
      for (size_t i = 0; i < m.size(); ++i)
        for (int q : g.preds[static_cast<size_t>(m[i])]) {
          auto it = std::find(m.begin(), m.end(), q);
          if (it != m.end()) local[i].insert(static_cast<int>(it - m.begin()));
        }
      const std::vector<int> inner = kahn(static_cast<int>(m.size()), local, [&](int i) {
        return first_stage(m[static_cast<size_t>(i)]);
      });
      TANDEM_CHECK(inner.size() == m.size(), "cycle inside an overlap cluster");
      for (int i : inner) result.order.push_back(m[static_cast<size_t>(i)]);
    }
    return result;
  }

  // A cycle: find one among the nodes by depth-first search, and explain it by stages.
  std::vector<int> color(static_cast<size_t>(nn), 0), parent(static_cast<size_t>(nn), -1);
  std::vector<int> cyc;
  std::function<bool(int)> dfs = [&](int v) -> bool {
    color[static_cast<size_t>(v)] = 1;
    for (int q : node_preds[static_cast<size_t>(v)]) {
      if (color[static_cast<size_t>(q)] == 1) {
        // q -> ... -> v -> q along "preds": collect v, parent(v), ..., q.
        for (int x = v; x != -1; x = parent[static_cast<size_t>(x)]) {
          cyc.push_back(x);
          if (x == q) break;
        }
        return true;
      }
      if (color[static_cast<size_t>(q)] == 0) {
        parent[static_cast<size_t>(q)] = v;
        if (dfs(q)) return true;
      }
    }
    color[static_cast<size_t>(v)] = 2;
    return false;
  };
  for (int v = 0; v < nn && cyc.empty(); ++v)
    if (color[static_cast<size_t>(v)] == 0) dfs(v);
  // cyc[i + 1] needs cyc[i] (the DFS walked from each node to a predecessor, and the parent
  // chain leads back down), and cyc.front() needs cyc.back(): explain each edge by its stages.
  auto witness = [&](int from_node, int to_node) -> std::pair<int, int> {
    for (int u : members[static_cast<size_t>(to_node)])
      for (int q : g.preds[static_cast<size_t>(u)])
        if (node_of[static_cast<size_t>(q)] == from_node) return g.why.at({q, u});
    return {-1, -1};
  };
  for (size_t i = 0; i < cyc.size(); ++i) {
    const int from = cyc[i], to = cyc[(i + 1) % cyc.size()];
    const auto [a, b] = witness(from, to);
    result.cycle.push_back(a);
    result.cycle.push_back(b);
  }
  (void)p;
  return result;
}

std::string describe_cycle(const Program& p, const std::vector<int>& cycle) {
  std::vector<std::string> parts;
  for (size_t i = 0; i + 1 < cycle.size(); i += 2) {
    const int a = cycle[i], b = cycle[i + 1];
    if (a < 0 || b < 0) continue;
    const Stage& sb = p.stage(b);
    if (sb.op == Op::Update && sb.args[0] != a && p.stage(a).op != Op::Update &&
        std::find(sb.args.begin(), sb.args.end(), a) == sb.args.end())
      parts.push_back(fmt::format("{} overwrites input '{}' that {} reads", p.display_name(b),
                                  p.display_name(sb.args[0]), p.display_name(a)));
    else
      parts.push_back(fmt::format("{} needs {}", p.display_name(b), p.display_name(a)));
  }
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i];
  return out;
}

}  // namespace tandem::schedule::detail
