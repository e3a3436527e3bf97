// The final round's decisions on made-up timings: which candidates are timed again (within the
// margin of the best median, the fastest few, only ok ones, none when alone) and which one wins
// (the smallest final median among the retimed, whatever their first-pass order).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tandem/tune/tune.h"

namespace tandem::tune {
namespace {

CandidateTiming timed(std::string name, std::vector<double> times,
                      std::vector<double> final_times = {}) {
  CandidateTiming c;
  c.name = std::move(name);
  c.times = std::move(times);
  c.final_times = std::move(final_times);
  return c;
}

CandidateTiming failed(std::string name) {
  CandidateTiming c;
  c.name = std::move(name);
  c.ok = false;
  c.error = "results differ";
  return c;
}

TEST(TuneFinalRound, FinalistsAreWithinTheMarginOfTheBest) {
  const std::vector<CandidateTiming> cands = {
      timed("AR-C", {0.200}),  // 0: far behind
      timed("a", {0.110}),     // 1: +10%
      timed("b", {0.100}),     // 2: the best
      failed("wrong"),         // 3: never, however fast it might have been
      timed("c", {0.1149}),    // 4: +14.9%
      timed("d", {0.1151}),    // 5: +15.1%
  };
  EXPECT_EQ(finalists(cands, 0.15, 4), (std::vector<size_t>{1, 2, 4}));
  EXPECT_EQ(finalists(cands, 0.20, 4), (std::vector<size_t>{1, 2, 4, 5}));
  EXPECT_EQ(finalists(cands, 1.00, 10), (std::vector<size_t>{0, 1, 2, 4, 5}));
  EXPECT_EQ(finalists(cands, 0.05, 4), std::vector<size_t>{});  // the best alone: no final round
}

TEST(TuneFinalRound, TheCapKeepsTheFastest) {
  const std::vector<CandidateTiming> cands = {
      timed("a", {0.104}), timed("b", {0.101}), timed("c", {0.100}),
      timed("d", {0.103}), timed("e", {0.102}),
  };
  // In enumeration order, but the fastest `max` of them.
  EXPECT_EQ(finalists(cands, 0.15, 4), (std::vector<size_t>{1, 2, 3, 4}));
  EXPECT_EQ(finalists(cands, 0.15, 2), (std::vector<size_t>{1, 2}));
  EXPECT_EQ(finalists(cands, 0.15, 1), std::vector<size_t>{});  // one finalist is no round
  EXPECT_EQ(finalists(cands, 0.15, 0), std::vector<size_t>{});
}

TEST(TuneFinalRound, NothingOkNothingTimedAgain) {
  EXPECT_TRUE(finalists({failed("x"), failed("y")}, 0.15, 4).empty());
  EXPECT_TRUE(finalists({}, 0.15, 4).empty());
  EXPECT_EQ(choose_winner({failed("x"), failed("y")}), "");
}

TEST(TuneFinalRound, TheSmallestFinalMedianWinsEvenIfItsFirstPassWasNotTheBest) {
  const std::vector<CandidateTiming> cands = {
      timed("AR-C", {0.200}),
      timed("lucky", {0.100}, {0.120, 0.118, 0.125, 0.119}),   // best first pass, slower in turns
      timed("steady", {0.105}, {0.101, 0.140, 0.102, 0.103}),  // one slow outlier, the best median
      timed("other", {0.108}, {0.110, 0.111, 0.109, 0.112}),
  };
  EXPECT_EQ(choose_winner(cands), "steady");
}

TEST(TuneFinalRound, WithoutAFinalRoundTheSmallestMedianWins) {
  const std::vector<CandidateTiming> cands = {
      timed("AR-C", {0.2, 0.3, 0.1}), failed("fast-but-wrong"), timed("fused", {0.12, 0.11, 0.5})};
  EXPECT_EQ(choose_winner(cands), "fused");
  // Ties go to the earlier candidate.
  EXPECT_EQ(choose_winner({timed("first", {0.1}), timed("second", {0.1})}), "first");
}

// Once any candidate was retimed, only retimed ones can win: a first-pass time is not compared
// with interleaved ones.
TEST(TuneFinalRound, OnlyRetimedCandidatesWinAfterAFinalRound) {
  const std::vector<CandidateTiming> cands = {timed("AR-C", {0.050}), timed("a", {0.100}, {0.110}),
                                              timed("b", {0.101}, {0.105})};
  EXPECT_EQ(choose_winner(cands), "b");
}

}  // namespace
}  // namespace tandem::tune
