// The data-parallel optimizer step as a DSL program: each rank's gradient summed over the
// data-parallel group and averaged, then AdamW (dsl::workloads::adam) or LAMB
// (dsl::workloads::lamb) applied to this rank's parameter shard, all in one program run with its
// chosen schedule (ProgramRunner). The preferred schedule, "RS-C-AG+slice(m,v)", is ZeRO-1:
// ReduceScatter of the gradient, the update computed on this rank's 1/dp of the elements,
// AllGather of the new weights, and the moments m and v stored sliced, each rank keeping only
// its 1/dp of them.
//
// AdamW runs one program over the whole flat shard (weight decay applies to every tensor, biases
// and LayerNorms included, as the program states it). LAMB's trust ratio is per tensor, so LAMB
// runs the program once per local tensor; under tensor parallelism a sharded tensor's ratio is
// that of this rank's shard (the program's norms reduce over the data-parallel group only), so
// LAMB equals single-rank LAMB only at tp = 1.
//
// State layout: the optimizer works on segments of the local flat buffer (AdamW: one, the whole
// buffer; LAMB: one per tensor), each a program session set up once on the data-parallel group;
// the moments live in the sessions' own input storage between steps. For each segment this rank
// keeps the moments of its part (comm::Partition of the segment over the dp ranks) when the
// schedule slices the state, or of the whole segment when it does not: pieces() says which
// local elements each piece's m and v hold.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tandem/comm/communicator.h"
#include "tandem/core/tensor.h"
#include "tandem/parallel/program_runner.h"
#include "tandem/parallel/shard.h"

namespace tandem::train {

struct OptimizerConfig {
  std::string name = "adamw";  // "adamw" or "lamb"
  // The gradients' dtype in the program: "f32", or "bf16" (mixed precision: gradients rounded to
  // bf16 and summed in bf16 on the wire, half the bytes; weights and moments stay f32).
  std::string grad_dtype = "f32";
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;

  // UserError naming the bad field.
  void validate() const;
  nlohmann::json to_json() const;  // {"beta1": 0.9, ...} (the name is RunMeta::optimizer)
};

// The optimizer's program: dsl::workloads::adam or lamb, with the configured gradient dtype.
dsl::Program optimizer_program(const OptimizerConfig& config);

// The schedules the optimizer program prefers, best first.
std::vector<std::string> optimizer_schedule_preferences();

class DataParallelOptimizer {
 public:
  // Local elements [begin, end) whose moments this rank keeps in m and v (end - begin each).
  struct Piece {
    int64_t begin = 0;
    int64_t end = 0;
    Tensor m, v;
  };

  // `schedules`: preferences, first found wins (default optimizer_schedule_preferences()).
  DataParallelOptimizer(const OptimizerConfig& config, const parallel::ShardLayout& layout,
                        comm::Communicator& dp, const std::vector<std::string>& schedules = {},
                        parallel::ExecutorKind executor = parallel::executor_from_env());

  // params -= the update for the dp-averaged `grads` (both local flat buffers of
  // layout.size()); `step` counts optimizer steps from 1 (Adam's bias correction). A collective
  // over the data-parallel group; params end bitwise equal on every dp rank.
  void step(const Tensor& params, const Tensor& grads, double lr, int64_t step);

  const OptimizerConfig& config() const { return config_; }
  const std::vector<Piece>& pieces() const { return pieces_; }
  bool state_sliced() const { return sliced_; }
  std::string schedule_name() const { return runner_->schedule_name(); }
  std::string executor_name() const { return runner_->executor_name(); }

 private:
  struct Segment {
    int64_t begin, end;
    std::unique_ptr<parallel::ProgramSession> session;
  };
  OptimizerConfig config_;
  comm::Communicator& dp_;
  std::unique_ptr<parallel::ProgramRunner> runner_;
  bool sliced_ = false;
  std::vector<Segment> segments_;
  std::vector<Piece> pieces_;
};

}  // namespace tandem::train
