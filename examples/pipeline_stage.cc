// Example: a pipeline stage (the Megatron layer on one group of ranks, handing its output to the
// next group), scheduled by hand so that each rank sends only its slice of the output, and the
// matmul, the fused reduction and the send all overlap block by block (CoCoNeT's
// ol(MM,fused(RS-C)-P2P)-AG); run compiled and checked against the reference interpreter.
//
//   example_pipeline_stage [ranks=4] [B=8 K=16 H=8]       in-process ranks (an even number)
//   mpirun -np 4 example_pipeline_stage [B K H]           one MPI process per rank
//
// The program (dsl::workloads::pipeline_stage, src/dsl/workloads.cc): the ranks split into two
// equal groups of consecutive ranks; group 0 runs the layer on its K-slices (see
// megatron_layer.cc) and rank i of group 0 sends its copy of the output to rank i of group 1.
#include <fmt/format.h>

#include "example_support.h"
#include "tandem/core/error.h"
#include "tandem/dsl/dsl.h"
#include "tandem/schedule/transforms.h"

using namespace tandem;

int main(int argc, char** argv) try {
  const example::Launch launch(argc, argv, /*default_ranks=*/4);
  const dsl::SymbolMap sizes = {
      {"B", launch.size(0, 8)}, {"K", launch.size(1, 16)}, {"H", launch.size(2, 8)}};

  const dsl::Program stage = dsl::workloads::pipeline_stage(DType::F32, /*dropout_p=*/0.1);
  stage.validate();
  launch.show("the program as written", stage.str());

  schedule::Schedule s(stage);
  // 1. split the AllReduce z into a ReduceScatter (z.rs) and an AllGather (z.ag), in group 0.
  s.split("z");
  launch.show("after split(z)", s.program().str());

  // 2. reorder the AllGather past the bias, dropout, residual, the send and the receive: group 0
  //    computes on its rows only, each rank sends only its 1/p of the rows (the send moves 1/p
  //    of the bytes), and the whole activations are gathered in group 1 (h.ag), and in group 0
  //    for its own output (out.ag).
  s.reorder("z.ag", {"h"});
  launch.show("after reorder(z.ag, {h})", s.program().str());

  // 3. fuse the bias, dropout and residual into the ReduceScatter's per-chunk hook, with the
  //    AllGather of out.
  s.fuse({"z.rs", "out.ag"});
  launch.show("after fuse({z.rs, out.ag}): the plan", s.str());

  // 4. overlap the chain matmul -> fused reduction -> send in 4 row blocks: block b + 1 of the
  //    matmul is computed while block b is reduced and sent to group 1 (on a communication
  //    thread); group 1 receives and gathers block by block.
  s.overlap({"y", "z.rs", "out_to_next"}, /*blocks=*/4);
  s.set_name("ol(MM,fused(RS-C)-P2P)-AG");  // its recipe's name (schedule::Recipe)
  if (!example::same_as_recipe(launch, s)) return 1;
  const schedule::Plan plan = s.lower();
  launch.show("after overlap({y, z.rs, out_to_next}, 4 blocks): the plan", plan.str());

  // Emit the plan as C++ and compile it (or find it in the JIT cache), once per process.
  const auto compiled = exec::compile_plan(plan);
  const bool ok = launch.run([&](comm::Communicator& comm) {
    // Within a tolerance, as for the Megatron layer: the matmul is computed in row blocks.
    const double rtol = 1e-5;
    return example::check_against_reference(stage, compiled, comm, sizes, {{"seed", 2024}}, rtol);
  });
  return ok ? 0 : 1;
} catch (const tandem::UserError& e) {
  fmt::print(stderr, "error: {}\n", e.what());
  return 1;
}
