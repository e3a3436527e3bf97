// Context-parallel attention: the keys and values gathered over the group, the fused kernel on
// this rank's query rows, the keys' and values' gradients summed back to their owners.
#include "tandem/parallel/context_parallel.h"

#include <algorithm>
#include <cstring>

#include "tandem/core/error.h"
#include "tandem/dsl/workloads.h"

namespace tandem::parallel {

void ContextSplit::check(int T, int cp) {
  if (cp < 1)
    user_error("context parallelism over {} ranks: the rank count must be at least 1", cp);
  if (T < 2 * cp || T % (2 * cp) != 0)
    user_error(
        "context parallelism over {} ranks cuts a sequence into {} equal chunks (two a rank), "
        "which {} tokens are not: the sequence length must be a multiple of {}",
        cp, 2 * cp, T, 2 * cp);
}

ContextSplit::ContextSplit(int T_, int cp_, int rank_) : T(T_), cp(cp_), rank(rank_) {
  TANDEM_CHECK(cp >= 1 && T >= 2 * cp && T % (2 * cp) == 0 && rank >= 0 && rank < cp,
               "context split of {} tokens over {} ranks at rank {}", T, cp, rank);
}

std::vector<int> ContextSplit::positions() const {
  std::vector<int> p(static_cast<size_t>(tokens()));
  for (int r = 0; r < tokens(); ++r) p[static_cast<size_t>(r)] = position(r);
  return p;
}

// Each (sample, chunk) is a run of consecutive positions: nn's encoder on it, at its first.
void context_embedding_forward(const ContextSplit& s, float* out, const int32_t* tokens,
                               const float* wte, const float* wpe, int B, int C) {
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < 2; ++c) {
      const int64_t row = static_cast<int64_t>(b) * s.tokens() + c * s.chunk();
      nn::encoder_forward(
          out + row * C, tokens + row, wte,
          wpe != nullptr ? wpe + static_cast<int64_t>(s.chunk_start(c)) * C : nullptr, 1, s.chunk(),
          C);
    }
}

void context_embedding_backward(const ContextSplit& s, float* dwte, float* dwpe, const float* dout,
                                const int32_t* tokens, int B, int C) {
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < 2; ++c) {
      const int64_t row = static_cast<int64_t>(b) * s.tokens() + c * s.chunk();
      nn::encoder_backward(
          dwte, dwpe != nullptr ? dwpe + static_cast<int64_t>(s.chunk_start(c)) * C : nullptr,
          dout + row * C, tokens + row, 1, s.chunk(), C);
    }
}

namespace {

// The rank's piece of the exchanges: (B, Tl, 2K) floats.
int64_t piece_floats(const ContextSplit& s, int B, int KVH, int HS) {
  return static_cast<int64_t>(B) * s.tokens() * 2 * KVH * HS;
}

}  // namespace

ContextParallelAttention::ContextParallelAttention(
    comm::Communicator& group, const ContextSplit& split, int B, int NH, int KVH, int HS,
    const ContextSchedules& schedules, exec::RunnerKind executor, const nn::FlashBlocks& blocks)
    : split_(split),
      B_(B),
      NH_(NH),
      KVH_(KVH),
      HS_(HS),
      blocks_(blocks),
      positions_(split.positions()),
      rows_{split.tokens(), split.T, positions_.data()},
      gather_program_(dsl::workloads::kv_gather(), schedules.gather.names, executor,
                      schedules.gather.chunk_bytes),
      reduce_program_(dsl::workloads::kv_grad_reduce(), schedules.reduce.names, executor,
                      schedules.reduce.chunk_bytes) {
  TANDEM_CHECK(
      group.size() == split.cp && group.rank() == split.rank,
      "context-parallel attention split over {} ranks (rank {}) on a group of {} (rank {})",
      split.cp, split.rank, group.size(), group.rank());
  TANDEM_CHECK(B >= 1 && NH >= 1 && KVH >= 1 && NH % KVH == 0 && HS >= 1,
               "context-parallel attention of {} samples, {} heads, {} key/value heads of {}", B,
               NH, KVH, HS);
  const int64_t piece = piece_floats(split, B, KVH, HS), whole = piece * split.cp;
  mine_ = Tensor::empty(DType::F32, Shape{piece});
  ranked_ = Tensor::empty(DType::F32, Shape{whole});
  kv_ = Tensor::empty(DType::F32, Shape{whole});
  dkv_ = Tensor::empty(DType::F32, Shape{whole});
  scratch_ =
      Tensor::empty(DType::F32, Shape{nn::flash_attention_scratch_floats(rows_, HS, blocks)});
  const dsl::SymbolMap n = {{"N", whole}};
  gather_ = gather_program_.prepare(group, n, {"kv", "kv_all"});
  gather_->bind("kv", mine_);
  gather_->bind("kv_all", ranked_);
  // The reduction's input is the gathered keys' buffer, free by then; its output the rank's own.
  reduce_ = reduce_program_.prepare(group, n, {"dkv", "dkv_mine"});
  reduce_->bind("dkv", ranked_);
  reduce_->bind("dkv_mine", mine_);
}

