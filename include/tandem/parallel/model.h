// The GPT-2 model as one rank of a dp x tp x pp grid runs it: this rank's shard of the
// parameters and gradients (one flat buffer each, ShardLayout order), the saved activations of
// the micro-batches in flight, and the forward and backward passes of a step's micro-batches in
// 1F1B order, with the communication points run as DSL programs:
//   - a row-parallel projection's epilogue (tp > 1): dsl::workloads::megatron_layer on tp();
//   - the hand-off at a pipeline boundary (pp > 1): the last block's MLP epilogue is
//     dsl::workloads::pipeline_stage on the link to the next stage, which computes the block's
//     output on this stage's tp group and sends it to the next stage, whose ranks receive it as
//     the same program's group 1;
//   - the gradient going back over a pipeline boundary: dsl::workloads::grad_handoff, the
//     sender's run leaving its send in flight (Runner::run_leaving_sends) so that 1F1B goes on,
//     the receiver's landing in its dres workspace in place;
//   - the backward's sums of input gradients over tp() and of the tied embedding's gradient over
//     tied(): dsl::workloads::sum_in_place, in the gradient's own buffer.
// The data-parallel reduction is the optimizer's program (parallel/optimizer.h), run bucket by
// bucket as the backward finishes them (gradients_ready) or after forward_backward.
//
// Blocks run by halves (attention, then MLP: the units an out-of-core memory places). With
// tp == 1 the halves inside a stage are nn's own (no program runs; a single-rank run is exactly
// nn::gpt_forward/gpt_backward); the row-parallel shard path
// (tensor_parallel.h) runs where tp > 1 and in a stage's last block at a pipeline boundary.
//
// Set up, then run: the constructor allocates the parameters, gradients, the send buffers and,
// unless an nn::ActivationMemory is given (the out-of-core runtime), the activations of
// min(M, P - stage) micro-batches and the workspace, and enumerates the programs' schedules;
// forward_backward allocates only what the reference interpreter does.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/core/tensor.h"
#include "tandem/nn/activation_memory.h"
#include "tandem/nn/gpt.h"
#include "tandem/parallel/context_parallel.h"
#include "tandem/parallel/grid.h"
#include "tandem/parallel/model_state.h"
#include "tandem/parallel/program_runner.h"
#include "tandem/parallel/shard.h"
#include "tandem/parallel/tensor_parallel.h"

