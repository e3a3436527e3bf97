// The data-parallel optimizer step as a DSL program: each rank's gradient summed over the
// data-parallel group and averaged, then AdamW (dsl::workloads::adam) or LAMB
// (dsl::workloads::lamb) applied to this rank's parameter shard, each segment of it (below) one
// program run with its chosen schedule (ProgramRunner). The preferred schedule,
// "fused(RS-C-AG)+slice(m,v)", is ZeRO-1: ReduceScatter of the gradient with the update computed
// inside it on this rank's 1/dp of the elements, AllGather of the new weights, and the moments m
// and v stored sliced, each rank keeping only its 1/dp of them.
//
// AdamW's weight decay applies to every tensor, biases and LayerNorms included, as the program
// states it. LAMB's trust ratio is per tensor, so LAMB runs the program once per local tensor;
// under tensor parallelism a sharded tensor's ratio is that of this rank's shard (the program's
// norms reduce over the data-parallel group only), so LAMB equals single-rank LAMB only at tp = 1.
//
// Buckets and overlap (what PyTorch DDP users get from gradient buckets, done with the fused
// schedules): the local flat buffer is cut into segments, each a program runner set up once on
// the data-parallel group. AdamW's segments are buckets of whole blocks, in backward order, of
// about `bucket_mb` each, then the parameters outside the blocks (ln_f and the LM head's copy of
// wte; wte and wpe); LAMB's are its tensors. With exchange "overlap", the trainer tells the
// optimizer when a block's gradients are final (ParallelGPT::set_gradients_ready) and that
// block's segments run at once on this rank's communication thread while the backward goes on
// with earlier blocks; the rest run when the backward (and the tied embedding's reduction) is
// done. With "after", every segment runs after the backward, on the calling thread, in the same
// order: the same programs on the same data, so the two give bitwise the same weights.
// Safety: a segment reads its gradients and writes its weights only after the backward has
// finished with them (ParallelGPT's guarantee), the backward writes only earlier blocks'
// gradients meanwhile, and finish_step() waits for every segment before anything reads the
// weights again.
//
// Zero copy: each segment's program reads the gradients and updates the weights in the model's
// own buffers (exec::Runner::bind); only bf16 gradients (--grad-dtype bf16) are rounded into the
// program's own buffer first. For each segment this rank keeps the moments m and v of its part
// (comm::Partition of the segment over the dp ranks) when the schedule slices the state, or of
// the whole segment when it does not: pieces() says which local elements each piece holds. They
// live in the runners' storage between steps ("memory"), or in a slow tier ("host", "file:DIR":
// train/tiered_state.h), streamed through two staging slots around each segment's run; the
// arithmetic is the same, so the weights are bitwise the same.
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

#include <nlohmann/json.hpp>

#include "tandem/comm/communicator.h"
#include "tandem/core/serial_worker.h"
#include "tandem/core/tensor.h"
#include "tandem/parallel/program_runner.h"
#include "tandem/parallel/shard.h"

namespace tandem::train {
namespace detail {
class TieredState;
}

struct OptimizerConfig {
  std::string name = "adamw";  // "adamw" or "lamb"
  // The gradients' dtype in the program: "f32", or "bf16" (mixed precision: gradients rounded to
  // bf16 and summed in bf16 on the wire, half the bytes; weights and moments stay f32).
  std::string grad_dtype = "f32";
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;
  // The data-parallel exchange: "overlap" (with the backward) or "after" (the backward), and
  // AdamW's bucket size in MiB (unset: kDefaultBucketMiB, or the whole model when smaller).
  std::string exchange = "overlap";
  std::optional<double> bucket_mb;
  // Where the moments live: "memory", or a slow tier as ooc::TierSpec writes it ("host",
  // "file:DIR").
  std::string state_tier = "memory";

