// The out-of-core runtime: carries out a MemorySchedule for the model through the
// nn::ActivationMemory calls. Each buffer sits at its planned offset in the budgeted arena;
// swapped units are written out and read back on the transfer engine's two streams while the
// model computes; recomputed units are handed back to the model to run again. It measures what the
// planner needs (each operation's compute time, the time it waited, the arena's high-water mark).
//
// Set up, then run: set_schedule() places everything; the calls of a step allocate nothing.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "tandem/nn/activation_memory.h"
#include "tandem/ooc/arena.h"
#include "tandem/ooc/memory_schedule.h"
#include "tandem/ooc/profile.h"
#include "tandem/ooc/transfer_engine.h"

namespace tandem::ooc {

// What one step measured, per unit of the stage (means over its micro-batches).
struct StepMeasure {
  std::vector<double> forward_s, backward_s, recompute_s;  // recompute_s: 0 where none ran
  double step_s = 0;   // first operation's start to the last one's end
  double stall_s = 0;  // waiting for transfers
  uint64_t high_water = 0;
  // Into a profile (recompute times that were not measured are taken from the forwards).
  Profile profile(double write_bytes_per_s, double read_bytes_per_s) const;
  // The same from several steps: each time the median of the steps' (one step is noisy).
  static Profile median_profile(const std::vector<StepMeasure>& steps, double write_bytes_per_s,
                                double read_bytes_per_s);
};

class Runtime final : public nn::ActivationMemory {
 public:
  // config, B, T: the model's, for its workspace.
  Runtime(const nn::GPTConfig& config, int B, int T, uint64_t budget);
  ~Runtime() override;

  // Between steps. `transfers` moves the swapped units to and from `tier` (both may be null when
  // the plan swaps nothing); both must outlive this runtime, whose destructor waits for the
  // transfers. UserError if the schedule needs more than the budget.
  void set_schedule(const MemorySchedule& schedule, TransferEngine::Client* transfers,
                    SlowTier* tier);
  const MemorySchedule& schedule() const { return *schedule_; }
  Arena& arena() { return arena_; }
  // Before the first step: a smaller budget (part of it given to something else).
  void shrink_budget(uint64_t budget) { arena_.shrink(budget); }
  const StepMeasure& last_step() const { return last_; }

  void begin_forward(int k, int u) override;
  void end_forward(int k, int u) override;
  std::vector<int> begin_backward(int k, int u) override;
  void end_recompute(int k, int i) override;
  void end_backward(int k, int u) override;
  void begin_evaluation() override;
  void end_evaluation() override;
  float* input(int k, int u) override;
  nn::BlockActivations unit(int k, int u) override;
  nn::FinalActivations head(int k) override;
  nn::Workspace& workspace() override { return *workspace_; }

 private:
  using Clock = std::chrono::steady_clock;
  int expect(bool forward, int k, int u);
  void start_op(int i);
  void end_op(int i);
  uint64_t offset_of(int region) const;
  size_t micro(int k) const { return evaluating_ ? 0 : static_cast<size_t>(k); }

  nn::GPTConfig config_;
  int B_, T_;
  Arena arena_;
  std::unique_ptr<MemorySchedule> schedule_;
  TransferEngine::Client* transfers_ = nullptr;
  SlowTier* tier_ = nullptr;
  class RegionAllocator;
  std::unique_ptr<RegionAllocator> workspace_alloc_;  // declared first: outlives the workspace
  std::unique_ptr<nn::Workspace> workspace_;
  std::vector<std::vector<int>> starting_, ending_;  // regions by first and last operation
  std::vector<TransferEngine::Ticket> tickets_;      // by transfer
  // Where x_u and unit u's buffers are now, per micro-batch (arena offsets).
  std::vector<std::vector<uint64_t>> input_at_, buffers_at_;
  int cursor_ = 0;
  bool evaluating_ = false;
  Clock::time_point step_begin_, mark_;
  StepMeasure measuring_, last_;
  std::vector<int> counts_;  // operations measured per unit, for the means
};

}  // namespace tandem::ooc
