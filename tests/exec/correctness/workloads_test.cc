// The four workloads on 1 to 4 in-process ranks, with sizes that do not divide by the rank
// count (and 0 and 1), each compared with an independent implementation (workload_checks.h).
#include <gtest/gtest.h>

#include "exec/workload_checks.h"
#include "tandem/comm/thread.h"

namespace tandem::testing {
namespace {

class Optimizers : public ::testing::TestWithParam<std::tuple<int, bool, DType>> {};

TEST_P(Optimizers, MatchTheFormula) {
  const auto [ranks, lamb, dtype] = GetParam();
  for (int64_t n : {0, 1, 7, 1001}) {
    comm::run_ranks(ranks, [&](comm::Communicator& c) {
      check_optimizer(c, {lamb, dtype, n, false});
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, Optimizers,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Bool(),
                                            ::testing::Values(DType::BF16, DType::F16, DType::F32)),
                         [](const auto& info) {
                           return fmt::format(
                               "{}_{}_{}ranks", std::get<1>(info.param) ? "lamb" : "adam",
                               dtype_name(std::get<2>(info.param)), std::get<0>(info.param));
                         });

TEST(Lamb, ZeroWeightsTakeTrustOne) {
  comm::run_ranks(3, [](comm::Communicator& c) {
    check_optimizer(c, {true, DType::BF16, 10, true});
  });
}

class Megatron : public ::testing::TestWithParam<int> {};

TEST_P(Megatron, MatchesTheLayer) {
  const int ranks = GetParam();
  const LayerCase cases[] = {
      {DType::F32, 5, 7, 3, 0.1, 1234},  // K = 7 over up to 4 ranks: uneven slices
      {DType::F32, 1, 2, 1, 0.0, 1},     // fewer K-columns than ranks: empty slices; no dropout
      {DType::F32, 9, 37, 11, 0.5, 99}, {DType::BF16, 6, 13, 5, 0.1, 7},
      {DType::F16, 4, 10, 6, 0.25, 8},
  };
  for (const LayerCase& c : cases)
    comm::run_ranks(ranks, [&](comm::Communicator& comm) { check_layer(comm, c); });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Megatron, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return fmt::format("{}ranks", info.param); });

TEST(Pipeline, HandsTheLayerToTheNextGroup) {
  const LayerCase cases[] = {{DType::F32, 5, 7, 3, 0.1, 1234}, {DType::BF16, 3, 5, 4, 0.2, 5}};
  for (int ranks : {2, 4})
    for (const LayerCase& c : cases)
      comm::run_ranks(ranks, [&](comm::Communicator& comm) { check_pipeline(comm, c); });
}

}  // namespace
}  // namespace tandem::testing
