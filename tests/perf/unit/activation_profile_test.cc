// measure_activation_profile with a fake step whose runtime measures are stated: the warm-up is
// not measured, the passes are the ones the ranks agree on (three, one after a long warm-up), the
// profile is their median at the tier's bandwidth, and the progress line says what ran.
#include "tandem/perf/activation_profile.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

namespace tandem::perf {
namespace {

const ooc::TierSpec kHost = ooc::TierSpec::parse("host");

// Step k (0: the warm-up) takes no time; its measure is measures[k].
struct FakeStep {
  std::vector<ooc::StepMeasure> measures;
  int ran = 0;
  std::function<void()> step() {
    return [this] { ++ran; };
  }
  std::function<ooc::StepMeasure()> last() {
    return [this] { return measures.at(static_cast<size_t>(ran - 1)); };
  }
};

ooc::StepMeasure measure(double forward, double backward, double step_s) {
  ooc::StepMeasure m;
  m.forward_s = {forward, 2 * forward};
  m.backward_s = {backward, 2 * backward};
  m.recompute_s = {0, 0};  // not recomputed: the forward's time
  m.step_s = step_s;
  return m;
}

// The warm-up's measure is never read: it is far off the others.
FakeStep three_passes() {
  return {{measure(100, 100, 100), measure(3, 10, 1.5), measure(1, 30, 0.5), measure(2, 20, 1.0)}};
}

TEST(ActivationProfile, TheMedianOfThreePassesAfterAWarmUp) {
  FakeStep f = three_passes();
  int wanted = 0;
  std::ostringstream log;
  const ooc::Profile p = measure_activation_profile(
      f.step(), f.last(), kHost, [&](int w) { return wanted = w; }, &log);
  EXPECT_EQ(wanted, kProfileSteps);
  EXPECT_EQ(f.ran, 4);
  EXPECT_EQ(p.forward_s, (std::vector<double>{2, 4}));
  EXPECT_EQ(p.backward_s, (std::vector<double>{20, 40}));
  EXPECT_EQ(p.recompute_s, p.forward_s);
  EXPECT_GT(p.write_bytes_per_s, 0);
  EXPECT_GT(p.read_bytes_per_s, 0);
  EXPECT_EQ(log.str(),
            "  out-of-core: measuring this machine's profile (cached for later runs): warm-up 0.0 "
            "s, pass 1/3 1.5 s, pass 2/3 0.5 s, pass 3/3 1.0 s\n");
}

// A warm-up over the long step's time (here any) asks for one pass.
TEST(ActivationProfile, OnePassAfterALongWarmUp) {
  FakeStep f = three_passes();
  int wanted = 0;
  std::ostringstream log;
  const ooc::Profile p = measure_activation_profile(
      f.step(), f.last(), kHost, [&](int w) { return wanted = w; }, &log, /*long_step_s=*/-1);
  EXPECT_EQ(wanted, 1);
  EXPECT_EQ(f.ran, 2);
  EXPECT_EQ(p.forward_s, (std::vector<double>{3, 6}));
  EXPECT_EQ(p.backward_s, (std::vector<double>{10, 20}));
  EXPECT_NE(log.str().find(", pass 1/1 1.5 s\n"), std::string::npos) << log.str();
}

// The ranks' agreement decides: another rank's long warm-up leaves one pass here too.
TEST(ActivationProfile, ThePassesAreTheAgreedOnes) {
  FakeStep f = three_passes();
  const ooc::Profile p = measure_activation_profile(
      f.step(), f.last(), kHost, [](int) { return 1; }, nullptr);
  EXPECT_EQ(f.ran, 2);
  EXPECT_EQ(p.forward_s, (std::vector<double>{3, 6}));
}

}  // namespace
}  // namespace tandem::perf
