// Context parallelism (--cp): a sequence's tokens split over the ranks of a group, attention run
// on each rank's own query rows against the keys and values of the whole sequence.
//
// Every part of a block but attention works row by row (norms, projections, MLP, residuals), so
// a rank runs it on its own tokens unchanged. Attention follows Llama 3's all-gather context
// parallelism: the group's keys and values are gathered (the kv_gather program), the fused kernel
// runs the rank's query rows at their positions in the sequence against them (blocks above the
// causal diagonal skipped), and the backward computes the rank's dq locally and dk, dv for every
// key position, summed over the group and scattered back to the ranks holding those tokens (the
// kv_grad_reduce program). The backward gathers the keys and values again rather than keeping
// them: a rank saves what one-rank attention saves of its own tokens (out and the log-sum-exp).
//
// The order (ContextOrder, a schedule: both compute the same to f32 rounding). Overlapped, the
// default: the exchanges run on a communication thread (core::SerialWorker) while the rank
// multiplies what it already has. Forward: the gather runs while the rank's queries meet its own
// keys (both its chunks, the causal diagonal's blocks among them), then the others' keys, the
// partial results merged through their log-sum-exps (nn::flash_attention_merge); out and lse are
// saved as before. Backward: the gather runs while the rank's late chunk's keys (its diagonal)
// take their gradient, then the other ranks' keys do, their gradient's reduce-scatter starts, and
// runs while the rank's early chunk's keys take theirs; the rank's own part is added after it.
// Sequential: gather, multiply; multiply, reduce (no thread). Ring (ring attention): no rank
// holds the whole sequence's keys; each rank's key/value piece goes round the group, one step a
// product, by the kv_ring program (a DSL Shift: to the next rank while the previous rank's
// arrives). Forward: the shift to the next rank runs while the rank's queries meet the piece it
// holds (its own first), cp - 1 shifts in all, the partial results merged as the overlapped
// order merges them. Backward: the pieces go round again, each with its accumulating key/value
// gradient: while a piece's keys take this rank's queries' gradient (into a zeroed piece, added
// to the accumulator when it has arrived), the next piece and the previous accumulator move on;
// after cp steps one more shift hands every accumulator back to its owner. That last shift runs
// behind a product too: a rank multiplies its own piece's early chunk first (at step 0, while the
// first piece arrives) and its late chunk, the causal diagonal, last, while its accumulator comes
// home, then adds the two. (Before, the whole own piece went first and the last shift was waited
// for with nothing behind it; the sums now run in another order, so the results moved by f32
// rounding, not bitwise.) A rank holds two pieces of keys and values, two accumulators and one
// partial gradient instead of three whole-sequence buffers. Under MPI the thread needs
// MPI_THREAD_MULTIPLE (the data-parallel exchange's thread may be calling MPI too:
// comm::communication_thread_allowed); with less the overlapped and ring orders run their exchanges
// on the calling thread, at the same points. The overlapped order's exchanges are whole
// collectives, so its buffers are the sequential order's and one partial output.
//
// The split is balanced for the causal mask: the sequence is cut into 2 cp chunks and rank i
// holds chunks i and 2 cp - 1 - i, one early and one late, so every rank's queries meet as many
// keys in all. Dropout draws what one rank's attention draws for the same positions, so results
// equal one rank's attention to f32 rounding (the tests: rtol 2e-6 of the output's largest value,
// 1e-5 of each gradient part's).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/core/serial_worker.h"
#include "tandem/core/tensor.h"
#include "tandem/exec/runner.h"
#include "tandem/nn/layers.h"
#include "tandem/parallel/program_runner.h"

namespace tandem::parallel {

// Which tokens of a sequence of T a rank of a cp-rank group holds (see above): its token r is at
// position(r), chunk 0's tokens first, then chunk 1's.
struct ContextSplit {
  int T = 1;
  int cp = 1;
  int rank = 0;

  // A UserError unless cp >= 1 and T cuts into 2 cp equal chunks, naming both numbers.
  static void check(int T, int cp);
  ContextSplit(int T, int cp, int rank);  // an InternalError where check() would refuse