namespace tandem::parallel {

// One micro-batch of this data-parallel rank.
struct MicroBatch {
  const int32_t* tokens = nullptr;   // (B, T), read on the first stage
  const int32_t* targets = nullptr;  // (B, T), read on the last stage
  int B = 0;
  int T = 0;
  int64_t sample_offset = 0;  // the index of its first row in the global batch
};

// The kinds of work a step reports: the run's phase times add each kind up (a recomputation,
// which runs inside the backward, counts as Backward). The embedding's forward and backward are
// a kind of their own: the step's other work, as the performance model counts it
// (perf::stage_other_s), not the blocks' compute.
enum class Phase { Forward, Backward, Embedding, Comm };

// The model reports each piece of work: its kind, a name, when it ran, and its own seconds (a
// compute span excludes the communication programs run inside it, such as a block's Megatron
// epilogues, which are reported as Comm spans of their own).
using EventSink = std::function<void(Phase phase, std::string_view name,
                                     std::chrono::steady_clock::time_point begin,
                                     std::chrono::steady_clock::time_point end, double self_s)>;

// The schedules the model's programs run with (preference order; see program_runner.h): the
// Megatron epilogue's and the pipeline hand-off's.
std::vector<std::string> epilogue_schedule_preferences();
std::vector<std::string> pipeline_schedule_preferences();

// How the model's programs run: schedule preferences (first found wins; e.g. the autotuner's
// winner first, with its chunk size) and the executor.
struct ProgramOptions {
  SchedulePreferences epilogue_schedules{epilogue_schedule_preferences()};
  // The two ends of a link must run one schedule (and chunk size): the link to the next stage's,
  // and the link from the previous stage's.
  SchedulePreferences pipeline_schedules{pipeline_schedule_preferences()};
  SchedulePreferences pipeline_recv_schedules{pipeline_schedule_preferences()};
  // The tensor-parallel backward's sum of input gradients (sum_in_place on tp()), and the tied
  // embedding's gradient sum (sum_in_place on tied()).
  SchedulePreferences tp_sum_schedules{{"AR-C"}};
  SchedulePreferences tied_sum_schedules{{"AR-C"}};
  exec::RunnerKind executor = exec::runner_kind_from_env();
  // What the tensor-parallel exchanges carry (tp > 1; `tandem train --tp-dtype`): f32, or bf16
  // with bf16 matmuls: the epilogue's operands, product and all-reduce (the pipeline program's
  // too, whose hand-off stays f32: megatron_layer(f32, p, bf16)) and the backward's input-gradient
  // sum (sum_in_place(bf16)). The tied embedding's sum stays f32.
  DType tp_dtype = DType::F32;
  // Context parallelism: the group each sequence is split over (context_parallel.h; the model's
  // T is then this rank's T / cp tokens of each row, ContextSplit's), and its exchanges'
  // schedules. Null or one rank: whole sequences.
  comm::Communicator* context_group = nullptr;
  ContextSchedules context_schedules;
};

class ParallelGPT {
 public:
  // micro_rows: rows of each micro-batch; micro_batches: how many per step (each stage keeps
  // activations for min(micro_batches, pp - stage) of them).
  // memory: where the saved activations live (not owned; it must outlive the model); null: all
  // resident, allocated here (in-core training).
  // state: this rank's model state (model_state.h; not owned, it must outlive the model, and its
  // layout must be this rank's), whose blocks may live in a store (--model-state) or be sharded
  // over the data-parallel ranks (--shard weights), placed when the optimizer places the moments,
  // before the first step; null: in memory, owned here.
  ParallelGPT(const nn::GPTConfig& config, Grid& grid, int micro_rows, int T, int micro_batches,
              const ProgramOptions& programs = {}, nn::ActivationMemory* memory = nullptr,
              ModelState* state = nullptr);
  ~ParallelGPT();
  ParallelGPT(const ParallelGPT&) = delete;
  ParallelGPT& operator=(const ParallelGPT&) = delete;

  // What this rank's step saves, for an out-of-core memory to place: its stage's blocks (their
  // tensor-parallel shards), the head on the last stage, and the 1F1B order of its passes.
  static nn::ChainLayout chain_layout(const nn::GPTConfig& config, const Grid& grid, int micro_rows,
                                      int T, int micro_batches);
  // The same for the rank at `coord` of a grid of `shape`, without its communicators (estimates
  // made before any rank starts).
  static nn::ChainLayout chain_layout(const nn::GPTConfig& config, const GridShape& shape,
                                      const GridCoord& coord, int micro_rows, int T,
                                      int micro_batches);

  const nn::GPTConfig& config() const { return config_; }
  const ShardLayout& layout() const { return layout_; }
  // This rank's context-parallel attention (null without a context group).
  const ContextParallelAttention* context() const { return context_.get(); }
  Grid& grid() const { return grid_; }
  ModelState& state() const { return state_; }
  Tensor params() const { return state_.params(); }  // (layout().size())
  Tensor grads() const { return state_.grads(); }    // (layout().size())
  // Zeroes the gradients before a step (the store's blocks' are zeroed when first written).
  void zero_gradients() { state_.zero_gradients(); }

  // Forward and backward of every micro-batch, in 1F1B order on this stage:
  // grads += d(mean over the micro-batches of each one's mean token loss). Returns the sum of
  // the micro-batches' mean losses on the last stage (0 on others). Gradients of the tied
  // embedding are per copy until reduce_tied_gradients().
  double forward_backward(const std::vector<MicroBatch>& micro, uint64_t seed, uint64_t step);
  // Forward only, without dropout; same return value.
  double forward(const std::vector<MicroBatch>& micro);
  // pp > 1: sums the first and the last stage's wte gradients (the tied embedding), so both
  // copies take the same optimizer step (the DSL program sum_in_place, bound to the gradient).
  // A no-op otherwise.
  void reduce_tied_gradients();

