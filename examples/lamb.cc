// Example: one data-parallel LAMB step, run on in-process ranks.
//
//   example_lamb [ranks=2] [N=10]            in-process ranks (threads)
//   mpirun -np 2 example_lamb [N=10]          one MPI process per rank
//
// LAMB is Adam's direction r scaled per tensor by the trust ratio ||w|| / ||r||: the program
// computes both norms (scalars every rank shares) and selects 1 where either is zero. The
// program text is in src/dsl/workloads.cc (dsl::workloads::lamb).
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

  const dsl::Program lamb = dsl::workloads::lamb(DType::BF16);
  lamb.validate();

  auto step = [&](comm::Communicator& comm) {
    if (comm.rank() == 0) fmt::print("{}\n", lamb.str());
    Tensor g = Tensor::empty(DType::BF16, Shape{n});
    Tensor w = Tensor::empty(DType::F32, Shape{n}), m = Tensor::zeros(DType::F32, Shape{n}),
           v = Tensor::zeros(DType::F32, Shape{n});
    for (int64_t i = 0; i < n; ++i) {
      g.set(i, 0.01f * static_cast<float>((i % 5) - 2 + comm.rank()));
      w.set(i, 0.5f + 0.1f * static_cast<float>(i % 3));
    }
    exec::RunArgs args;
    args.symbols = {{"N", n}};
    args.scalars = {{"lr", 1e-2},  {"beta1", 0.9},       {"beta2", 0.999},
                    {"eps", 1e-6}, {"weight_decay", 0.01}, {"step", 1},
                    {"grad_scale", 1.0 / comm.size()}};
    args.inputs = {{"g", g}, {"w", w}, {"m", m}, {"v", v}};
    exec::run_reference(lamb, comm, args);
    if (comm.rank() == 0) {
      fmt::print("after one step on {} ranks ({}):\n", comm.size(), comm.backend());
      for (int64_t i = 0; i < std::min<int64_t>(n, 5); ++i) fmt::print("  w[{}] = {:.7f}\n", i, w.get(i));
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
