// The out-of-core activation profile of one stage's step (ooc/profile.h), measured by running the
// step: the one place its unit times are timed. The cache and the ranks' agreements stay with
// the trainer (train/out_of_core.cc), which passes the world's agreement on the passes in.
#pragma once

#include <functional>
#include <iosfwd>

#include "tandem/ooc/profile.h"
#include "tandem/ooc/runtime.h"
#include "tandem/ooc/slow_tier.h"

namespace tandem::perf {

// Steps measured after the one that warms up; their median is the profile.
inline constexpr int kProfileSteps = 3;
// A warm-up slower than this is followed by one measured step, not kProfileSteps: on a model that
// big the spread of a step is small next to the minutes more would cost.
inline constexpr double kLongStepS = 60.0;

// The passes to run given this rank's wish (kProfileSteps, or 1 after a long warm-up): every
// rank's steps run collectives, so all must run as many (the trainer's world minimum).
using AgreePasses = std::function<int(int wanted)>;

// `tier`'s bandwidth (measure_tier), then `step` (one forward and backward of the stage) once to
// warm up (it touches the arena's pages and compiles the programs), then the agreed passes, each
// followed by `last_measure` (the runtime's measurement of the step that just ran); the profile
// is their median (ooc::StepMeasure::median_profile) at the tier's bandwidth. `log` (may be null)
// gets one line: "  out-of-core: measuring this machine's profile (cached for later runs):
// warm-up 1.2 s, pass 1/3 0.9 s, ...". `long_step_s` is kLongStepS but in tests.
ooc::Profile measure_activation_profile(const std::function<void()>& step,
                                        const std::function<ooc::StepMeasure()>& last_measure,
                                        const ooc::TierSpec& tier, const AgreePasses& agree_passes,
                                        std::ostream* log, double long_step_s = kLongStepS);

}  // namespace tandem::perf
