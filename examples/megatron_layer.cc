// Example: Megatron's row-parallel layer, scheduled by hand so that the matmul overlaps the
// reduction of its result and the bias, dropout and residual run inside that reduction
// (CoCoNeT's ol(MM,fused(RS-C-AG))); run compiled and checked against the reference interpreter.
//
//   example_megatron_layer [ranks=2] [B=8 K=16 H=8]       in-process ranks (threads)
//   mpirun -np 2 example_megatron_layer [B K H]           one MPI process per rank
//
// The program (dsl::workloads::megatron_layer, src/dsl/workloads.cc): the activations x [B, K]
// are Sliced along K (rank r holds its columns) and the weight w [K, H] along its rows, so each
// rank's x @ w is a partial sum (layout Partial); an AllReduce adds the parts, then bias,
// dropout (a mask keyed by element index: the same on any rank count) and the residual.
#include <fmt/format.h>

#include "example_support.h"
#include "tandem/core/error.h"
#include "tandem/dsl/dsl.h"
#include "tandem/schedule/transforms.h"

using namespace tandem;

int main(int argc, char** argv) try {
  const example::Launch launch(argc, argv, /*default_ranks=*/2);
  const dsl::SymbolMap sizes = {
      {"B", launch.size(0, 8)}, {"K", launch.size(1, 16)}, {"H", launch.size(2, 8)}};

  const dsl::Program layer = dsl::workloads::megatron_layer(DType::F32, /*dropout_p=*/0.1);
  layer.validate();
  launch.show("the program as written", layer.str());

  schedule::Schedule s(layer);
  // 1. split the AllReduce z into a ReduceScatter (z.rs: each rank gets the full sum of its 1/p
  //    of the rows) and an AllGather (z.ag).
  s.split("z");
  launch.show("after split(z)", s.program().str());

  // 2. reorder the AllGather past the bias, dropout and residual: they run on this rank's rows
  //    only (1/p of the work), and the layer's output is gathered instead (out.ag).
  s.reorder("z.ag", {"out"});
  launch.show("after reorder(z.ag, {out})", s.program().str());

  // 3. fuse them into the ReduceScatter: the per-chunk hook adds the bias, drops out and adds the
  //    residual on each chunk as soon as it is reduced, and the AllGather of out joins the unit.
  s.fuse({"z.rs", "out.ag"});
  launch.show("after fuse({z.rs, out.ag}): the plan", s.str());

  // 4. overlap the matmul with that fused reduction, in 4 row blocks: while block b is reduced
  //    (on a communication thread), block b + 1 of x @ w is computed.
  s.overlap({"y", "z.rs"}, /*blocks=*/4);
  s.set_name("ol(MM,fused(RS-C-AG))");  // its recipe's name (schedule::Recipe)
  if (!example::same_as_recipe(launch, s)) return 1;
  const schedule::Plan plan = s.lower();
  launch.show("after overlap({y, z.rs}, 4 blocks): the plan", plan.str());

  // Emit the plan as C++ and compile it (or find it in the JIT cache), once per process.
  const auto compiled = exec::compile_plan(plan);
  const bool ok = launch.run([&](comm::Communicator& comm) {
    // Not bitwise: the overlap computes x @ w in row blocks and the reference computes it whole,
    // and BLAS need not round a row of a block as it rounds the same row of the whole product
    // (its kernels for a few rows may sum in another order). A ring (MPI) of 3 or more ranks
    // also moves the part boundaries, and with them the order of its sums.
    const double rtol = 1e-5;
    return example::check_against_reference(layer, compiled, comm, sizes, {{"seed", 2024}}, rtol);
  });
  return ok ? 0 : 1;
} catch (const tandem::UserError& e) {
  fmt::print(stderr, "error: {}\n", e.what());
  return 1;
}
