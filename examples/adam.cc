// Example: one data-parallel AdamW step, scheduled by hand into a ZeRO-style sharded optimizer
// step (CoCoNeT's fused(RS-C-AG) with sliced moments), run compiled and checked against the
// reference interpreter.
//
//   example_adam [ranks=2] [N=1000]            in-process ranks (threads)
//   mpirun -np 2 example_adam [N=1000]          one MPI process per rank
//
// The program (dsl::workloads::adam, src/dsl/workloads.cc): each rank holds its own bf16
// gradient g (Local) and the same f32 weights w and moments m, v (Replicated); an AllReduce
// sums the gradients, then every rank applies AdamW to all N elements and writes w, m and v in
// place. The schedule changes how it runs, never what it computes: each transformation below is
// checked by the DSL, and the end of main proves it by comparing with the program as written.
#include <fmt/format.h>

#include "example_support.h"
#include "tandem/core/error.h"
#include "tandem/dsl/dsl.h"
#include "tandem/schedule/transforms.h"

using namespace tandem;

int main(int argc, char** argv) try {
  const example::Launch launch(argc, argv, /*default_ranks=*/2);
  const int64_t n = launch.size(0, 1000);

  const dsl::Program adam = dsl::workloads::adam(DType::BF16);
  adam.validate();
  launch.show("the program as written", adam.str());

  schedule::Schedule s(adam);
  // 1. split the AllReduce into a ReduceScatter (g_sum.rs: each rank gets the sum of its 1/p of
  //    the elements) and an AllGather (g_sum.ag) that rebuilds the whole sum on every rank.
  s.split("g_sum");
  launch.show("after split(g_sum)", s.program().str());

  // 2. reorder the AllGather past the update: the AdamW arithmetic now runs on this rank's slice
  //    only (1/p of the work), and what is needed whole afterwards, the new weights, is gathered
  //    instead (w1.ag); the new moments are gathered too, for now (m1.ag, v1.ag).
  s.reorder("g_sum.ag", {"w1"});
  launch.show("after reorder(g_sum.ag, {w1})", s.program().str());

  // 3. as_slice: m and v are now only ever read and written through this rank's slice, so each
  //    rank stores just its 1/p of them (ZeRO's saving) and their AllGathers go away.
  s.as_slice("m");
  s.as_slice("v");
  launch.show("after as_slice(m), as_slice(v)", s.program().str());

  // 4. fuse the update into the ReduceScatter: the communicator's per-chunk hook runs it on each
  //    chunk as soon as that chunk is reduced, with the moment updates and the AllGather of the
  //    new weights, so the gradient is read once, while it is still in cache.
  s.fuse({"g_sum.rs", "m1", "v1", "w1.ag"});
  s.set_name("fused(RS-C-AG)+slice(m,v)");  // its recipe's name (schedule::Recipe)
  if (!example::same_as_recipe(launch, s)) return 1;
  const schedule::Plan plan = s.lower();
  launch.show("after fuse({g_sum.rs, m1, v1, w1.ag}): the plan", plan.str());

  // Emit the plan as C++ and compile it (or find it in the JIT cache), once per process.
  const auto compiled = exec::compile_plan(plan);
  const bool ok = launch.run([&](comm::Communicator& comm) {
    // Bitwise: the schedule keeps the order of every sum. Only a ring (MPI) of 3 or more ranks
    // differs: it rounds the bf16 sum after each hop where the reference rounds once.
    const double rtol = comm.backend() == comm::Backend::Thread || comm.size() <= 2 ? 0 : 1e-2;
    return example::check_against_reference(adam, compiled, comm, {{"N", n}},
                                            example::optimizer_scalars(comm.size()), rtol);
  });
  return ok ? 0 : 1;
} catch (const tandem::UserError& e) {
  fmt::print(stderr, "error: {}\n", e.what());
  return 1;
}
