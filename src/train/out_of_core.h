// Out-of-core training on one rank: the runtime the model's saved activations live in (a fast
// arena of exactly --memory-budget bytes), the slow tier swapped units go to (moved by the
// tier's transfer engine), the profile the planner works from (cached on disk, else measured by
// running the step) and the plan.
#pragma once

#include <chrono>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/io/trace.h"
#include "tandem/ooc/planner.h"
#include "tandem/ooc/runtime.h"
#include "tandem/ooc/slow_tier.h"
#include "tandem/ooc/transfer_engine.h"
#include "tandem/parallel/grid.h"
#include "tandem/train/train_config.h"

namespace tandem::train::detail {

class OutOfCore {
 public:
  // Reserves the arena and plans a first step from sizes alone, so a budget no plan fits is
  // refused before anything runs (UserError naming the smallest budget that works). The swaps go
  // through `engines`' engine of --slow-tier, which must outlive this.
  OutOfCore(const TrainConfig& cfg, const parallel::Grid& grid, int micro_rows, int micro_batches,
            ooc::TransferEngines& engines);
  ~OutOfCore();

  nn::ActivationMemory* memory() { return runtime_.get(); }

  // The profile from the cache, else measured by perf::measure_activation_profile: `step` (one
  // forward and backward of the model) runs once to warm up, then perf::kProfileSteps times
  // (once when the warm-up took over perf::kLongStepS), each time the median of the measured
  // steps; `log` (may be null) gets a line of progress. Then the plan:
  // the planner's, or --ooc-plan's. Every rank of a tensor-parallel group must recompute the
  // same units (their recomputation runs collectives), so the group agrees on the profile first
  // (the slowest rank's times). Collective over the world, whose ranks all measure when any
  // lacks its cached profile.
  void prepare(const std::function<void()>& step, comm::Communicator& world, comm::Communicator& tp,
               std::ostream* log);

  // Part of the budget held by something else (the model state's slots, `what`): the
  // activations get the rest, planned again (from the profile once prepared, else from sizes).
  // UserError when the rest holds no plan, naming both parts and the smallest budget that works.
  // Called again, the part may only grow.
  void reserve(uint64_t bytes, const std::string& what);
  // The predicted forward+backward were `bytes` of the budget reserved instead (+infinity when
  // no plan fits the rest): for the trainer choosing what else the budget holds.
  double predicted_step_s_reserving(uint64_t bytes);

  // After each training step: its measurements, and the transfers for the trace.
  void after_step(io::TraceRecorder* trace, int rank);

  const ooc::PlannerResult& planned() const { return planned_; }
  const ooc::Plan& plan() const { return runtime_->schedule().plan(); }
  bool profile_from_cache() const { return from_cache_; }
  uint64_t high_water() const { return high_water_; }  // the most of any step so far
  double measured_step_s() const;                      // median forward+backward
  double predicted_step_s() const { return predicted_.step_s; }
  // Bytes the plan writes to its slow tier a step (and reads back).
  uint64_t predicted_swapped_bytes() const { return predicted_.swapped_bytes; }
  uint64_t predicted_peak() const { return predicted_.peak_bytes; }
  uint64_t budget() const { return budget_; }

  // One line at start: the plan in brief, its prediction, the baselines'.
  std::string plan_line() const;
  // One line at the end: high-water mark, measured against predicted.
  std::string summary_line() const;
  // `tandem plan`: per unit the decision, sizes and times; the plan and every baseline.
  std::string report() const;
  // The predicted timeline of a step as a Chrome trace.
  std::string predicted_trace() const;

 private:
  void use(const ooc::Plan& plan);  // sets the runtime's schedule (and opens the tier it needs)
  std::string budget_note() const;  // "" or " for the activations (--memory-budget ... less ...)"
  const ooc::SmallestBudget& smallest();  // of the activations (sizes alone decide it)

  const TrainConfig& cfg_;
  nn::ChainLayout chain_;
  uint64_t budget_;        // from --memory-budget: bytes, or a share of the in-core need
  uint64_t reserved_ = 0;  // of budget_, held by something else (reserve)
  std::string reserved_for_;
  // The first reservation: what the run cannot do without (later ones add what the budget had
  // room for).
  uint64_t least_reserved_ = 0;
  std::string least_reserved_for_;
  ooc::TierSpec tier_spec_;
  ooc::TransferEngines& engines_;
  std::unique_ptr<ooc::Runtime> runtime_;
  std::unique_ptr<ooc::SlowTier> tier_;
  std::unique_ptr<ooc::TransferEngine::Client> transfers_;  // the swaps, once a plan swaps
  ooc::Profile profile_;
  bool prepared_ = false;  // profile_ is measured (or cached), not placeholders
  std::optional<ooc::SmallestBudget> smallest_;
  ooc::PlannerResult planned_;
  ooc::Prediction predicted_;
  bool from_cache_ = false;
  bool forced_ = false;
  uint64_t high_water_ = 0;
  std::vector<double> step_s_;
  std::string key_;      // what the profile depends on, as JSON
  bool writer_ = false;  // this rank writes the cached profile (one per stage)
};

}  // namespace tandem::train::detail
