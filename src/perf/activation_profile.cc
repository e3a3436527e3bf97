// Measuring the out-of-core activation profile: a warm-up step, then the agreed passes' median.
#include "tandem/perf/activation_profile.h"

#include <fmt/format.h>

#include <ostream>
#include <vector>

#include "tandem/core/clock.h"
#include "tandem/core/error.h"
#include "tandem/perf/tier_bandwidth.h"

namespace tandem::perf {

ooc::Profile measure_activation_profile(const std::function<void()>& step,
                                        const std::function<ooc::StepMeasure()>& last_measure,
                                        const ooc::TierSpec& tier, const AgreePasses& agree_passes,
                                        std::ostream* log, double long_step_s) {
  const ooc::TierBandwidth bw = measure_tier(tier);
  if (log != nullptr)
    *log << "  out-of-core: measuring this machine's profile (cached for later runs): warm-up"
         << std::flush;
  const auto t0 = Clock::now();
  step();  // the first step touches the arena's pages and compiles the programs
  const double warm_s = seconds_since(t0);
  if (log != nullptr) *log << fmt::format(" {:.1f} s", warm_s) << std::flush;
  const int passes = agree_passes(warm_s > long_step_s ? 1 : kProfileSteps);
  TANDEM_CHECK(passes >= 1, "measure_activation_profile: {} passes agreed", passes);
  std::vector<ooc::StepMeasure> steps;
  for (int i = 0; i < passes; ++i) {
    step();
    steps.push_back(last_measure());
    if (log != nullptr)
      *log << fmt::format(", pass {}/{} {:.1f} s", i + 1, passes, steps.back().step_s)
           << std::flush;
  }
  if (log != nullptr) *log << "\n";
  return ooc::StepMeasure::median_profile(steps, bw.write_bytes_per_s, bw.read_bytes_per_s);
}

}  // namespace tandem::perf
