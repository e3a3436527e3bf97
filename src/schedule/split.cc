// split: AllReduce -> ReduceScatter(dim 0) + AllGather.
#include "tandem/schedule/split.h"

#include <fmt/format.h>

#include "rewrite.h"
#include "tandem/core/error.h"

namespace tandem::schedule {

using dsl::Op;

Schedule::SplitResult split(Schedule& s, const StageRef& allreduce) {
  const auto start = std::chrono::steady_clock::now();
  const dsl::Program& p = s.program();
  const int ar = s.resolve(allreduce, "split");
  const dsl::Stage& st = p.stage(ar);
  const std::string who = fmt::format("split({})", p.display_name(ar));
  if (st.op != Op::AllReduce)
    user_error("{}: the stage is {} = {}(...), not an AllReduce; split turns an AllReduce into a ReduceScatter "
               "and an AllGather", who, p.display_name(ar), dsl::op_name(st.op));
  if (st.type.shape.rank() == 0)
    user_error("{}: the AllReduce's value has shape [] (a scalar), which has no parts to scatter; only a "
               "tensor of at least one dim can be split", who);
  if (s.fused_index(ar) >= 0 || s.overlap_index(ar) >= 0)
    user_error("{}: the AllReduce is already {}; split (and reorder) rewrite the program, so apply them before "
               "fuse and overlap", who, s.fused_index(ar) >= 0 ? "fused" : "overlapped");

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
  const std::string what = fmt::format("split({})", p.display_name(ar));
  s.rewrite(std::move(program), map);
  s.record(what, start);
  return {rs, ag};
}

}  // namespace tandem::schedule