  void set_event_sink(EventSink sink) { sink_ = std::move(sink); }
  // Called by forward_backward, on its thread, as soon as block `layer`'s gradients are final for
  // the step (its attention half's backward of the step's last micro-batch is done), in backward
  // order: the data-parallel exchange of those gradients may start then. Block `layer`'s weights
  // are not read again in this forward_backward (recomputation and the backward of the blocks
  // still to come read only earlier blocks' weights), so the exchange may also update them.
  using GradientsReady = std::function<void(int layer)>;
  void set_gradients_ready(GradientsReady ready) { gradients_ready_ = std::move(ready); }
  // The schedules of the programs this rank runs ("" when it runs none of that kind).
  std::string epilogue_schedule() const;
  std::string pipeline_schedule() const;
  // Their programs' names (megatron_layer, or Llama's megatron_layer_no_bias; pipeline_stage ...).
  std::string epilogue_program() const;
  std::string pipeline_program() const;
  std::string tp_sum_schedule() const;          // "" when tp == 1
  DType tp_dtype() const { return tp_dtype_; }  // what the tensor-parallel exchanges carry
  std::string executor() const;  // the executor the programs run on ("" when none runs)

 private:
  class Resident;
  struct Programs;
  void forward_micro(const MicroBatch& mb, int k, const nn::StepRng& rng, bool training,
                     double& loss_sum);
  void backward_micro(const MicroBatch& mb, int k, const nn::StepRng& rng, float dloss);
  // Unit u of this stage (half u % 2 of its block u / 2; see nn/activation_memory.h) for
  // micro-batch k, on the memory's current buffers.
  struct UnitArgs {
    int layer;
    nn::BlockHalf half;
    nn::BlockActivations acts;
    const float* x;  // the unit's input
    nn::BlockParams w;
  };
  UnitArgs unit_args(int k, int u);
  void unit_forward(int k, int u, const nn::StepRng& rng, bool training);
  void unit_backward(int k, int u, const nn::StepRng& rng, float* dres);
  int units() const { return nn::kBlockHalves * (layout_.end_layer() - layout_.first_layer()); }
  std::string unit_name(int u) const;  // "h.3.attn", for the trace
  bool shard_path(int layer) const;    // whether block `layer` runs the tensor-parallel shard path
  const LocalTensor& tied_embedding() const;  // this stage's wte (pp > 1, first or last stage)
  void run_epilogue(const EpilogueArgs& e, bool training, bool boundary);
  void receive_activations(const nn::StepRng& rng, bool training, float* into, int B, int T);
  void emit(Phase phase, std::string_view name, std::chrono::steady_clock::time_point begin);
  void check_micro(const std::vector<MicroBatch>& micro) const;

  // Block `layer`'s weights for compute, wherever the model state keeps them (the flat buffer, the
  // store, or gathered from the data-parallel ranks' slices), held until done_with_weights.
  nn::BlockParams weights_of(int layer);
  void done_with_weights(int layer);

  nn::GPTConfig config_;
  Grid& grid_;
  // Context parallelism (ProgramOptions::context_group): this rank's attention over the group, and
  // the rotary table of the whole sequence's positions (Llama).
  std::unique_ptr<ContextParallelAttention> context_;
  nn::RopeTable context_rope_;
  std::unique_ptr<ModelState> own_state_;  // when none was given
  ModelState& state_;
  const ShardLayout& layout_;  // state_'s
  int micro_rows_, T_, micro_batches_;
  DType tp_dtype_ = DType::F32;         // ProgramOptions::tp_dtype where tp > 1, else f32
  std::unique_ptr<Resident> resident_;  // the in-core memory, when none was given
  nn::ActivationMemory* memory_;
  std::vector<Tensor> grad_send_;  // one (B, T, C) buffer per micro-batch (stages > 0)
  std::unique_ptr<Programs> programs_;
  EventSink sink_;
  GradientsReady gradients_ready_;
  int last_backward_micro_ = -1;  // the micro-batch whose backward comes last in this step
  double nested_comm_s_ = 0.0;    // comm seconds inside the compute span being timed
};

}  // namespace tandem::parallel