  // UserError naming the bad field.
  void validate() const;
  nlohmann::json to_json() const;  // {"beta1": 0.9, ...} (the name is RunMeta::optimizer)
};

// AdamW's default bucket. bench/run_exchange.sh --buckets "1 16 64" found no difference beyond
// noise between 1 and 64 MiB on 2 cores (docs/benchmarks.md); 4 MiB makes a bucket about one
// block at d_model 512, so the first exchange starts early in the backward.
inline constexpr double kDefaultBucketMiB = 4.0;

// The optimizer's program: dsl::workloads::adam or lamb, with the configured gradient dtype.
dsl::Program optimizer_program(const OptimizerConfig& config);

// The schedules the optimizer program prefers, best first.
std::vector<std::string> optimizer_schedule_preferences();

class DataParallelOptimizer {
 public:
  // Local elements [begin, end) whose moments this rank keeps (end - begin floats of m and of v).
  struct Piece {
    int64_t begin = 0;
    int64_t end = 0;
  };

  // Over this rank's local flat `params` and `grads` (layout.size() floats each; they must outlive
  // the optimizer). `schedules`: preferences, first found wins (default
  // optimizer_schedule_preferences()). `overlap_allowed`: whether a second thread may
  // communicate on `dp` while the calling thread runs the backward (false under MPI without
  // MPI_THREAD_MULTIPLE when the backward itself communicates); without it "overlap" runs as
  // "after". A collective over the data-parallel group.
  DataParallelOptimizer(const OptimizerConfig& config, const parallel::ShardLayout& layout, Tensor params,
                        Tensor grads, comm::Communicator& dp, const std::vector<std::string>& schedules = {},
                        exec::RunnerKind executor = exec::runner_kind_from_env(), bool overlap_allowed = true);
  ~DataParallelOptimizer();

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
  using SegmentSink = std::function<void(std::string_view name, std::chrono::steady_clock::time_point begin,
                                         std::chrono::steady_clock::time_point end)>;
  void set_segment_sink(SegmentSink sink) { sink_ = std::move(sink); }
  // Seconds the segments of the last step ran (on whichever thread), after finish_step.
  double exchange_seconds() const { return static_cast<double>(exchange_ns_.load()) * 1e-9; }

  const OptimizerConfig& config() const { return config_; }
  const std::vector<Piece>& pieces() const { return pieces_; }
  // Piece i's moments copied out (end - begin floats each), or replaced; outside a step.
  void read_state(size_t i, float* m, float* v) const;
  void write_state(size_t i, const float* m, const float* v);
  bool state_sliced() const { return sliced_; }
  bool overlapping() const { return worker_ != nullptr; }
  int segments() const { return static_cast<int>(segments_.size()); }
  // AdamW's buckets: segments made of blocks (0 for LAMB).
  int buckets() const { return buckets_; }
  std::string schedule_name() const { return runner_->schedule_name(); }
  std::string executor_name() const { return runner_->executor_name(); }
  // Bytes this rank holds in memory for the optimizer state (m and v; with a slow tier, its two
  // staging slots), in the slow tier, and for the programs' other buffers (the communication's
  // staging and scratch, rounded bf16 gradients), from the runners' allocation counts.
  size_t state_bytes() const;
  size_t state_tier_bytes() const;
  size_t buffer_bytes() const;
  std::string state_tier_description() const;  // "" in memory

 private:
  struct Segment {
    size_t index;
    std::string name;
    int64_t begin, end;
    int ready_layer;  // launched once this block's gradients are final; kAfterBackward: at the end
    bool launched = false;
    std::unique_ptr<exec::Runner> runner;
    bool grads_bound = false;  // g is the model's memory (f32); else rounded into the runner's
  };
  static constexpr int kAfterBackward = -1;
  void add_segment(std::string name, int64_t begin, int64_t end, int ready_layer);
  void launch(Segment& s);
  void run_segment(Segment& s);

  OptimizerConfig config_;
  Tensor params_, grads_;
  comm::Communicator& dp_;
  std::unique_ptr<parallel::ProgramRunner> runner_;
  bool sliced_ = false;
  int buckets_ = 0;
  std::vector<Segment> segments_;
  std::vector<Piece> pieces_;
  std::vector<Tensor> m_, v_;  // each piece's moments in the runner's storage ("memory")
  std::unique_ptr<detail::TieredState> tier_;  // or in a slow tier
  double lr_ = 0;
  int64_t step_ = 0;
  bool in_step_ = false;  // between begin_step and finish_step
  SegmentSink sink_;
  std::atomic<int64_t> exchange_ns_{0};
  std::unique_ptr<SerialWorker> worker_;  // the communication thread, when overlapping
};

}  // namespace tandem::train
