// The schedules of one rank's DSL programs (the Megatron epilogue, the pipeline links, the
// optimizer): the autotuner's choice for this run's sizes when its cache has one (or, with --tune,
// tuned now), run at the chunk size its record gives, else the preference lists. Each choice is
// made on the communicator the program runs on (rank 0's record, on every rank), so all its ranks
// agree on the schedule and the chunk size. --grad-dtype auto and --tp-dtype auto are decided from
// the same records, with the same keys, by train::resolve before the ranks set up
// (decide_dtypes); the set-up reads the decided values. Internal to train/.
#pragma once

#include <string>
#include <vector>

#include "tandem/comm/communicator.h"
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

// Whether `config` has a dtype auto that applies and is not decided: --tp-dtype auto with tp > 1
// (with tp 1 nothing carries it), --grad-dtype auto.
bool dtypes_to_decide(const TrainConfig& config);

// --tp-dtype auto and --grad-dtype auto decided into `config`, with their reasons, from the
// autotuner's records (tuned now with --tune) that the set-up's choices below read, on the
// communicators they run on: `world`'s Grid of config.grid (world.size() == config.grid.size()).
// --tp-dtype: with bf16 precision, bf16 where the records time the epilogue and the input-gradient
// sum together faster with it than with f32 on every tensor-parallel group, else f32 (always f32
// in fp32 precision). --grad-dtype: bf16 where the records time the optimizer program's winner
// with bf16 gradients faster than with f32 ones on every data-parallel group, else f32 (LAMB:
// f32). Each group's rank 0 reads its group's records (a group's sizes, node span and host are
// its own) and the world agrees through comm::all_true. A collective over `world` when
// dtypes_to_decide(config), else nothing.
void decide_dtypes(comm::Communicator& world, TrainConfig& config);

class ScheduleChoice {
 public:
  // `config`: its dtypes given or decided (decide_dtypes).
  ScheduleChoice(const TrainConfig& config, const parallel::Grid& grid, exec::RunnerKind executor)
      : cfg_(config), grid_(grid), executor_(executor) {}

  // The Megatron and pipeline programs' schedules for micro-batches of `rows` rows of seq_len / cp
  // tokens, with (tp > 1) the tensor-parallel exchanges in TrainConfig::tp_dtype; with --cp 2 or
  // more, the context-parallel group and its exchanges' schedules (kv_gather, kv_grad_reduce). A
  // collective over the tensor-parallel group, this rank's pipeline links and its cp group.
  parallel::ProgramOptions model_programs(int rows);
  // The optimizer's schedules, in order of preference, on the data-parallel group; with dp > 1
  // among the schedules that keep the optimizer state sliced (ZeRO-1); its gradients in
  // TrainConfig::grad_dtype. LAMB runs one program per tensor at many sizes and keeps the
  // preference list. A collective over the data-parallel group.
  OptimizerChoice optimizer();
  // --shard weights: gather_weights' schedule and chunk size for a block of this rank's stage, on
  // the data-parallel group (empty without sharding). A collective over the group.
  parallel::SchedulePreferences gather_schedules();
  // Whether some schedule so far came from the autotuner (its cache, or tuned now).
  bool from_autotuner() const { return from_autotuner_; }

 private:
  const TrainConfig& cfg_;
  const parallel::Grid& grid_;
  exec::RunnerKind executor_;
  bool from_autotuner_ = false;
};

}  // namespace tandem::train::detail
