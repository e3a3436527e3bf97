// Example: one data-parallel LAMB step, scheduled by hand like Adam's (fused(RS-C-AG) with
// sliced moments), where the trust ratio's norms need every rank's slice; run compiled and
// checked against the reference interpreter.
//
//   example_lamb [ranks=2] [N=1000]            in-process ranks (threads)
//   mpirun -np 2 example_lamb [N=1000]          one MPI process per rank
//
// The program (dsl::workloads::lamb, src/dsl/workloads.cc): Adam's direction r, then the
// update w - lr * trust * r with the trust ratio ||w|| / ||r|| (1 where either is zero). ||w|| is
// written over this rank's slice of w (w_mine = scatter(w, 0)), so it is a sum of squares over
// the slice plus a cross-rank sum; on a slice, ||r|| becomes the same, which reorder adds by
// itself. The trust ratio needs both whole norms, so the final update cannot run in the
// ReduceScatter's hook with r: it gets a loop of its own.
#include <fmt/format.h>

#include "example_support.h"
#include "tandem/core/error.h"
#include "tandem/dsl/dsl.h"
#include "tandem/schedule/transforms.h"

using namespace tandem;

int main(int argc, char** argv) try {
  const example::Launch launch(argc, argv, /*default_ranks=*/2);
  const int64_t n = launch.size(0, 1000);

  const dsl::Program lamb = dsl::workloads::lamb(DType::BF16);
  lamb.validate();
  launch.show("the program as written", lamb.str());

  schedule::Schedule s(lamb);
  // 1. split the AllReduce into a ReduceScatter (g_sum.rs) and an AllGather (g_sum.ag).
  s.split("g_sum");
  launch.show("after split(g_sum)", s.program().str());

  // 2. reorder the AllGather past the whole update: every element-wise stage runs on this rank's
  //    slice; ||r|| becomes a sum of squares over the slice plus a cross-rank sum (the plan's
  //    "finish r_norm (combine across ranks)"), as ||w|| over w_mine already is; the new w, m
  //    and v are gathered afterwards.
  s.reorder("g_sum.ag", {"w1"});
  launch.show("after reorder(g_sum.ag, {w1})", s.program().str());

  // 3. as_slice: each rank stores only its slice of the moments m and v.
  s.as_slice("m");
  s.as_slice("v");
  launch.show("after as_slice(m), as_slice(v)", s.program().str());

  // 4. fuse Adam's direction and this rank's parts of ||r|| and ||w|| into the ReduceScatter's
  //    per-chunk hook, with the moment updates: one pass over the reduced gradient and over
  //    this rank's slice of w.
  s.fuse({"g_sum.rs", "m1", "v1", "r_norm", "w_norm"});
  // 5. fuse the last two stages, lr * trust * r and w minus that, into one loop over the slice.
  //    They are unnamed in the program; the AllGather of the new weights reads the second.
  const int w_new = s.program().stage(s.resolve("w1.ag", "lamb example")).args[0];
  s.fuse({s.program().stage(w_new).args[1], w_new});
  s.set_name("fused(RS-C-AG)+slice(m,v)");  // its recipe's name (schedule::Recipe)
  if (!example::same_as_recipe(launch, s)) return 1;
  const schedule::Plan plan = s.lower();
  launch.show("after the two fuses: the plan", plan.str());

  // Emit the plan as C++ and compile it (or find it in the JIT cache), once per process.
  const auto compiled = exec::compile_plan(plan);
  const bool ok = launch.run([&](comm::Communicator& comm) {
    // Not bitwise: the reference sums ||r||^2 over the whole tensor (r is Replicated as written),
    // the schedule per slice and then across ranks, which rounds differently (a few 2^-24
    // relative; tests/exec/schedule_checks.h derives the bound). ||w|| is over the slice in both. A
    // ring (MPI) of 3 or more ranks also rounds the bf16 sum at each hop.
    const double rtol = comm.backend() == comm::Backend::Thread || comm.size() <= 2 ? 1e-5 : 1e-2;
    return example::check_against_reference(lamb, compiled, comm, {{"N", n}},
                                            example::optimizer_scalars(comm.size()), rtol);
  });
  return ok ? 0 : 1;
} catch (const tandem::UserError& e) {
  fmt::print(stderr, "error: {}\n", e.what());
  return 1;
}
