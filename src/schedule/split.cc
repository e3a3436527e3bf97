// split: AllReduce -> ReduceScatter(dim 0) + AllGather.
#include "tandem/schedule/split.h"

#include <fmt/format.h>

#include "checked.h"
#include "rewrite.h"
#include "tandem/core/error.h"

namespace tandem::schedule {

using dsl::Op;

namespace detail {

Rejection try_split(Schedule& s, int ar, Schedule::SplitResult* made) {
  const auto start = std::chrono::steady_clock::now();
  const dsl::Program& p = s.program();
  const dsl::Stage& st = p.stage(ar);
  const std::string who = fmt::format("split({})", p.display_name(ar));
  if (st.op != Op::AllReduce)
    return fmt::format(
        "{}: the stage is {} = {}(...), not an AllReduce; split turns an AllReduce into a "
        "ReduceScatter and an AllGather",
        who, p.display_name(ar), dsl::op_name(st.op));
  if (st.type.shape.rank() == 0)
    return fmt::format(
        "{}: the AllReduce's value has shape [] (a scalar), which has no parts to scatter; only a "
        "tensor of at least one dim can be split",
        who);
  if (s.fused_index(ar) >= 0 || s.overlap_index(ar) >= 0)
    return fmt::format(
        "{}: the AllReduce is already {}; split (and reorder) rewrite the program, so apply them "
        "before fuse and overlap",
        who, s.fused_index(ar) >= 0 ? "fused" : "overlapped");

  detail::Rewriter rw(p);
  int rs = -1, ag = -1;
  for (const dsl::Stage& x : p.stages()) {
    if (x.id != ar) {
      rw.set(x.id, rw.copy(x));
      continue;
    }
    dsl::Attrs a;
    a.reduce = x.attrs.reduce;
    a.dim = 0;
    const std::string base = x.name;
    rs = rw.add(Op::ReduceScatter, {rw.get(x.args[0])}, a, base.empty() ? "" : base + ".rs");
    ag = rw.add(Op::AllGather, {rs}, {}, base.empty() ? "" : base + ".ag");
    rw.set(x.id, ag);
  }
  auto [program, map] = rw.finish();
  s.rewrite(std::move(program), map);
  s.record(who, start);
  if (made != nullptr) *made = {rs, ag};
  return std::nullopt;
}

}  // namespace detail

Schedule::SplitResult split(Schedule& s, const StageRef& allreduce) {
  Schedule::SplitResult made{};
  if (auto why = detail::try_split(s, s.resolve(allreduce, "split"), &made)) user_error("{}", *why);
  return made;
}

}  // namespace tandem::schedule
