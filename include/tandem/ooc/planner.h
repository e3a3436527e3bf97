// The planner: per unit (half block) keep, swap or recompute, minimising the performance model's
// step time under a fast-tier budget, and the single strategies it is compared with.
//
// Search: depth-first over the units' decisions and the prefetch distance, with two bounds
// that never cut off a better plan, so the result is optimal under the model:
//   - time: the compute of every unit plus the forward of each unit recomputed so far (each
//     recomputed unit runs its forward exactly once more; transfers can only add stalls);
//   - memory: the workspace, every kept unit's input and buffers and the last unit's buffers
//     are all live during the last unit's forward, and the peak can be no lower than that.
// The best single strategy that fits seeds the search. A tested property (tests/ooc) is that the
// result equals exhaustive enumeration on small chains. Past `max_evaluations` simulated plans
// (about ten seconds on a 20-block chain; the 8-block benchmark model needs under 70 000) the
// search stops and returns the best plan found, marked as not proven optimal.
// Steps whose micro-batches run one after another (forward k, backward k, forward k+1, ...)
// repeat the same pattern, so they are planned on the first micro-batch and the prediction is
// scaled by the number of micro-batches.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tandem/nn/activation_memory.h"
#include "tandem/ooc/model.h"
#include "tandem/ooc/plan.h"

namespace tandem::ooc {

struct Evaluated {
  Strategy strategy;
  Plan plan;
  Prediction prediction;
  bool fits = false;
};

struct PlannerResult {
  Evaluated best;
  bool optimal = true;    // the search finished (else: best found within max_evaluations)
  int64_t evaluated = 0;  // plans simulated
  std::vector<Evaluated> baselines;  // every single strategy, fitting or not
};

// The prediction of `plan` on `chain` (scaled as above when the step repeats).
Prediction predict(const nn::ChainLayout& chain, const Plan& plan, const Profile& profile,
                   bool timeline = false);

// Every single strategy (KARMA's boundary chosen by the model: the fastest that fits).
std::vector<Evaluated> evaluate_baselines(const nn::ChainLayout& chain, const Profile& profile,
                                          uint64_t budget);

// The fastest plan under `budget`. When none fits: UserError naming the budget, the smallest
// one that works and the plan that needs it.
PlannerResult plan_step(const nn::ChainLayout& chain, const Profile& profile, uint64_t budget,
                        int64_t max_evaluations = 200'000);

// The lowest peak of any plan: the same search minimising the peak, seeded with the baselines'
// (proven = the search finished within max_evaluations).
struct SmallestBudget {
  uint64_t bytes = 0;
  Plan plan;
  bool proven = false;
};
SmallestBudget smallest_budget(const nn::ChainLayout& chain, const Profile& profile,
                               int64_t max_evaluations = 50'000);

// Exhaustive enumeration of every valid plan with prefetch 0..max_prefetch: for tests.
std::optional<Evaluated> plan_exhaustive(const nn::ChainLayout& chain, const Profile& profile,
                                         uint64_t budget);

inline constexpr int kMaxPrefetch = 3;

}  // namespace tandem::ooc
