// Example: a pipeline stage: the Megatron layer on one group of ranks hands its output to the
// next group, run on in-process ranks.
//
//   example_pipeline_stage [ranks=4] [B=4 K=6 H=3]       in-process ranks (an even number)
//   mpirun -np 4 example_pipeline_stage [B K H]           one MPI process per rank
//
// The ranks split into two equal groups of consecutive ranks: ranks [0, n/2) form group 0,
// which runs the layer on its K-slices, and rank i of group 0 sends its copy of the output to
// rank n/2 + i, in group 1. Each rank gets back only its own group's outputs: "out" in group 0,
// "h" in group 1. The program text is in src/dsl/workloads.cc.
#include <fmt/format.h>

#include <cstdlib>

#include "tandem/comm/mpi.h"
#include "tandem/comm/thread.h"
#include "tandem/core/error.h"
#include "tandem/dsl/dsl.h"
#include "tandem/exec/reference.h"

using namespace tandem;

int main(int argc, char** argv) try {
  const bool mpi = comm::launched_by_mpirun();
  const int first = mpi ? 1 : 2;
  const int ranks = !mpi && argc > 1 ? std::atoi(argv[1]) : 4;
  const int64_t B = argc > first ? std::atoll(argv[first]) : 4;
  const int64_t K = argc > first + 1 ? std::atoll(argv[first + 1]) : 6;
  const int64_t H = argc > first + 2 ? std::atoll(argv[first + 2]) : 3;

  const dsl::Program stage = dsl::workloads::pipeline_stage(DType::F32, /*dropout_p=*/0.1);
  stage.validate();

  auto run = [&](comm::Communicator& comm) {
    if (comm.rank() == 0) fmt::print("{}\n", stage.str());
    const exec::Placement where = exec::placement(stage, comm);  // which group, which index
    exec::RunArgs args;
    args.symbols = {{"B", B}, {"K", K}, {"H", H}};
    args.scalars = {{"seed", 2024}};
    if (where.group == 0) {
      // Group 0's inputs, sliced over the group's ranks (not over all ranks).
      Tensor x = Tensor::empty(DType::F32, Shape{B, K}), w = Tensor::empty(DType::F32, Shape{K, H});
      for (int64_t i = 0; i < x.numel(); ++i) x.set(i, 0.1f * static_cast<float>(i % 7));
      for (int64_t i = 0; i < w.numel(); ++i) w.set(i, 0.05f * static_cast<float>(i % 5) - 0.1f);
      args.inputs = {{"x", exec::piece_of(x, dsl::Sliced(1), where.group_size, where.index)},
                     {"w", exec::piece_of(w, dsl::Sliced(0), where.group_size, where.index)},
                     {"bias", Tensor::zeros(DType::F32, Shape{H})},
                     {"residual", Tensor::zeros(DType::F32, Shape{B, H})}};
    }
    const exec::TensorMap out = exec::run_reference(stage, comm, args);
    for (const auto& [name, t] : out)
      fmt::print("rank {} (group {}, index {}): {} = {} first {:+.5f}\n", comm.rank(), where.group, where.index, name,
                 t.str(), t.numel() > 0 ? t.get(0) : 0.0f);
  };
  if (mpi) {
    auto world = comm::mpi_world();
    run(*world);
  } else {
    comm::run_ranks(ranks, run);
  }
  return 0;
} catch (const tandem::UserError& e) {
  fmt::print(stderr, "error: {}\n", e.what());
  return 1;
}
