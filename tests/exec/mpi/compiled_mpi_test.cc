// The compiled schedules under mpirun (2 and 3 processes): every enumerated schedule of the four
// workloads, compiled by each process (the file lock of the cache makes them compile each source
// once), run on the MPI backend's ring collectives and point-to-point transfers, equal to the
// reference interpreter (bitwise where exec/compiled_checks.h says so).
#include <gtest/gtest.h>

#include "exec/compiled_checks.h"
#include "tandem/comm/mpi.h"

namespace tandem::codegen::testing {
namespace {

using schedule::testing::adam_case;
using schedule::testing::kv_ring_case;
using schedule::testing::lamb_case;
using schedule::testing::megatron_case;
using schedule::testing::pipeline_case;
using schedule::testing::ring_step_case;
using schedule::testing::sum_in_place_case;

std::unique_ptr<comm::Communicator> world() { return comm::mpi_wrap(MPI_COMM_WORLD); }

// Small chunks, so that the ring pipelines several chunks of these small tensors.
class CompiledMpi : public ::testing::Test {
 protected:
  void SetUp() override { comm::set_chunk_bytes(64); }
  void TearDown() override { comm::set_chunk_bytes(0); }
};

void expect_ok(const Case& c, const Schedules& all, comm::Communicator& comm) {
  const Outcome o = check_compiled(c, all, comm);
  EXPECT_EQ(o.failures, "") << c.label << " on " << comm.size() << " processes";
  EXPECT_EQ(o.schedules, static_cast<int>(all.plans.size()));
}

TEST_F(CompiledMpi, Adam) {
  auto comm = world();
  const Schedules bf16 = compile_all(dsl::workloads::adam(DType::BF16));
  const Schedules f32 = compile_all(dsl::workloads::adam(DType::F32));
  expect_ok(adam_case(DType::BF16, 1013), bf16, *comm);
  expect_ok(adam_case(DType::F32, 5), f32, *comm);
}

TEST_F(CompiledMpi, Bf16SumsReducedInF32AreBitwise) {
  // With reduce_in_f32 the 16-bit sums round once on the ring too: every schedule is bitwise.
  auto comm = world();
  const Schedules bf16 = compile_all(dsl::workloads::adam(DType::BF16));
  const Outcome o =
      check_compiled(adam_case(DType::BF16, 1013), bf16, *comm, {.reduce_in_f32 = true});
  EXPECT_EQ(o.failures, "");
  EXPECT_EQ(o.bitwise, o.schedules);
  const Schedules layer = compile_all(dsl::workloads::megatron_layer(DType::BF16, 0.1));
  const Outcome m =
      check_compiled(megatron_case(DType::BF16, 5, 3, 9), layer, *comm, {.reduce_in_f32 = true});
  EXPECT_EQ(m.failures, "");
}

TEST_F(CompiledMpi, Ring) {
  auto comm = world();
  expect_ok(kv_ring_case(1013), compile_all(dsl::workloads::kv_ring()), *comm);
  expect_ok(ring_step_case(DType::BF16, 7, 13),
            compile_all(schedule::testing::ring_step(DType::BF16)), *comm);
}

TEST_F(CompiledMpi, Lamb) {
  auto comm = world();
  expect_ok(lamb_case(DType::BF16, 517), compile_all(dsl::workloads::lamb(DType::BF16)), *comm);
}

TEST_F(CompiledMpi, Megatron) {
  auto comm = world();
  const Schedules f32 = compile_all(dsl::workloads::megatron_layer(DType::F32, 0.1));
  expect_ok(megatron_case(DType::F32, 7, 10, 6), f32, *comm);
  expect_ok(megatron_case(DType::F32, 2, 3, 5), f32, *comm);
  expect_ok(megatron_case(DType::F32, 5, 3, 9, DType::BF16),
            compile_all(dsl::workloads::megatron_layer(DType::F32, 0.1, DType::BF16)), *comm);
}

TEST_F(CompiledMpi, SumInPlace) {
  auto comm = world();
  expect_ok(sum_in_place_case(DType::BF16, 1013),
            compile_all(dsl::workloads::sum_in_place(DType::BF16)), *comm);
}

TEST_F(CompiledMpi, Pipeline) {
  auto comm = world();
  if (comm->size() % 2 != 0)
    GTEST_SKIP() << "the pipeline needs an even number of ranks (two equal groups)";
  expect_ok(pipeline_case(DType::F32, 7, 10, 6),
            compile_all(dsl::workloads::pipeline_stage(DType::F32, 0.1)), *comm);
}

}  // namespace
}  // namespace tandem::codegen::testing
