// The schedules of one rank's DSL programs (the Megatron epilogue, the pipeline links, the
// optimizer): the autotuner's choice for this run's sizes when its cache has one (or, with --tune,
// tuned now), run at the chunk size its record gives, else the preference lists. Each choice is
// made on the communicator the program runs on (rank 0's record, on every rank), so all its ranks
// agree on the schedule and the chunk size. --grad-dtype auto and --tp-dtype auto are decided
// here, into the rank's config, from the same records. Internal to train/.
#pragma once

#include <string>
#include <vector>

#include "tandem/parallel/grid.h"
#include "tandem/parallel/model.h"
#include "tandem/parallel/program_runner.h"
#include "tandem/train/train_config.h"

namespace tandem::train::detail {

// The optimizer as it runs: its configuration with the gradients' dtype (TrainConfig::grad_dtype,
// decided), and its schedules.
struct OptimizerChoice {
  parallel::OptimizerConfig config;
  parallel::SchedulePreferences schedules;
};

class ScheduleChoice {
 public:
  // `config`: the rank's own, into which the dtypes' autos are decided.
  ScheduleChoice(TrainConfig& config, const parallel::Grid& grid, exec::RunnerKind executor)
      : cfg_(config), grid_(grid), executor_(executor) {}

  // The Megatron and pipeline programs' schedules for micro-batches of `rows` rows of seq_len / cp
  // tokens, and (tp > 1) what the tensor-parallel exchanges carry: --tp-dtype, or with auto in
  // bf16 precision bf16 where the autotuner's records (tuned now with --tune) time the epilogue
  // and the input-gradient sum together faster with it than with f32 on every tensor-parallel
  // group (comm::all_true over the world), else f32; the decision and its reason in
  // TrainConfig::tp_dtype; with --cp 2 or more, the context-parallel group and its exchanges'
  // schedules (kv_gather, kv_grad_reduce). A collective over the tensor-parallel group, this
  // rank's pipeline links and its cp group (and with --tp-dtype auto, the world).
  parallel::ProgramOptions model_programs(int rows);
  // The optimizer's schedules, in order of preference, on the data-parallel group; with dp > 1
  // among the schedules that keep the optimizer state sliced (ZeRO-1). LAMB runs one program per
  // tensor at many sizes and keeps the preference list. With --grad-dtype auto, the gradients'
  // dtype decided too (in TrainConfig::grad_dtype, with its reason): bf16 where the autotuner's
  // records (tuned now with --tune) time the program's winner with bf16 gradients faster than
  // with f32 ones on every data-parallel group (comm::all_true over the world), else f32. A
  // collective over the world.
  OptimizerChoice optimizer();
  // --shard weights: gather_weights' schedule and chunk size for a block of this rank's stage, on
  // the data-parallel group (empty without sharding). A collective over the group.
  parallel::SchedulePreferences gather_schedules();
  // Whether some schedule so far came from the autotuner (its cache, or tuned now).
  bool from_autotuner() const { return from_autotuner_; }

 private:
  TrainConfig& cfg_;
  const parallel::Grid& grid_;
  exec::RunnerKind executor_;
  bool from_autotuner_ = false;
};

}  // namespace tandem::train::detail
