// overlap: a chain of producer and consumer units run row block by row block.
#include "tandem/schedule/overlap.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "checked.h"
#include "rewrite.h"
#include "tandem/core/error.h"
#include "units.h"

namespace tandem::schedule {

using dsl::Op;
using dsl::OpKind;
using dsl::Program;
using dsl::Stage;

namespace detail {

Rejection try_overlap(Schedule& s, const std::vector<int>& ids, int blocks, int* index) {
  const auto start = std::chrono::steady_clock::now();
  const Program& p = s.program();
  const std::string who = fmt::format("overlap({{{}}})", detail::name_list(p, ids));
  if (ids.size() < 2)
    return fmt::format(
        "{}: name a producer and its consumer (at least two stages); overlap runs them block by "
        "block",
        who);
  if (blocks < 1)
    return fmt::format("{}: {} blocks; overlap needs at least 1 row block", who, blocks);

  // The units named: a stage stands for its whole fused stage.
  std::vector<std::vector<int>> units;
  for (int id : ids) {
    const int f = s.fused_index(id);
    units.push_back(f >= 0 ? s.fused()[static_cast<size_t>(f)].stages : std::vector<int>{id});
    const Stage& st = p.stage(id);
    const OpKind k = dsl::op_kind(st.op);
    const bool ok = f >= 0 || k == OpKind::Matmul || k == OpKind::Collective || st.op == Op::Send ||
                    detail::is_elementwise_tensor(st);
    if (!ok || st.op == Op::Broadcast || st.op == Op::Shift || st.op == Op::Update)
      return fmt::format(
          "{}: {} is {} ({}); only matmuls, AllReduce/ReduceScatter/AllGather (fused or not), "
          "element-wise "
          "computations and sends run block by block",
          who, p.display_name(id),
          st.op == Op::Broadcast ? "a Broadcast"
          : st.op == Op::Shift   ? "a Shift"
                                 : "not blockable",
          dsl::op_name(st.op));
    const int o = s.overlap_index(id);
    if (o >= 0)
      return fmt::format(
          "{}: {} is already overlapped (overlap #{}); a stage is overlapped at most once", who,
          p.display_name(id), o);
  }
  // Each unit consumes the one before it.
  auto resolve_view = [&](int a) {
    while (p.stage(a).op == Op::Scatter) a = p.stage(a).args[0];
    return a;
  };
  for (size_t i = 1; i < units.size(); ++i) {
    bool consumes = false;
    for (int x : units[i])
      for (int a : p.stage(x).args)
        consumes |= std::find(units[i - 1].begin(), units[i - 1].end(), resolve_view(a)) !=
                    units[i - 1].end();
    if (!consumes)
      return fmt::format(
          "{}: {} does not use {}; overlap runs a producer and its consumer block by block, so "
          "each stage "
          "must consume the one before it",
          who, p.display_name(ids[i]), p.display_name(ids[i - 1]));
  }

  std::set<int> region;
  for (const auto& u : units) region.insert(u.begin(), u.end());
  const auto users = detail::all_users(p);
  // The receive of every send joins (in its own group), and so do AllGathers of slices made inside.
  for (bool grew = true; grew;) {
    grew = false;
    for (int x : std::vector<int>(region.begin(), region.end())) {
      const Stage& st = p.stage(x);
      for (int u : users[static_cast<size_t>(x)]) {
        const Stage& us = p.stage(u);
        const bool joins = (st.op == Op::Send && us.op == Op::Recv) ||
                           (st.type.layout.is_sliced() && us.op == Op::AllGather);
        if (joins && !region.count(u)) {
          const int f = s.fused_index(u);
          if (f >= 0)
            for (int m : s.fused()[static_cast<size_t>(f)].stages) region.insert(m);
          region.insert(u);
          grew = true;
        }
      }
    }
  }

  // Rows: every blocked value has the same dim 0.
  std::optional<dsl::Dim> rows;
  int rows_from = -1;
  for (int x : region) {
    const Stage& st = p.stage(x);
    const std::string xs = p.display_name(x);
    if (detail::is_accumulator(st) || st.op == Op::Reduce)
      return fmt::format(
          "{}: {} reduces over the blocked rows; blocks are independent, so a whole-tensor "
          "reduction cannot "
          "run inside an overlap",
          who, xs);
    if (st.op == Op::Matmul) {
      const Stage& a = p.stage(st.args[0]);
      if (a.type.shape.rank() != 2 || p.stage(st.args[1]).type.shape.rank() != 2)
        return fmt::format("{}: {} is a batched matmul; only a 2-D matmul is split into row blocks",
                           who, xs);
      if (a.type.layout.is_sliced() && a.type.layout.dim == 0)
        return fmt::format(
            "{}: {}'s rows are sliced ({} is Sliced(0)); a matmul is blocked by rows, so its rows "
            "must be "
            "whole on every rank",
            who, xs, p.display_name(a.id));
    }
    if (st.op == Op::Send) continue;
    if (st.type.shape.rank() == 0) continue;
    if (!rows) {
      rows = st.type.shape[0];
      rows_from = x;
    } else if (!(st.type.shape[0] == *rows)) {
      return fmt::format(
          "{}: {} has {} rows but {} has {}; every value run block by block must have the same "
          "rows (dim 0)",
          who, xs, st.type.shape[0].str(), p.display_name(rows_from), rows->str());
    }
    if (st.type.layout.is_sliced() && st.type.layout.dim != 0)
      return fmt::format(
          "{}: {} is Sliced({}); inside an overlap only whole values and slices of the blocked "
          "rows are "
          "allowed",
          who, xs, st.type.layout.dim);
    // Slices made inside stay inside: each block is split among the ranks separately.
    if (st.type.layout.is_sliced())
      for (int u : users[static_cast<size_t>(x)])
        if (!region.count(u))
          return fmt::format(
              "{}: {} is Sliced and used by {} outside the overlapped stages; inside an overlap "
              "each block is "
              "split among the ranks separately, so a slice made inside must be used inside (add "
              "{})",
              who, xs, p.display_name(u), p.display_name(u));
    // Slices of the blocked rows made outside cannot be read block by block.
    if (st.op != Op::Matmul)
      for (int a : st.args) {
        const Stage& as = p.stage(a);
        // (A scatter is a view of a whole value, read at global positions: it is fine.)
        if (!region.count(a) && as.op != Op::Scatter && as.type.layout.is_sliced() &&
            as.type.shape.rank() > 0 && as.type.shape[0] == *rows)
          return fmt::format(
              "{}: {} reads {}, a slice of the blocked rows made outside the overlap; its parts do "
              "not match "
              "the blocks' parts",
              who, xs, p.display_name(a));
      }
  }
  for (int x : region)
    if (s.overlap_index(x) >= 0)
      return fmt::format("{}: {} is already overlapped (overlap #{})", who, p.display_name(x),
                         s.overlap_index(x));

  Overlap o;
  o.stages.assign(region.begin(), region.end());
  o.blocks = blocks;
  std::vector<Overlap> all = s.overlaps();
  all.push_back(o);
  const detail::UnitGraph g = detail::build_units(p, s.fused(), all);
  for (int x : region)
    if (g.unit_of[static_cast<size_t>(x)] >= 0)
      for (int m : g.units[static_cast<size_t>(g.unit_of[static_cast<size_t>(x)])].stages)
        if (!region.count(m))
          return fmt::format(
              "{}: {} shares a fused stage with {}, which is not overlapped; overlap whole fused "
              "stages",
              who, p.display_name(x), p.display_name(m));
  const detail::UnitOrder order = detail::order_units(p, g);
  if (order.order.empty())
    return fmt::format(
        "{}: the overlapped stages must run together, but something outside them sits between: {}",
        who, detail::describe_cycle(p, order.cycle));
  const std::string what =
      fmt::format("overlap({{{}}}, {} blocks)", detail::name_list(p, ids), blocks);
  const int added = s.add_overlap(std::move(o));
  s.record(what, start);
  if (index != nullptr) *index = added;
  return std::nullopt;
}

}  // namespace detail

int overlap(Schedule& s, const std::vector<StageRef>& stages, int blocks) {
  std::vector<int> ids;
  for (const StageRef& r : stages) ids.push_back(s.resolve(r, "overlap"));
  int index = -1;
  if (auto why = detail::try_overlap(s, ids, blocks, &index)) user_error("{}", *why);
  return index;
}

}  // namespace tandem::schedule
