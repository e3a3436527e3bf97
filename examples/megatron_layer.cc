// Example: Megatron's row-parallel layer, run on in-process ranks.
//
//   example_megatron_layer [ranks=2] [B=4 K=6 H=3]       in-process ranks (threads)
//   mpirun -np 2 example_megatron_layer [B K H]           one MPI process per rank
//
// The activations x [B, K] are Sliced along K (rank r holds its columns) and the weight
// w [K, H] along its rows, so each rank's x @ w is a partial sum (layout Partial); AllReduce
// adds the parts, then bias, dropout (the same mask on any rank count: it is keyed by element
// index) and the residual. The program text is in src/dsl/workloads.cc.
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
  const int first = mpi ? 1 : 2;  // where B K H start
  const int ranks = !mpi && argc > 1 ? std::atoi(argv[1]) : 2;
  const int64_t B = argc > first ? std::atoll(argv[first]) : 4;
  const int64_t K = argc > first + 1 ? std::atoll(argv[first + 1]) : 6;
  const int64_t H = argc > first + 2 ? std::atoll(argv[first + 2]) : 3;

  const dsl::Program layer = dsl::workloads::megatron_layer(DType::F32, /*dropout_p=*/0.1);
  layer.validate();

  auto run = [&](comm::Communicator& comm) {
    if (comm.rank() == 0) fmt::print("{}\n", layer.str());
    // Whole tensors, the same on every rank here; each rank passes only its piece of x and w.
    Tensor x = Tensor::empty(DType::F32, Shape{B, K}), w = Tensor::empty(DType::F32, Shape{K, H});
    Tensor bias = Tensor::empty(DType::F32, Shape{H}), residual = Tensor::zeros(DType::F32, Shape{B, H});
    for (int64_t i = 0; i < x.numel(); ++i) x.set(i, 0.1f * static_cast<float>(i % 7));
    for (int64_t i = 0; i < w.numel(); ++i) w.set(i, 0.05f * static_cast<float>(i % 5) - 0.1f);
    for (int64_t i = 0; i < H; ++i) bias.set(i, 0.01f * static_cast<float>(i));
    exec::RunArgs args;
    args.symbols = {{"B", B}, {"K", K}, {"H", H}};
    args.scalars = {{"seed", 2024}};
    args.inputs = {{"x", exec::piece_of(x, dsl::Sliced(1), comm.size(), comm.rank())},
                   {"w", exec::piece_of(w, dsl::Sliced(0), comm.size(), comm.rank())},
                   {"bias", bias},
                   {"residual", residual}};
    const exec::TensorMap out = exec::run_reference(layer, comm, args);
    if (comm.rank() == 0) {
      const Tensor& y = out.at("out");
      fmt::print("out on {} ranks ({}), [B={}, H={}]:\n", comm.size(), comm.backend(), B, H);
      for (int64_t b = 0; b < std::min<int64_t>(B, 4); ++b) {
        fmt::print(" ");
        for (int64_t h = 0; h < H; ++h) fmt::print(" {:+.5f}", y.get(b * H + h));
        fmt::print("\n");
      }
    }
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
