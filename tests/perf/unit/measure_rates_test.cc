// measure_rates on a tiny model (its GEMMs take microseconds; the ranks computing at once run
// 0.2 s a tp degree): the host's ranks and cores it records, and a core's rate, the ranks' summed
// rate over the cores they share, never below the slowest rank's; the cores' share of a measured
// link's seconds; the step's other work, positive and growing with the tokens a step.
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "tandem/perf/rates.h"
#include "tandem/perf/step_model.h"

namespace tandem::perf {
namespace measure_rates_test {

RateRequest tiny_request(int local_ranks) {
  RateRequest q;
  q.model.n_layers = 1;
  q.model.n_heads = 2;
  q.model.d_model = 32;
  q.model.seq_len = q.model.max_positions = 16;
  q.ranks = 4;
  q.local_ranks = local_ranks;
  q.threads = 1;
  q.link_gbps = 10;  // stated: nothing to measure
  q.tiers = false;
  return q;
}

TEST(MeasureRates, ACoresRateIsTheRanksSummedOverTheCoresTheyShare) {
  const Rates r = measure_rates(tiny_request(4));
  const double hw = std::max(1u, std::thread::hardware_concurrency());
  EXPECT_EQ(r.host_ranks, 4);
  EXPECT_EQ(r.host_slots, hw);
  ASSERT_EQ(r.gemm_flops_per_s.size(), 2u);  // tp 1 and 2 (2 heads)
  for (const auto& [tp, slowest] : r.gemm_flops_per_s) {
    SCOPED_TRACE(tp);
    ASSERT_TRUE(r.gemm_core_flops_per_s.count(tp));
    // 4 rates summed are at least 4 times the slowest, shared by at most 4 cores.
    EXPECT_GE(r.gemm_core_flops_per_s.at(tp), slowest);
    EXPECT_GT(r.gemm_alone_flops_per_s.at(tp), 0);
  }
}

// The link measured in-process is 4 threads copying and summing at once, each a share of the
// machine's hardware threads (a rank's BLAS thread's core): what a second of it takes from the
// cores. A stated link, another host's wire, takes none.
TEST(MeasureRates, AMeasuredLinksSecondsAreTheCoresWork) {
  const double hw = std::max(1u, std::thread::hardware_concurrency());
  EXPECT_EQ(measure_rates(tiny_request(4)).link_core_share, 0);
  RateRequest q = tiny_request(4);
  q.link_gbps.reset();
  const Rates r = measure_rates(q);
  EXPECT_GT(r.link_bytes_per_s, 0);
  EXPECT_DOUBLE_EQ(r.link_core_share, std::min(1.0, hw / 4));
}

// A rank alone on its host: a core's rate is its rate alone.
TEST(MeasureRates, ARankAloneComputesAtItsRateAlone) {
  const Rates r = measure_rates(tiny_request(1));
  EXPECT_EQ(r.host_ranks, 1);
  EXPECT_EQ(r.gemm_core_flops_per_s, r.gemm_alone_flops_per_s);
  EXPECT_EQ(r.gemm_flops_per_s, r.gemm_alone_flops_per_s);
}

// The embedding's forward and backward and the gradients' zeroing are measured; a step of 8
// rows a rank (measured at them) takes more of that work than one of 1 row (measured at it).
TEST(MeasureRates, TheStepsOtherWorkIsMeasuredAndGrowsWithTheTokens) {
  auto other_at = [](int64_t rows) {
    RateRequest q = tiny_request(1);
    q.ranks = 1;
    q.rank_rows = rows;
    const Rates r = measure_rates(q);
    EXPECT_GT(r.embedding_token_s, 0);
    EXPECT_GT(r.zero_floats_per_s, 0);
    EXPECT_NE(r.other_source.find("measured"), std::string::npos) << r.other_source;
    StepShape s;
    s.model = q.model;
    s.batch = rows;
    return stage_other_s(s, 0, r);
  };
  const double one = other_at(1), eight = other_at(8);
  EXPECT_GT(one, 0);
  EXPECT_GT(eight, one);
}

}  // namespace measure_rates_test
}  // namespace tandem::perf
