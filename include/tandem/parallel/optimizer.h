// The data-parallel optimizer: AdamW (dsl::workloads::adam) or LAMB (lamb_bucket) run as DSL
// programs on the data-parallel group over this rank's shard of the model, bucket by bucket
// (whole blocks, in backward order), each bucket launched on a communication thread as soon as
// the backward has finished its blocks. The default schedule is ZeRO-1 (the update inside the
// ReduceScatter, the moments sliced); the programs read the gradients and write the weights and
// moments where the rank's ModelState keeps them (model_state.h): the optimizer decides the
// pieces, the model state where they live. docs/training.md ("The data-parallel exchange during
// the backward", "Gradient clipping") says how and why.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/core/serial_worker.h"
#include "tandem/core/tensor.h"
#include "tandem/ooc/slow_tier.h"
#include "tandem/parallel/model_state.h"
#include "tandem/parallel/program_runner.h"
#include "tandem/parallel/shard.h"

namespace tandem::parallel {

enum class OptimizerKind { AdamW, Lamb };
// When a bucket's exchange runs: as soon as the backward is done with it, or after the backward.
enum class GradExchange { Overlap, After };
// What each data-parallel rank keeps 1/dp of: the optimizer's moments (ZeRO-1, the schedule's
// slice(m,v)), or the blocks' weights, gradients and moments too (ZeRO-3 / FSDP, slice(w,m,v):
// each block's weights gathered before its forward and its backward; model_state.h).
enum class Sharding { Moments, Weights };

// "adamw", "lamb"; "overlap", "after": the names the command line and checkpoints use.
std::string_view optimizer_name(OptimizerKind kind);
std::string_view grad_exchange_name(GradExchange exchange);
std::string_view sharding_name(Sharding sharding);  // "moments", "weights"

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::AdamW;
  // The gradients' dtype in the program: F32, or BF16 (mixed precision: gradients rounded to
  // bf16 and summed in bf16 on the wire, half the bytes; weights and moments stay f32).
  DType grad_dtype = DType::F32;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;
  // The data-parallel exchange, and the bucket size in MiB (unset: kDefaultBucketMiB, or the
  // whole model when smaller).
  GradExchange exchange = GradExchange::Overlap;
  std::optional<double> bucket_mb;
  // Where the moments live: in memory (unset), or in this slow tier.
  std::optional<ooc::TierSpec> state_tier;
  // Global gradient-norm clipping: the largest norm of the averaged gradient (unset: none).
  std::optional<double> clip_grad_norm;
  // What the data-parallel ranks shard (--shard).
  Sharding sharding = Sharding::Moments;

  // UserError naming the bad field's flag.
  void validate() const;
};

// The default bucket (AdamW's and LAMB's). bench/run_exchange.sh --buckets "1 16 64" found no
// difference beyond noise between 1 and 64 MiB on 2 cores (docs/benchmarks.md); 4 MiB makes a
// bucket about one block at d_model 512, so the first exchange starts early in the backward.
inline constexpr double kDefaultBucketMiB = 4.0;

// A segment of the optimizer's step: local elements [begin, end) of a rank's shard, launched once
// block `ready_layer`'s gradients are final (-1: after the backward).
struct SegmentBounds {
  std::string name;  // "h.7..h.4", "ln_f.weight..wte.weight"
  int64_t begin = 0, end = 0;
  int ready_layer = -1;
};
// The segments in launch order: buckets of whole blocks (config.bucket_mb), from the last block,
// then the tensors after the blocks (ln_f, the head's copy of wte), then those before them (wte,
// wpe). Segments of one size share their programs, so the programs' buffers are the largest
// segment's, not the model's.
// `block_per_segment`: every block a segment of its own (the model state in a BlockStore).
std::vector<SegmentBounds> optimizer_segments(const ShardLayout& layout,
                                              const OptimizerConfig& config,
                                              bool block_per_segment = false);

// The optimizer's program: dsl::workloads::adam or lamb_bucket, with the configured gradient dtype.
dsl::Program optimizer_program(const OptimizerConfig& config);

// The schedules the optimizer program prefers, best first.
std::vector<std::string> optimizer_schedule_preferences();

class DataParallelOptimizer {
 public:
  // Over this rank's model state (which must outlive the optimizer), whose moments it places
  // (ModelState::place_moments): one piece per segment, every block its own segment when the
  // blocks are in a store. `schedules`: preferences, first found wins, and the first one's chunk
  // size (the autotuner's winner's); no names: optimizer_schedule_preferences() at the process's
  // chunk size. `overlap_allowed`: whether a second thread may communicate on `dp` while the
  // calling thread runs the backward (false under MPI without MPI_THREAD_MULTIPLE when the backward
  // itself communicates); without it "overlap" runs as "after". `world`: every rank of the grid,
  // over which a clipped step's gradient norm sums (null: `dp`, right when dp is the whole grid). A
  // collective over the data-parallel group.
  DataParallelOptimizer(const OptimizerConfig& config, ModelState& state, comm::Communicator& dp,
                        const SchedulePreferences& schedules = {},
                        exec::RunnerKind executor = exec::runner_kind_from_env(),
                        bool overlap_allowed = true, comm::Communicator* world = nullptr);
  ~DataParallelOptimizer();

