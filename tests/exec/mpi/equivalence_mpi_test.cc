// Proof of meaning under mpirun (2 and 3 processes): every enumerated schedule of the four
// workloads, run by the plan runner on the MPI backend (ring collectives), equals the reference
// interpreter on the unscheduled program; see exec/schedule_checks.h for when the comparison is
// bitwise.
#include <gtest/gtest.h>

#include "exec/schedule_checks.h"
#include "tandem/comm/mpi.h"

namespace tandem::schedule::testing {
namespace {

std::unique_ptr<comm::Communicator> world() { return comm::mpi_wrap(MPI_COMM_WORLD); }

class MpiEquivalence : public ::testing::Test {
 protected:
  void SetUp() override { comm::set_chunk_bytes(64); }
  void TearDown() override { comm::set_chunk_bytes(0); }

  // Every rank checks; the verdicts are combined so that every rank fails together.
  void check(const Case& c, int min_schedules) {
    auto comm = world();
    if (comm->size() % c.program.groups() != 0)
      GTEST_SKIP() << c.label << " needs a multiple of " << c.program.groups() << " ranks";
    const Outcome o = check_all_schedules(c, all_plans(c), *comm);
    int bad = o.failures.empty() ? 0 : 1, any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_EQ(o.failures, "");
    EXPECT_EQ(any, 0) << "a schedule of " << c.label << " failed on another rank";
    EXPECT_GE(o.schedules, min_schedules);
  }
};

TEST_F(MpiEquivalence, Adam) {
  check(adam_case(DType::BF16, 1013), 11);
  check(adam_case(DType::F32, 2), 11);
}

TEST_F(MpiEquivalence, Lamb) { check(lamb_case(DType::BF16, 517), 11); }

TEST_F(MpiEquivalence, Megatron) {
  check(megatron_case(DType::F32, 7, 10, 6), 16);
  check(megatron_case(DType::BF16, 5, 3, 9), 16);
  check(megatron_case(DType::F32, 5, 3, 9, DType::BF16), 16);
}

TEST_F(MpiEquivalence, SumInPlace) {
  check(sum_in_place_case(DType::F32, 1013), 2);
  check(sum_in_place_case(DType::BF16, 1013), 2);
}

TEST_F(MpiEquivalence, Ring) {
  check(kv_ring_case(1013), 1);
  check(ring_step_case(DType::BF16, 7, 13), 8);
}

TEST_F(MpiEquivalence, Pipeline) { check(pipeline_case(DType::F32, 7, 10, 6), 30); }

}  // namespace
}  // namespace tandem::schedule::testing
