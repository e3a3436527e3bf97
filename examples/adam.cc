// Example: one data-parallel AdamW step as a tandem program, run on in-process ranks.
//
//   example_adam [ranks=2] [N=10]            in-process ranks (threads)
//   mpirun -np 2 example_adam [N=10]          one MPI process per rank
//
// Each rank holds its own bf16 gradient (Local) and the same f32 weights and moments
// (Replicated). The program sums the gradients with AllReduce, then applies the full AdamW
// formula with bias correction and decoupled weight decay, writing w, m and v in place. The
// program text is in src/dsl/workloads.cc (dsl::workloads::adam); it prints itself below.
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
  const int ranks = !mpi && argc > 1 ? std::atoi(argv[1]) : 2;
  const int64_t n = argc > (mpi ? 1 : 2) ? std::atoll(argv[mpi ? 1 : 2]) : 10;

  // Build, check and print the program.
  const dsl::Program adam = dsl::workloads::adam(DType::BF16);
  adam.validate();

  auto step = [&](comm::Communicator& comm) {
    if (comm.rank() == 0) fmt::print("{}\n", adam.str());
    // This rank's inputs: its own gradient, and the weights and moments every rank shares.
    Tensor g = Tensor::empty(DType::BF16, Shape{n});
    Tensor w = Tensor::empty(DType::F32, Shape{n}), m = Tensor::zeros(DType::F32, Shape{n}),
           v = Tensor::zeros(DType::F32, Shape{n});
    for (int64_t i = 0; i < n; ++i) {
      g.set(i, 0.01f * static_cast<float>((i % 5) - 2 + comm.rank()));
      w.set(i, 1.0f);
    }
    exec::RunArgs args;
    args.symbols = {{"N", n}};
    args.scalars = {{"lr", 1e-3},  {"beta1", 0.9},       {"beta2", 0.999},
                    {"eps", 1e-8}, {"weight_decay", 0.01}, {"step", 1},
                    {"grad_scale", 1.0 / comm.size()}};  // average the summed gradients
    args.inputs = {{"g", g}, {"w", w}, {"m", m}, {"v", v}};
    exec::run_reference(adam, comm, args);  // w, m and v now hold the step's result
    if (comm.rank() == 0) {
      fmt::print("after one step on {} ranks ({}):\n", comm.size(), comm.backend());
      for (int64_t i = 0; i < std::min<int64_t>(n, 5); ++i)
        fmt::print("  w[{}] = {:.7f}  m[{}] = {:+.6f}  v[{}] = {:.3e}\n", i, w.get(i), i, m.get(i), i, v.get(i));
    }
  };
  if (mpi) {
    auto world = comm::mpi_world();
    step(*world);
  } else {
    comm::run_ranks(ranks, step);
  }
  return 0;
} catch (const tandem::UserError& e) {
  fmt::print(stderr, "error: {}\n", e.what());
  return 1;
}