  // With the blocks in a store, a block's update runs as soon as its gradients are final (on the
  // communication thread, or at once without one), and outside a step its gradients are dropped.
  // One step in three calls: begin_step before the backward (`step` counts optimizer steps from
  // 1, for Adam's bias correction); layer_ready(l) when block l's gradients are final; then
  // finish_step once every gradient is final: it runs what is left, waits for the segments and
  // rethrows the first failure. params -= the update for the dp-averaged grads; params end
  // bitwise equal on every dp rank. Collectives over the data-parallel group.
  void begin_step(double lr, int64_t step);
  void layer_ready(int layer);
  void finish_step();
  // The three at once (the exchange after the backward).
  void step(double lr, int64_t step);

  // Called after each segment ran, on the thread that ran it (the communication thread when
  // overlapping): its name ("h.7..h.4", "ln_f.weight..wte") and when it ran.
  using SegmentSink =
      std::function<void(std::string_view name, std::chrono::steady_clock::time_point begin,
                         std::chrono::steady_clock::time_point end)>;
  void set_segment_sink(SegmentSink sink) { sink_ = std::move(sink); }
  // Seconds the segments of the last step ran (on whichever thread), after finish_step.
  double exchange_seconds() const { return static_cast<double>(exchange_ns_.load()) * 1e-9; }

  // The norm of the last step's averaged gradient, before clipping (clipped steps only).
  std::optional<double> grad_norm() const { return grad_norm_; }

  const OptimizerConfig& config() const { return config_; }
  // Whether each data-parallel rank keeps only its slice of the moments (the pieces in the model
  // state are then slices of the segments).
  bool state_sliced() const { return sliced_; }
  bool overlapping() const { return worker_ != nullptr; }
  int segments() const { return static_cast<int>(segments_.size()); }
  // Buckets: segments made of blocks.
  int buckets() const { return buckets_; }
  // LAMB: the tensors its segments update, each with its own trust ratio (0 for AdamW).
  int tensors() const { return tensors_; }
  // The schedule (with clipping, each half's: "grad_reduce C, adam_update fused(C)").
  std::string schedule_name() const;
  std::string executor_name() const { return runner_->executor_name(); }
  // The chunk size the step's collectives run at: the autotuner's, with its schedule (0: the
  // process's comm::chunk_bytes()).
  size_t chunk_bytes() const { return runner_->chunk_bytes(); }
  // Bytes of the programs' own buffers (the communication's staging and scratch, rounded bf16
  // gradients), from the runners' allocation counts (the moments are the model state's).
  size_t buffer_bytes() const;

 private:
  // The programs for segments of one shape (n elements; with LAMB, these tensor bounds).
  struct Runners {
    int64_t n = 0;
    dsl::Segments tensors;
    bool sharded = false;  // a sharded block's: the weights sliced (sharded_runner_)
    std::unique_ptr<exec::Runner> runner;  // the step, or with clipping its reduction
    std::unique_ptr<exec::Runner> update;  // with clipping: the update
  };
  struct Segment {
    size_t index = 0;
    std::string name;
    int64_t begin = 0, end = 0;
    int ready_layer = -1;  // launched once this block's gradients are final; -1: at the end
    bool launched = false;
    Runners* runners = nullptr;
    // With clipping: the reduced gradient, kept until the update; this rank's elements of it
    // whose squares count toward the norm ([first, second)), and their sum after the reduction.
    Tensor g_sum;
    std::vector<std::pair<int64_t, int64_t>> norm_runs;
    double squares = 0;
  };
  bool clipped() const { return update_runner_ != nullptr; }
  Runners& runners_for(int64_t n, const dsl::Segments& tensors, bool sharded);
  // Adds the segment and returns its piece of the moments.
  ModelState::Piece add_segment(const ShardLayout& layout, std::string name, int64_t begin,
                                int64_t end, int ready_layer);
  void launch(Segment& s);
  void run_segment(Segment& s);  // the step, or with clipping its reduction
  // The program that updates the weights on the segment's state (`u`: from state_.begin_update).
  void run_update(Segment& s, const ModelState::Update& u);
  void set_hyper_parameters(exec::Runner& run) const;
  // The summed gradients' mean, as the programs hold it (an f32 scalar).
  float grad_scale() const { return static_cast<float>(1.0 / dp_.size()); }
  // With clipping: the norm over every rank, and the factor for the updates.
  double clip_factor();

  OptimizerConfig config_;
  ModelState& state_;
  comm::Communicator& dp_;
  std::unique_ptr<ProgramRunner> runner_;          // the step, or with clipping its reduction
  std::unique_ptr<ProgramRunner> sharded_runner_;  // --shard weights: the blocks' step
  std::unique_ptr<ProgramRunner> update_runner_, norm_runner_;  // with clipping
  std::unique_ptr<exec::Runner> norm_;                          // grad_norm on `world`
  std::optional<double> grad_norm_;
  bool sliced_ = false;
  bool grads_f32_ = true;  // the program's g is f32: bound to the model's gradients
  int buckets_ = 0;
  int tensors_ = 0;
  std::vector<std::unique_ptr<Runners>> runners_;
  std::vector<Segment> segments_;
  double lr_ = 0;
  int64_t step_ = 0;
  bool in_step_ = false;  // between begin_step and finish_step
  SegmentSink sink_;
  std::atomic<int64_t> exchange_ns_{0};
  std::unique_ptr<SerialWorker> worker_;  // the communication thread, when overlapping
};

}  // namespace tandem::parallel
