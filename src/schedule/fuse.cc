// fuse: stages into one loop, or computations into the hook of one collective.
#include "tandem/schedule/fuse.h"

#include <fmt/format.h>

#include <algorithm>

#include "candidates.h"
#include "checked.h"
#include "rewrite.h"
#include "tandem/core/error.h"
#include "units.h"

namespace tandem::schedule {

using dsl::Op;
using dsl::OpKind;
using dsl::Program;
using dsl::Stage;

namespace {

bool in(const std::vector<char>& set, int id) { return set[static_cast<size_t>(id)] != 0; }

// The domain a loop stage needs: "S" plus the dim for Sliced values, "F" for everything else.
int domain_key(const dsl::Layout& l) { return l.is_sliced() ? l.dim : -1; }

// The value a loop stage ranges over: its own, or an accumulator's operand.
const Stage& ranged(const Program& p, const Stage& st) {
  return detail::is_accumulator(st) ? p.stage(st.args[0]) : st;
}

// Side accumulators of collective c's hook: norms (or sums over every dim) of an input, or of a
// scatter of one, over the hook's domain, that neither use c's result nor feed c. The hook streams
// this rank's part anyway, so folding them in saves a loop that would read it again (LAMB's ||w||
// over this rank's slice of w).
std::vector<int> side_accumulators(const Schedule& s, int c) {
  const Program& p = s.program();
  const Stage& cs = p.stage(c);
  const std::vector<char> below = detail::descendants(p, c),
                          feeds = detail::ancestors(p, {cs.args[0]});
  std::vector<int> out;
  for (const Stage& st : p.stages()) {
    if (!detail::is_accumulator(st) || in(below, st.id) || in(feeds, st.id) ||
        s.fused_index(st.id) >= 0)
      continue;
    const Stage& x = p.stage(st.args[0]);
    const bool in_memory =
        x.op == Op::Input || (x.op == Op::Scatter && p.stage(x.args[0]).op == Op::Input);
    if (in_memory && x.type.shape == cs.type.shape &&
        domain_key(x.type.layout) == domain_key(cs.type.layout) && !x.type.layout.is_local() &&
        x.type.group == cs.type.group)
      out.push_back(st.id);
  }
  return out;
}

}  // namespace

namespace detail {

Rejection check_fuse(const Schedule& s, std::vector<int> listed, const std::string& who,
                     FusedStage& out) {
  const Program& p = s.program();
  const size_t n = p.stages().size();
  if (listed.empty()) return fmt::format("{}: name the stages to fuse", who);
  std::sort(listed.begin(), listed.end());
  listed.erase(std::unique(listed.begin(), listed.end()), listed.end());

  // What may be fused, stage by stage.
  int collective = -1;
  std::vector<int> gathers;
  for (int id : listed) {
    const Stage& st = p.stage(id);
    const std::string xs = p.display_name(id);
    switch (dsl::op_kind(st.op)) {
      case OpKind::Source:
        return fmt::format("{}: {} is an {}; only computations and collectives are fused", who, xs,
                           dsl::op_name(st.op));
      case OpKind::Matmul:
        return fmt::format(
            "{}: {} is a matmul; a fused stage holds element-wise computations, updates, norms and "
            "at most "
            "one collective (overlap a matmul with the collective that consumes it instead)",
            who, xs);
      case OpKind::Scatter:
        return fmt::format(
            "{}: {} is a scatter, a view of this rank's part that costs nothing; fuse the stages "
            "that read it",
            who, xs);
      case OpKind::Transfer:
        return fmt::format(
            "{}: {} is a {}; fuse computations and collectives, and overlap a collective with a "
            "send instead",
            who, xs, dsl::op_name(st.op));
      case OpKind::Reduction:
        if (!detail::is_accumulator(st))
          return fmt::format(
              "{}: {} reduces over one dim; only norms and reductions over every dim fold into a "
              "loop",
              who, xs);
        break;
      case OpKind::Elementwise:
        if (st.type.shape.rank() == 0)
          return fmt::format(
              "{}: {} is scalar arithmetic (shape []), computed once per step outside every loop; "
              "fuse the "
              "tensor stages that use it",
              who, xs);
        break;
      case OpKind::Update:
        break;
      case OpKind::Collective:
        if (st.op == Op::AllGather) {
          gathers.push_back(id);
          break;
        }
        if (st.op == Op::Broadcast || st.op == Op::Shift)
          return fmt::format(
              "{}: {} is a {}, which has no per-chunk hook; only an AllReduce or a "
              "ReduceScatter runs "
              "computation inside it",
              who, xs, st.op == Op::Shift ? "Shift" : "Broadcast");
        if (collective >= 0)
          return fmt::format(
              "{}: {} and {} are both collectives; a fused stage holds at most one collective (an "
              "AllReduce, "
              "or a ReduceScatter with the AllGathers of what it computes)",
              who, p.display_name(collective), xs);
        collective = id;
        break;
    }
    const int f = s.fused_index(id);
    if (f >= 0)
      return fmt::format("{}: {} is already in fused stage #{}; a stage is fused at most once", who,
                         xs, f);
  }
  if (!gathers.empty() && (collective < 0 || p.stage(collective).op != Op::ReduceScatter))
    return fmt::format(
        "{}: {} is an AllGather; an AllGather joins a fused stage only with the ReduceScatter "
        "whose slice "
        "it gathers (after reorder)",
        who, p.display_name(gathers.front()));
  if (collective < 0 && listed.size() < 2 && !detail::is_accumulator(p.stage(listed[0])))
    return fmt::format("{}: a fused loop needs at least two stages (given only {})", who,
                       p.display_name(listed[0]));

  // The domain: the collective's value, or the first loop stage's.
  const Stage* dom = collective >= 0 ? &p.stage(collective) : nullptr;
  if (dom == nullptr)
    for (int id : listed)
      if (p.stage(id).op != Op::AllGather) {
        dom = &ranged(p, p.stage(id));
        break;
      }
  const dsl::SymShape shape = dom->type.shape;
  const int key = domain_key(dom->type.layout);
  if (collective >= 0 && p.stage(collective).op == Op::ReduceScatter &&
      p.stage(collective).attrs.dim != 0)
    return fmt::format(
        "{}: {} scatters along dim {}; its hook sees contiguous chunks of rows, so only a "
        "ReduceScatter along "
        "dim 0 runs computation inside it",
        who, p.display_name(collective), p.stage(collective).attrs.dim);

  auto fits = [&](const Stage& st) -> std::optional<std::string> {
    if (st.op == Op::AllGather || st.id == collective) return std::nullopt;
    const Stage& r = ranged(p, st);
    if (!(r.type.shape == shape))
      return fmt::format("{} has shape {}, but the fused stage runs over {}", p.display_name(st.id),
                         r.type.shape.str(), shape.str());
    if (domain_key(r.type.layout) != key)
      return fmt::format(
          "{} is {}, but the fused stage runs over {} values{}", p.display_name(st.id),
          r.type.layout.str(), dom->type.layout.str(),
          collective >= 0 ? fmt::format(" (the result of {})", p.display_name(collective)) : "");
    if (collective >= 0 && r.type.layout.is_local())
      return fmt::format(
          "{} is Local; a collective's hook computes on this rank's part of a value that is the "
          "same "
          "on every rank, and a Local value is not",
          p.display_name(st.id));
    if (r.type.group != dom->type.group)
      return fmt::format("{} runs in group {}, the fused stage in group {}", p.display_name(st.id),
                         r.type.group, dom->type.group);
    return std::nullopt;
  };
  const std::vector<char> feeds_collective =
      collective >= 0 ? detail::ancestors(p, {p.stage(collective).args[0]})
                      : std::vector<char>(n, 0);
  auto upstream = [&](int id) -> Rejection {
    if (collective >= 0 && id != collective && in(feeds_collective, id))
      return fmt::format(
          "{}: {} computes the input of {}; only computations on a collective's result run inside "
          "it (fuse "
          "{} into a loop of its own instead)",
          who, p.display_name(id), p.display_name(collective), p.display_name(id));
    return std::nullopt;
  };
  for (int id : listed)
    if (auto why = upstream(id)) return why;
  for (int id : listed)
    if (auto why = fits(p.stage(id))) return fmt::format("{}: {}", who, *why);

  // Closure: loop stages on a path between two listed stages, then side computations only the
  // fused stage uses.
  std::vector<char> member(n, 0);
  for (int id : listed) member[static_cast<size_t>(id)] = 1;
  {
    std::vector<char> below(n, 0);
    for (int id : listed) {
      const auto d = detail::descendants(p, id);
      for (size_t i = 0; i < n; ++i) below[i] |= d[i];
    }
    const auto above = detail::ancestors(p, listed);
    for (const Stage& st : p.stages())
      if (below[static_cast<size_t>(st.id)] && above[static_cast<size_t>(st.id)] &&
          !member[static_cast<size_t>(st.id)] &&
          (detail::is_elementwise_tensor(st) || detail::is_accumulator(st)) && !fits(st) &&
          s.fused_index(st.id) < 0)
        member[static_cast<size_t>(st.id)] = 1;
  }
  const auto users = detail::all_users(p);
  std::vector<char> is_output(n, 0);
  for (const dsl::Output& o : p.outputs()) is_output[static_cast<size_t>(o.stage)] = 1;
  for (bool grew = true; grew;) {
    grew = false;
    for (const Stage& st : p.stages()) {
      const auto& us = users[static_cast<size_t>(st.id)];
      if (member[static_cast<size_t>(st.id)] || !detail::is_elementwise_tensor(st) ||
          st.op == Op::Update || us.empty() || is_output[static_cast<size_t>(st.id)] ||
          in(feeds_collective, st.id) || fits(st) || s.fused_index(st.id) >= 0)
        continue;
      bool only_inside = true;
      for (int u : us)
        only_inside &= member[static_cast<size_t>(u)] && p.stage(u).op != Op::AllGather;
      if (only_inside) {
        member[static_cast<size_t>(st.id)] = 1;
        grew = true;
      }
    }
  }

  // Rules over the whole set.
  for (const Stage& st : p.stages()) {
    if (!member[static_cast<size_t>(st.id)]) continue;
    const std::string xs = p.display_name(st.id);
    if (auto why = upstream(st.id)) return why;
    for (int a : st.args) {
      if (!member[static_cast<size_t>(a)]) continue;
      if (detail::is_accumulator(p.stage(a)))
        return fmt::format(
            "{}: {} uses {}, which the same fused stage accumulates; a norm or reduction is "
            "complete only "
            "after the loop, so {} must run after it",
            who, xs, p.display_name(a), xs);
    }
    if (st.op == Op::AllGather && !member[static_cast<size_t>(st.args[0])])
      return fmt::format("{}: {} gathers {}, which the fused stage does not compute", who, xs,
                         p.display_name(st.args[0]));
  }

  FusedStage f;
  f.collective = collective;
  for (size_t i = 0; i < n; ++i)
    if (member[i]) f.stages.push_back(static_cast<int>(i));

  // No cycle: every unit the fused stage needs runs before it, and nothing it feeds runs before.
  std::vector<FusedStage> all = s.fused();
  all.push_back(f);
  const detail::UnitGraph g = detail::build_units(p, all, s.overlaps());
  const detail::UnitOrder order = detail::order_units(p, g);
  if (order.order.empty())
    return fmt::format(
        "{}: fusing would make a cycle: {}; a fused stage runs as one unit, so nothing outside it "
        "may both "
        "need and feed it",
        who, detail::describe_cycle(p, order.cycle));
  out = std::move(f);
  return std::nullopt;
}

Rejection try_fuse(Schedule& s, const std::vector<int>& ids, int* index) {
  const auto start = std::chrono::steady_clock::now();
  const std::string who = fmt::format("fuse({{{}}})", detail::name_list(s.program(), ids));
  FusedStage f;
  if (auto why = check_fuse(s, ids, who, f)) return why;
  const int added = s.add_fused(std::move(f));
  s.record(who, start);
  if (index != nullptr) *index = added;
  return std::nullopt;
}

std::vector<int> fusable_into(const Schedule& s, int c) {
  const Program& p = s.program();
  const Stage& cs = p.stage(c);
  if (s.fused_index(c) >= 0 || (cs.op != Op::AllReduce && cs.op != Op::ReduceScatter)) return {};
  if (cs.op == Op::ReduceScatter && cs.attrs.dim != 0) return {};
  const size_t n = p.stages().size();
  const std::vector<char> below = descendants(p, c);
  std::vector<char> member(n, 0);
  member[static_cast<size_t>(c)] = 1;
  const int key = domain_key(cs.type.layout);
  for (const Stage& st : p.stages()) {
    if (!below[static_cast<size_t>(st.id)] || s.fused_index(st.id) >= 0) continue;
    const bool loop = is_elementwise_tensor(st) || is_accumulator(st);
    const bool gather = st.op == Op::AllGather && cs.op == Op::ReduceScatter &&
                        member[static_cast<size_t>(st.args[0])];
    if (!loop && !gather) continue;
    if (loop) {
      const Stage& r = ranged(p, st);
      if (!(r.type.shape == cs.type.shape) || domain_key(r.type.layout) != key ||
          r.type.layout.is_local() || r.type.group != cs.type.group)
        continue;
    }
    // Every operand computed after the collective must be in the stage already (and not an
    // accumulator of it).
    bool ok = true;
    for (int a : st.args) {
      const bool after = a == c || below[static_cast<size_t>(a)];
      if (after && !member[static_cast<size_t>(a)]) ok = false;
      if (member[static_cast<size_t>(a)] && is_accumulator(p.stage(a))) ok = false;
    }
    if (ok) member[static_cast<size_t>(st.id)] = 1;
  }
  std::vector<int> out;
  for (size_t i = 0; i < n; ++i)
    if (member[i]) out.push_back(static_cast<int>(i));
  if (out.size() < 2) return {};
  // Side accumulators join only a hook that computes on the collective's result: they alone are
  // no reason for one.
  std::vector<int> with_side = out;
  if (std::any_of(out.begin(), out.end(),
                  [&](int x) { return x != c && p.stage(x).op != Op::AllGather; })) {
    const std::vector<int> side = side_accumulators(s, c);
    with_side.insert(with_side.end(), side.begin(), side.end());
  }
  for (const std::vector<int>* ids : {&with_side, &out}) {
    FusedStage f;
    if (!check_fuse(s, *ids, "fuse", f)) return f.stages;
  }
  return {};
}

std::vector<std::vector<int>> fusable_loops(const Schedule& s) {
  const Program& p = s.program();
  std::vector<std::vector<int>> groups;
  std::vector<std::pair<int, std::string>> keys;  // per group: (domain key, shape) of its stages
  for (const Stage& st : p.stages()) {
    if (s.fused_index(st.id) >= 0) continue;
    if (!(is_elementwise_tensor(st) || is_accumulator(st))) continue;
    const Stage& r = ranged(p, st);
    const std::pair<int, std::string> k{domain_key(r.type.layout),
                                        r.type.shape.str() + std::to_string(r.type.group)};
    // Join the latest group of the same domain if that stays legal, else start one.
    bool placed = false;
    for (int gi = static_cast<int>(groups.size()) - 1; gi >= 0 && !placed; --gi) {
      if (keys[static_cast<size_t>(gi)] != k) continue;
      std::vector<int> trial = groups[static_cast<size_t>(gi)];
      trial.push_back(st.id);
      // Legal, and exact: the closure may pull in other stages.
      FusedStage f;
      const bool closed = !check_fuse(s, trial, "fuse", f) && f.stages.size() == trial.size();
      if (closed) {
        groups[static_cast<size_t>(gi)] = std::move(trial);
        placed = true;
      }
      break;  // only the latest group of this domain is a candidate (keeps loops consecutive)
    }
    if (!placed) {
      groups.push_back({st.id});
      keys.push_back(k);
    }
  }
  std::vector<std::vector<int>> out;
  for (auto& g : groups)
    if (g.size() >= 2) out.push_back(std::move(g));
  return out;
}

}  // namespace detail

int fuse(Schedule& s, const std::vector<StageRef>& stages) {
  std::vector<int> ids;
  for (const StageRef& r : stages) ids.push_back(s.resolve(r, "fuse"));
  int index = -1;
  if (auto why = detail::try_fuse(s, ids, &index)) user_error("{}", *why);
  return index;
}

}  // namespace tandem::schedule