  int chunk() const { return T / (2 * cp); }  // tokens a chunk
  int tokens() const { return T / cp; }       // tokens a rank
  // The first position of this rank's chunk c (0: chunk rank, 1: chunk 2 cp - 1 - rank).
  int chunk_start(int c) const { return (c == 0 ? rank : 2 * cp - 1 - rank) * chunk(); }
  int position(int r) const { return chunk_start(r / chunk()) + r % chunk(); }
  std::vector<int> positions() const;
};

// The token embedding and the learned positions (GPT-2's wpe; null: none, Llama's are rotary) of
// this rank's tokens at their positions: out (B, Tl, C) from tokens (B, Tl); the backward adds
// into dwte and dwpe.
void context_embedding_forward(const ContextSplit& s, float* out, const int32_t* tokens,
                               const float* wte, const float* wpe, int B, int C);
void context_embedding_backward(const ContextSplit& s, float* dwte, float* dwpe, const float* dout,
                                const int32_t* tokens, int B, int C);

// Whether the exchanges overlap the products, and which (see above).
enum class ContextOrder { Sequential, Overlapped, Ring };
std::string_view context_order_name(ContextOrder order);  // "sequential", "overlapped", "ring"
// TANDEM_CP_ORDER: ring, overlap or sequential; unset, TANDEM_CP_OVERLAP: 1 (the default)
// Overlapped, 0 Sequential. Anything else is a UserError naming the variable and the choices.
ContextOrder context_order_from_env();

// The exchanges' schedules (parallel/program_runner.h): the autotuner's choice, else the
// program as written; and their order against the products.
struct ContextSchedules {
  SchedulePreferences gather{{"C"}};
  SchedulePreferences reduce{{"C"}};
  SchedulePreferences ring{{"C"}};  // kv_ring, the ring order's exchange
  ContextOrder order = context_order_from_env();
};

// Seconds a rank's exchanges ran (on the communication thread) and the caller waited for them,
// summed over the calls since construction: 1 - waited / exchanged is the share hidden behind the
// products. Sequential: the two are equal.
struct ContextOverlapTimes {
  double exchanged_s = 0.0;
  double waited_s = 0.0;
};

class ContextParallelAttention {
 public:
  // Set up on this rank of `group` (the cp group: `split.cp` ranks, this one split.rank) for B
  // samples, NH query heads and KVH key/value heads of HS (the rank's own under tensor
  // parallelism). A collective over the group; nothing is allocated after it.
  ContextParallelAttention(comm::Communicator& group, const ContextSplit& split, int B, int NH,
                           int KVH, int HS, const ContextSchedules& schedules = {},
                           exec::RunnerKind executor = exec::runner_kind_from_env(),
                           const nn::FlashBlocks& blocks = {});
  ~ContextParallelAttention();

  const ContextSplit& split() const { return split_; }
  // The exchanges' programs with their schedules and chunk sizes, for the start-up lines.
  const ProgramRunner& gather_program() const { return gather_program_; }
  const ProgramRunner& reduce_program() const { return reduce_program_; }
  const ProgramRunner& ring_program() const { return ring_program_; }
  ContextOrder order() const { return order_; }
  // Whether the exchanges run on a communication thread (Overlapped or Ring, cp > 1 and, under
  // MPI, MPI_THREAD_MULTIPLE).
  bool overlapping() const { return worker_ != nullptr; }
  const ContextOverlapTimes& overlap_times() const { return times_; }
  // Bytes this rank holds for the exchanges and the kernel's scratch.
  size_t allocated_bytes() const;
  // What the constructor allocates itself for these arguments, the exchanges' runners' own
  // buffers aside: three whole-sequence key/value buffers (gathered in rank order, in sequence
  // order, their gradient), the rank's piece, the kernel's scratch and, overlapped with cp > 1, a
  // partial output and log-sum-exp to merge. The ring order instead: with cp > 1 five pieces (two
  // of keys and values, two accumulators, one partial gradient) and the partial output; alone, two
  // (its keys and values, their gradient). The memory estimate's.
  static uint64_t buffer_bytes(const ContextSplit& split, int B, int NH, int KVH, int HS,
                               const nn::FlashBlocks& blocks = {},
                               ContextOrder order = context_order_from_env());

