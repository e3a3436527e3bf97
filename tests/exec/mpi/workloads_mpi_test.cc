// The four workloads under mpirun (2 and 3 processes): the same closed-form inputs and the same
// independent checks as the thread suite, on the MPI backend.
#include <gtest/gtest.h>

#include "exec/workload_checks.h"
#include "tandem/comm/mpi.h"

namespace tandem::testing {
namespace {

std::unique_ptr<comm::Communicator> world() { return comm::mpi_wrap(MPI_COMM_WORLD); }

TEST(Mpi, Adam) {
  auto comm = world();
  for (DType t : {DType::BF16, DType::F16, DType::F32})
    for (int64_t n : {0, 1, 7, 1001}) check_optimizer(*comm, {false, t, n, false});
}

TEST(Mpi, Lamb) {
  auto comm = world();
  for (DType t : {DType::BF16, DType::F32})
    for (int64_t n : {1, 7, 1001}) check_optimizer(*comm, {true, t, n, false});
  check_optimizer(*comm, {true, DType::BF16, 5, true});
}

TEST(Mpi, MegatronLayer) {
  auto comm = world();
  for (const LayerCase& c :
       {LayerCase{DType::F32, 5, 7, 3, 0.1, 1234}, LayerCase{DType::F32, 1, 1, 2, 0.0, 1},
        LayerCase{DType::BF16, 6, 13, 5, 0.1, 7}})
    check_layer(*comm, c);
}

TEST(Mpi, PipelineStage) {
  auto comm = world();
  if (comm->size() % 2 != 0)
    GTEST_SKIP() << "the pipeline needs an even number of ranks (two equal groups)";
  for (const LayerCase& c :
       {LayerCase{DType::F32, 5, 7, 3, 0.1, 1234}, LayerCase{DType::BF16, 3, 5, 4, 0.2, 5}})
    check_pipeline(*comm, c);
}

}  // namespace
}  // namespace tandem::testing