ContextParallelAttention::~ContextParallelAttention() = default;

uint64_t ContextParallelAttention::buffer_bytes(const ContextSplit& split, int B, int KVH, int HS,
                                                const nn::FlashBlocks& blocks) {
  const std::vector<int> positions = split.positions();
  const nn::AttentionRows rows{split.tokens(), split.T, positions.data()};
  const auto piece = static_cast<uint64_t>(piece_floats(split, B, KVH, HS));
  const auto scratch = static_cast<uint64_t>(nn::flash_attention_scratch_floats(rows, HS, blocks));
  return (piece + 3 * piece * static_cast<uint64_t>(split.cp) + scratch) * sizeof(float);
}

size_t ContextParallelAttention::allocated_bytes() const {
  return mine_.nbytes() + ranked_.nbytes() + kv_.nbytes() + dkv_.nbytes() + scratch_.nbytes() +
         gather_->allocated_bytes() + reduce_->allocated_bytes();
}

void ContextParallelAttention::gather(const float* qkv) {
  const int Tl = split_.tokens(), T = split_.T, W = 2 * KVH_ * HS_;
  const int64_t C3 = static_cast<int64_t>(NH_ + 2 * KVH_) * HS_, q_cols = int64_t{NH_} * HS_;
  float* mine = mine_.data_as<float>();
  for (int64_t row = 0; row < static_cast<int64_t>(B_) * Tl; ++row)  // the k and v columns
    std::memcpy(mine + row * W, qkv + row * C3 + q_cols, sizeof(float) * W);
  gather_->run();
  // ranked_ (cp, B, Tl, W) -> kv_ (B, T, W): each rank's chunks to their positions.
  const float* ranked = ranked_.data_as<float>();
  float* kv = kv_.data_as<float>();
  for (int r = 0; r < split_.cp; ++r) {
    const ContextSplit theirs(T, split_.cp, r);
    for (int b = 0; b < B_; ++b)
      for (int c = 0; c < 2; ++c)
        std::memcpy(kv + (static_cast<int64_t>(b) * T + theirs.chunk_start(c)) * W,
                    ranked + ((static_cast<int64_t>(r) * B_ + b) * Tl + c * theirs.chunk()) * W,
                    sizeof(float) * theirs.chunk() * W);
  }
}

void ContextParallelAttention::forward(float* out, float* lse, const float* qkv,
                                       const nn::AttentionDropout& drop) {
  gather(qkv);
  nn::flash_attention_forward(out, lse, scratch_.data_as<float>(), qkv, kv_.data_as<float>(), rows_,
                              B_, NH_, KVH_, HS_, drop, blocks_);
}

void ContextParallelAttention::backward(float* dqkv, const float* dout, const float* qkv,
                                        const float* out, const float* lse,
                                        const nn::AttentionDropout& drop) {
  // The keys and values again: other layers have gathered theirs into kv_ since the forward.
  gather(qkv);
  const int Tl = split_.tokens(), T = split_.T, W = 2 * KVH_ * HS_;
  float* dkv = dkv_.data_as<float>();
  std::fill(dkv, dkv + dkv_.numel(), 0.0f);
  nn::flash_attention_backward(dqkv, dkv, scratch_.data_as<float>(), dout, qkv,
                               kv_.data_as<float>(), out, lse, rows_, B_, NH_, KVH_, HS_, drop,
                               blocks_);
  // dkv_ (B, T, W) -> ranked_ (cp, B, Tl, W), each rank's chunks its piece, then summed over the
  // group into this rank's piece (mine_).
  float* ranked = ranked_.data_as<float>();
  for (int r = 0; r < split_.cp; ++r) {
    const ContextSplit theirs(T, split_.cp, r);
    for (int b = 0; b < B_; ++b)
      for (int c = 0; c < 2; ++c)
        std::memcpy(ranked + ((static_cast<int64_t>(r) * B_ + b) * Tl + c * theirs.chunk()) * W,
                    dkv + (static_cast<int64_t>(b) * T + theirs.chunk_start(c)) * W,
                    sizeof(float) * theirs.chunk() * W);
  }
  reduce_->run();
  const int64_t C3 = static_cast<int64_t>(NH_ + 2 * KVH_) * HS_, q_cols = int64_t{NH_} * HS_;
  const float* mine = mine_.data_as<float>();
  for (int64_t row = 0; row < static_cast<int64_t>(B_) * Tl; ++row) {
    float* d = dqkv + row * C3 + q_cols;
    const float* g = mine + row * W;
    for (int j = 0; j < W; ++j) d[j] += g[j];
  }
}

}  // namespace tandem::parallel
