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
// The split is balanced for the causal mask: the sequence is cut into 2 cp chunks and rank i
// holds chunks i and 2 cp - 1 - i, one early and one late, so every rank's queries meet as many
// keys in all. Dropout draws what one rank's attention draws for the same positions, so results
// equal one rank's attention to f32 rounding (the tests: rtol 2e-6 of the output's largest value,
// 1e-5 of each gradient part's).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/comm/communicator.h"
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

// The exchanges' schedules (parallel/program_runner.h): the autotuner's choice, else the
// program as written.
struct ContextSchedules {
  SchedulePreferences gather{{"C"}};
  SchedulePreferences reduce{{"C"}};
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
  // Bytes this rank holds for the exchanges and the kernel's scratch.
  size_t allocated_bytes() const;
  // What the constructor allocates itself for these arguments, the exchanges' runners' own
  // buffers aside: three whole-sequence key/value buffers (gathered in rank order, in sequence
  // order, their gradient), the rank's piece and the kernel's scratch. The memory estimate's.
  static uint64_t buffer_bytes(const ContextSplit& split, int B, int KVH, int HS,
                               const nn::FlashBlocks& blocks = {});

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

  ContextSplit split_;
  int B_, NH_, KVH_, HS_;
  nn::FlashBlocks blocks_;
  std::vector<int> positions_;
  nn::AttentionRows rows_;
  ProgramRunner gather_program_, reduce_program_;
  std::unique_ptr<exec::Runner> gather_, reduce_;
  Tensor mine_;    // (B, Tl, 2K): this rank's k and v rows; then its summed gradient
  Tensor ranked_;  // (cp, B, Tl, 2K): every rank's, in rank order (the exchanges' whole)
  Tensor kv_;      // (B, T, 2K): the same in sequence order
  Tensor dkv_;     // (B, T, 2K): their gradient from this rank's queries
  Tensor scratch_;
};

}  // namespace tandem::parallel
