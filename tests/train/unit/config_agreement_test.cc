// The start-up check that every rank was given the same training flags: in-process ranks, each
// handed its own config, must agree or all fail with one message naming the flag, the ranks and
// their values.
#include "../../../src/train/config_agreement.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tandem/comm/thread.h"
#include "train/test_util.h"

namespace tandem::train {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Runs the check on `configs.size()` in-process ranks, rank r with configs[r] and corpora[r]
// (default: one corpus for all); "" when they agree, else the message (every rank must throw).
std::string disagreement(const std::vector<TrainConfig>& configs,
                         std::vector<data::Corpus> corpora = {}) {
  if (corpora.empty())
    corpora.assign(configs.size(), data::make_corpus(std::string(600, 'a'), "a"));
  const int n = static_cast<int>(configs.size());
  std::vector<std::string> messages(n);
  comm::run_ranks(n, [&](comm::Communicator& world) {
    const int r = world.rank();
    try {
      detail::check_ranks_agree(world, configs[r], corpora[r]);
    } catch (const comm::CollectiveError& e) {
      messages[r] = e.what();
    }
  });
  for (int r = 1; r < n; ++r) EXPECT_EQ(messages[r], messages[0]) << "rank " << r;
  return messages[0];
}

TEST(ConfigAgreement, RanksWithTheSameFlagsPass) {
  const TrainConfig c = testing::tiny_run(3);
  EXPECT_EQ(disagreement({c, c, c}), "");
  EXPECT_EQ(disagreement({c}), "");
}

TEST(ConfigAgreement, ADifferentStepCountIsNamedWithTheRanksAndValues) {
  TrainConfig c = testing::tiny_run(30);
  TrainConfig d = c;
  d.steps = 40;
  EXPECT_THAT(disagreement({c, d, c}),
              HasSubstr("the ranks disagree on --steps: ranks 0 and 2 give 30, rank 1 gives 40"));
}

TEST(ConfigAgreement, EveryDisagreeingFlagIsNamed) {
  TrainConfig c = testing::tiny_run(3);
  TrainConfig d = c;
  d.optimizer.kind = parallel::OptimizerKind::Lamb;
  d.lr = 0.5;
  d.seed = 7;
  d.save_dir = "elsewhere";
  d.model.matmul = DType::BF16;  // --precision auto on a CPU with native bf16 among ones without
  d.optimizer.sharding = parallel::Sharding::Weights;
  const std::string m = disagreement({c, c, c, d});
  EXPECT_THAT(m, HasSubstr("--optimizer: ranks 0-2 give adamw, rank 3 gives lamb"));
  EXPECT_THAT(m, HasSubstr("--lr: ranks 0-2 give 0.01, rank 3 gives 0.5"));
  EXPECT_THAT(m, HasSubstr("--seed: ranks 0-2 give 1, rank 3 gives 7"));
  EXPECT_THAT(m, HasSubstr("--save: ranks 0-2 give none, rank 3 gives elsewhere"));
  EXPECT_THAT(m, HasSubstr("--precision: ranks 0-2 give fp32, rank 3 gives bf16"));
  EXPECT_THAT(m, HasSubstr("--shard: ranks 0-2 give moments, rank 3 gives weights"));
  EXPECT_THAT(m, Not(HasSubstr("--steps")));
}

TEST(ConfigAgreement, DifferentDataIsNamedByItsFingerprint) {
  const TrainConfig c = testing::tiny_run(3);
  const std::string m = disagreement({c, c}, {data::make_corpus(std::string(600, 'a'), "a"),
                                              data::make_corpus(std::string(600, 'b'), "a")});
  EXPECT_THAT(m, HasSubstr("the ranks disagree on --data: rank 0 gives 600 tokens, fingerprint"));
}

TEST(ConfigAgreement, PerHostSettingsMayDiffer) {
  TrainConfig c = testing::tiny_run(3);
  TrainConfig d = c;
  d.blas_threads = 4;
  d.progress = !c.progress;
  EXPECT_EQ(disagreement({c, d}), "");
}

}  // namespace
}  // namespace tandem::train