  // out (B, Tl, NH*HS), lse (B, NH, Tl) from this rank's qkv (B, Tl, (NH + 2*KVH)*HS), Tl =
  // split.tokens(): its queries against every rank's keys and values. A collective.
  void forward(float* out, float* lse, const float* qkv, const nn::AttentionDropout& drop);
  // dqkv (B, Tl, (NH + 2*KVH)*HS) += the gradient for dout (B, Tl, NH*HS): its q columns from
  // this rank's queries, its k and v columns from every rank's. out and lse: the forward's. A
  // collective.
  void backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                const float* lse, const nn::AttentionDropout& drop);

 private:
  void gather(const float* qkv);  // every rank's keys and values into kv_, in sequence order
  void forward_overlapped(float* out, float* lse, const float* qkv,
                          const nn::AttentionDropout& drop);
  void backward_overlapped(float* dqkv, const float* dout, const float* qkv, const float* out,
                           const float* lse, const nn::AttentionDropout& drop);
  void forward_ring(float* out, float* lse, const float* qkv, const nn::AttentionDropout& drop);
  void backward_ring(float* dqkv, const float* dout, const float* qkv, const float* out,
                     const float* lse, const nn::AttentionDropout& drop);
  // This rank's k and v columns of qkv into `piece` (B, Tl, 2K).
  void copy_mine(float* piece, const float* qkv) const;
  // The kernel's calls against rank `owner`'s piece held in a (B, Tl, 2K) buffer: each with the
  // row of the piece its keys start at. Its early chunk first, its late one after (one call where
  // they are adjacent, unless `apart`); none for keys above every one of this rank's rows.
  struct PieceKeys {
    nn::AttentionRows rows;
    int piece_row = 0;
  };
  std::vector<PieceKeys> piece_keys(int owner, bool apart = false) const;
  // This rank's k and v columns of qkv into mine_ and to their positions in kv_.
  void stage_mine(const float* qkv);
  // The other ranks' pieces of ranked_ to their positions in kv_.
  void place_others();
  // Runs `exchange` on the communication thread (on this one when there is none); finish() waits.
  void start(exec::Runner& exchange);
  void finish();
  // Whether the overlapped order runs (Overlapped, cp > 1).
  bool overlapped() const { return order_ == ContextOrder::Overlapped && split_.cp > 1; }
  // The kernel's rows against keys [first, first + count) of the sequence.
  nn::AttentionRows keys(int first, int count) const;

  ContextSplit split_;
  ContextOrder order_;
  int B_, NH_, KVH_, HS_;
  nn::FlashBlocks blocks_;
  std::vector<int> positions_;
  nn::AttentionRows rows_;
  ProgramRunner gather_program_, reduce_program_, ring_program_;
  std::unique_ptr<exec::Runner> gather_, reduce_;  // not the ring order's
  // The ring order's shifts: ring_kv_[i] sends kv_blocks_[i] on and receives into the other; so
  // too ring_d_[i] with the accumulators.
  std::unique_ptr<exec::Runner> ring_kv_[2], ring_d_[2];
  Tensor mine_;    // (B, Tl, 2K): this rank's k and v rows; then its summed gradient
  Tensor ranked_;  // (cp, B, Tl, 2K): every rank's, in rank order (the exchanges' whole)
  Tensor kv_;      // (B, T, 2K): the same in sequence order
  Tensor dkv_;     // (B, T, 2K): their gradient from this rank's queries
  Tensor part_;    // overlapped, ring: (B, Tl, NH*HS) then (B, NH, Tl): a partial out and lse
  // The ring order's instead of the four above: (B, Tl, 2K) pieces of keys and values, their
  // gradient's accumulators, and one step's gradient.
  Tensor kv_blocks_[2], dkv_blocks_[2], dkv_step_;
  Tensor scratch_;
  ContextOverlapTimes times_;
  uint64_t ticket_ = 0;  // the exchange started last
  double ran_s_ =
      0.0;  // how long the exchanges since finish() ran (written by the jobs, read after)
  std::unique_ptr<SerialWorker> worker_;  // last: stopped before the buffers its jobs use
};

}  // namespace tandem::parallel
