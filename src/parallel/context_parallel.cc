// Context-parallel attention: the keys and values gathered over the group, the fused kernel on
// this rank's query rows, the keys' and values' gradients summed back to their owners.
#include "tandem/parallel/context_parallel.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "tandem/comm/mpi.h"
#include "tandem/core/env.h"
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

std::string_view context_order_name(ContextOrder order) {
  switch (order) {
    case ContextOrder::Sequential:
      return "sequential";
    case ContextOrder::Overlapped:
      return "overlapped";
    case ContextOrder::Ring:
      return "ring";
  }
  return "?";
}

ContextOrder context_order_from_env() {
  const std::string order = env_str("TANDEM_CP_ORDER", "");
  if (!order.empty()) {
    if (order == "ring") return ContextOrder::Ring;
    if (order == "overlap") return ContextOrder::Overlapped;
    if (order == "sequential") return ContextOrder::Sequential;
    user_error(
        "TANDEM_CP_ORDER={}: give ring (the keys and values go round the group while each piece "
        "is multiplied), overlap (gathered while the rank's own are multiplied) or sequential "
        "(gathered before, reduced after)",
        order);
  }
  const std::string v = env_str("TANDEM_CP_OVERLAP", "1");
  if (v == "1") return ContextOrder::Overlapped;
  if (v == "0") return ContextOrder::Sequential;
  user_error(
      "TANDEM_CP_OVERLAP={}: give 1 (context parallelism's exchanges overlap its products, the "
      "default) or 0 (they run before and after them)",
      v);
}

namespace {

// The rank's piece of the exchanges: (B, Tl, 2K) floats.
int64_t piece_floats(const ContextSplit& s, int B, int KVH, int HS) {
  return static_cast<int64_t>(B) * s.tokens() * 2 * KVH * HS;
}

// The overlapped and ring orders' partial output and log-sum-exp: (B, Tl, NH*HS) + (B, NH, Tl)
// floats.
int64_t part_floats(const ContextSplit& s, int B, int NH, int HS, ContextOrder order) {
  if (order == ContextOrder::Sequential || s.cp == 1) return 0;
  return static_cast<int64_t>(B) * s.tokens() * NH * (HS + 1);
}

// The pieces' worth of floats the order holds besides its partial output and the scratch.
int64_t held_pieces(const ContextSplit& s, ContextOrder order) {
  if (order == ContextOrder::Ring) return s.cp > 1 ? 5 : 2;
  return 1 + 3 * int64_t{s.cp};
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

ContextParallelAttention::ContextParallelAttention(
    comm::Communicator& group, const ContextSplit& split, int B, int NH, int KVH, int HS,
    const ContextSchedules& schedules, exec::RunnerKind executor, const nn::FlashBlocks& blocks)
    : split_(split),
      order_(schedules.order),
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
                      schedules.reduce.chunk_bytes),
      ring_program_(dsl::workloads::kv_ring(), schedules.ring.names, executor,
                    schedules.ring.chunk_bytes) {
  TANDEM_CHECK(
      group.size() == split.cp && group.rank() == split.rank,
      "context-parallel attention split over {} ranks (rank {}) on a group of {} (rank {})",
      split.cp, split.rank, group.size(), group.rank());
  TANDEM_CHECK(B >= 1 && NH >= 1 && KVH >= 1 && NH % KVH == 0 && HS >= 1,
               "context-parallel attention of {} samples, {} heads, {} key/value heads of {}", B,
               NH, KVH, HS);
  const int64_t piece = piece_floats(split, B, KVH, HS), whole = piece * split.cp;
  // Sequential, or one rank: an empty part_ (a default Tensor would be a scalar).
  part_ = Tensor::empty(DType::F32, Shape{part_floats(split, B, NH, HS, order_)});
  scratch_ =
      Tensor::empty(DType::F32, Shape{nn::flash_attention_scratch_floats(rows_, HS, blocks)});
  if (order_ == ContextOrder::Ring) {
    // Two pieces of keys and values and two accumulators passed round, one step's gradient; one
    // rank keeps its own piece and its gradient.
    const bool passes = split.cp > 1;
    for (int i = 0; i < 2; ++i) {
      kv_blocks_[i] = Tensor::empty(DType::F32, Shape{i == 0 || passes ? piece : 0});
      dkv_blocks_[i] = Tensor::empty(DType::F32, Shape{i == 0 || passes ? piece : 0});
    }
    dkv_step_ = Tensor::empty(DType::F32, Shape{passes ? piece : 0});
    if (passes) {
      const dsl::SymbolMap n = {{"N", piece}};
      for (int i = 0; i < 2; ++i) {
        ring_kv_[i] = ring_program_.prepare(group, n, {"kv", "kv_next"});
        ring_kv_[i]->bind("kv", kv_blocks_[i]);
        ring_kv_[i]->bind("kv_next", kv_blocks_[1 - i]);
        ring_d_[i] = ring_program_.prepare(group, n, {"kv", "kv_next"});
        ring_d_[i]->bind("kv", dkv_blocks_[i]);
        ring_d_[i]->bind("kv_next", dkv_blocks_[1 - i]);
      }
    }
  } else {
    mine_ = Tensor::empty(DType::F32, Shape{piece});
    ranked_ = Tensor::empty(DType::F32, Shape{whole});
    kv_ = Tensor::empty(DType::F32, Shape{whole});
    dkv_ = Tensor::empty(DType::F32, Shape{whole});
    const dsl::SymbolMap n = {{"N", whole}};
    gather_ = gather_program_.prepare(group, n, {"kv", "kv_all"});
    gather_->bind("kv", mine_);
    gather_->bind("kv_all", ranked_);
    // The reduction's input is the gathered keys' buffer, free by then; its output the rank's own.
    reduce_ = reduce_program_.prepare(group, n, {"dkv", "dkv_mine"});
    reduce_->bind("dkv", ranked_);
    reduce_->bind("dkv_mine", mine_);
  }
  // The data-parallel exchange's thread may call MPI at the same time.
  if (order_ != ContextOrder::Sequential && split.cp > 1 &&
      comm::communication_thread_allowed(group, /*others_communicate=*/true))
    worker_ = std::make_unique<SerialWorker>("tandem-cp-comm");
}

ContextParallelAttention::~ContextParallelAttention() = default;

uint64_t ContextParallelAttention::buffer_bytes(const ContextSplit& split, int B, int NH, int KVH,
                                                int HS, const nn::FlashBlocks& blocks,
                                                ContextOrder order) {
  const std::vector<int> positions = split.positions();
  const nn::AttentionRows rows{split.tokens(), split.T, positions.data()};
  const auto piece = static_cast<uint64_t>(piece_floats(split, B, KVH, HS));
  const auto scratch = static_cast<uint64_t>(nn::flash_attention_scratch_floats(rows, HS, blocks));
  const auto part = static_cast<uint64_t>(part_floats(split, B, NH, HS, order));
  const auto pieces = static_cast<uint64_t>(held_pieces(split, order));
  return (pieces * piece + part + scratch) * sizeof(float);
}

size_t ContextParallelAttention::allocated_bytes() const {
  size_t n = mine_.nbytes() + ranked_.nbytes() + kv_.nbytes() + dkv_.nbytes() + part_.nbytes() +
             scratch_.nbytes() + dkv_step_.nbytes();
  for (int i = 0; i < 2; ++i) n += kv_blocks_[i].nbytes() + dkv_blocks_[i].nbytes();
  for (const exec::Runner* r : {gather_.get(), reduce_.get(), ring_kv_[0].get(), ring_kv_[1].get(),
                                ring_d_[0].get(), ring_d_[1].get()})
    if (r != nullptr) n += r->allocated_bytes();
  return n;
}

namespace {

// A rank's piece (B, Tl, W) (of `theirs`) <-> its chunks' rows of a (B, T, W) buffer.
void piece_to_sequence(float* seq, const float* piece, const ContextSplit& theirs, int B, int W) {
  const int Tl = theirs.tokens(), T = theirs.T;
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < 2; ++c)
      std::memcpy(seq + (static_cast<int64_t>(b) * T + theirs.chunk_start(c)) * W,
                  piece + (static_cast<int64_t>(b) * Tl + c * theirs.chunk()) * W,
                  sizeof(float) * theirs.chunk() * W);
}
void sequence_to_piece(float* piece, const float* seq, const ContextSplit& theirs, int B, int W) {
  const int Tl = theirs.tokens(), T = theirs.T;
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < 2; ++c)
      std::memcpy(piece + (static_cast<int64_t>(b) * Tl + c * theirs.chunk()) * W,
                  seq + (static_cast<int64_t>(b) * T + theirs.chunk_start(c)) * W,
                  sizeof(float) * theirs.chunk() * W);
}

// Rank r's piece of a (cp, B, Tl, W) buffer.
template <typename F>
F* piece_of(F* ranked, int r, int B, int Tl, int W) {
  return ranked + static_cast<int64_t>(r) * B * Tl * W;
}

}  // namespace

void ContextParallelAttention::copy_mine(float* piece, const float* qkv) const {
  const int Tl = split_.tokens(), W = 2 * KVH_ * HS_;
  const int64_t C3 = static_cast<int64_t>(NH_ + 2 * KVH_) * HS_, q_cols = int64_t{NH_} * HS_;
  for (int64_t row = 0; row < static_cast<int64_t>(B_) * Tl; ++row)  // the k and v columns
    std::memcpy(piece + row * W, qkv + row * C3 + q_cols, sizeof(float) * W);
}

void ContextParallelAttention::stage_mine(const float* qkv) {
  copy_mine(mine_.data_as<float>(), qkv);
  piece_to_sequence(kv_.data_as<float>(), mine_.data_as<float>(), split_, B_, 2 * KVH_ * HS_);
}

void ContextParallelAttention::place_others() {
  const int Tl = split_.tokens(), W = 2 * KVH_ * HS_;
  for (int r = 0; r < split_.cp; ++r)
    if (r != split_.rank)
      piece_to_sequence(kv_.data_as<float>(), piece_of(ranked_.data_as<float>(), r, B_, Tl, W),
                        ContextSplit(split_.T, split_.cp, r), B_, W);
}

void ContextParallelAttention::gather(const float* qkv) {
  stage_mine(qkv);
  const auto began = std::chrono::steady_clock::now();
  gather_->run();
  const double ran = seconds_since(began);
  times_.exchanged_s += ran;
  times_.waited_s += ran;
  place_others();
}

void ContextParallelAttention::start(exec::Runner& exchange) {
  const auto run = [this, &exchange] {
    const auto began = std::chrono::steady_clock::now();
    exchange.run();
    ran_s_ += seconds_since(began);
  };
  if (worker_ == nullptr)
    run();
  else
    ticket_ = worker_->submit(run);
}

void ContextParallelAttention::finish() {
  const auto began = std::chrono::steady_clock::now();
  if (worker_ != nullptr) worker_->wait_for(ticket_);
  times_.waited_s += worker_ != nullptr ? seconds_since(began) : ran_s_;
  times_.exchanged_s += ran_s_;
  ran_s_ = 0.0;
}

nn::AttentionRows ContextParallelAttention::keys(int first, int count) const {
  nn::AttentionRows r = rows_;
  r.key_first = first;
  r.key_count = count;
  return r;
}

std::vector<ContextParallelAttention::PieceKeys> ContextParallelAttention::piece_keys(
    int owner, bool apart) const {
  const ContextSplit theirs(split_.T, split_.cp, owner);
  const int ch = split_.chunk(), early = theirs.chunk_start(0), late = theirs.chunk_start(1);
  std::vector<PieceKeys> out;
  const auto add = [&](int first, int count, int piece_row) {
    if (first > positions_.back()) return;  // above every row's diagonal
    nn::AttentionRows r = keys(first, count);
    r.kv_rows = split_.tokens();
    r.kv_first = first;
    out.push_back({r, piece_row});
  };
  if (early + ch == late && !apart) {
    add(early, 2 * ch, 0);
  } else {
    add(early, ch, 0);
    add(late, ch, ch);
  }
  return out;
}

void ContextParallelAttention::forward(float* out, float* lse, const float* qkv,
                                       const nn::AttentionDropout& drop) {
  if (order_ == ContextOrder::Ring) return forward_ring(out, lse, qkv, drop);
  if (overlapped()) return forward_overlapped(out, lse, qkv, drop);
  gather(qkv);
  nn::flash_attention_forward(out, lse, scratch_.data_as<float>(), qkv, kv_.data_as<float>(), rows_,
                              B_, NH_, KVH_, HS_, drop, blocks_);
}

void ContextParallelAttention::backward(float* dqkv, const float* dout, const float* qkv,
                                        const float* out, const float* lse,
                                        const nn::AttentionDropout& drop) {
  if (order_ == ContextOrder::Ring) return backward_ring(dqkv, dout, qkv, out, lse, drop);
  if (overlapped()) return backward_overlapped(dqkv, dout, qkv, out, lse, drop);
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
  for (int r = 0; r < split_.cp; ++r)
    sequence_to_piece(piece_of(ranked_.data_as<float>(), r, B_, Tl, W), dkv,
                      ContextSplit(T, split_.cp, r), B_, W);
  const auto began = std::chrono::steady_clock::now();
  reduce_->run();
  const double ran = seconds_since(began);
  times_.exchanged_s += ran;
  times_.waited_s += ran;
  const int64_t C3 = static_cast<int64_t>(NH_ + 2 * KVH_) * HS_, q_cols = int64_t{NH_} * HS_;
  const float* mine = mine_.data_as<float>();
  for (int64_t row = 0; row < static_cast<int64_t>(B_) * Tl; ++row) {
    float* d = dqkv + row * C3 + q_cols;
    const float* g = mine + row * W;
    for (int j = 0; j < W; ++j) d[j] += g[j];
  }
}

// The overlapped forward (see the header): the gather on the thread while the rank's queries meet
// its own keys, then the others'. The first call writes out and lse; each later one writes part_
// and is merged in.
void ContextParallelAttention::forward_overlapped(float* out, float* lse, const float* qkv,
                                                  const nn::AttentionDropout& drop) {
  const int ch = split_.chunk(), early = split_.chunk_start(0), late = split_.chunk_start(1);
  float* part_out = part_.data_as<float>();
  float* part_lse = part_out + static_cast<int64_t>(B_) * split_.tokens() * NH_ * HS_;
  bool first = true;
  const auto against = [&](int from, int to) {  // the rank's rows against keys [from, to)
    if (to <= from) return;
    nn::flash_attention_forward(first ? out : part_out, first ? lse : part_lse,
                                scratch_.data_as<float>(), qkv, kv_.data_as<float>(),
                                keys(from, to - from), B_, NH_, KVH_, HS_, drop, blocks_);
    if (!first)
      nn::flash_attention_merge(out, lse, part_out, part_lse, B_, split_.tokens(), NH_, HS_);
    first = false;
  };
  stage_mine(qkv);
  start(*gather_);
  // Its own chunks (one range where they meet, on the middle rank); the early chunk first: every
  // row sees it.
  if (early + ch == late) {
    against(early, late + ch);
  } else {
    against(early, early + ch);
    against(late, late + ch);
  }
  finish();
  place_others();
  // The others' keys its rows see: before its early chunk, and between its chunks (past its late
  // chunk, none).
  against(0, early);
  against(early + ch, late);
}

// The overlapped backward (see the header). dkv_ gathers this rank's queries' gradient of every
// key; the other ranks' chunks of it go to the reduce-scatter (this rank's own piece of ranked_
// zero), its own chunks are added to what comes back.
void ContextParallelAttention::backward_overlapped(float* dqkv, const float* dout, const float* qkv,
                                                   const float* out, const float* lse,
                                                   const nn::AttentionDropout& drop) {
  const int Tl = split_.tokens(), T = split_.T, W = 2 * KVH_ * HS_, ch = split_.chunk();
  float* dkv = dkv_.data_as<float>();
  const auto against = [&](int from, int to) {  // the gradient through keys [from, to)
    if (to <= from) return;
    nn::flash_attention_backward(dqkv, dkv, scratch_.data_as<float>(), dout, qkv,
                                 kv_.data_as<float>(), out, lse, keys(from, to - from), B_, NH_,
                                 KVH_, HS_, drop, blocks_);
  };
  stage_mine(qkv);
  start(*gather_);
  std::fill(dkv, dkv + dkv_.numel(), 0.0f);
  const int early = split_.chunk_start(0), late = split_.chunk_start(1);
  against(late, late + ch);  // its late chunk's keys: the diagonal block only
  finish();
  place_others();
  against(0, early);
  against(early + ch, late);
  float* ranked = ranked_.data_as<float>();
  for (int r = 0; r < split_.cp; ++r)
    if (r != split_.rank)
      sequence_to_piece(piece_of(ranked, r, B_, Tl, W), dkv, ContextSplit(T, split_.cp, r), B_, W);
  std::fill_n(piece_of(ranked, split_.rank, B_, Tl, W), static_cast<int64_t>(B_) * Tl * W, 0.0f);
  start(*reduce_);
  against(early, early + ch);  // its early chunk's keys: seen by all its rows
  finish();
  // dqkv's k and v columns += the others' part (mine_) + this rank's own (its chunks of dkv_).
  const int64_t C3 = static_cast<int64_t>(NH_ + 2 * KVH_) * HS_, q_cols = int64_t{NH_} * HS_;
  const float* mine = mine_.data_as<float>();
  for (int b = 0; b < B_; ++b)
    for (int r = 0; r < Tl; ++r) {
      const int64_t row = static_cast<int64_t>(b) * Tl + r;
      float* d = dqkv + row * C3 + q_cols;
      const float* g = mine + row * W;
      const float* own = dkv + (static_cast<int64_t>(b) * T + split_.position(r)) * W;
      for (int j = 0; j < W; ++j) d[j] += g[j] + own[j];
    }
}

// The ring forward (see the header): step s multiplies the piece of rank (rank - s) mod cp (its
// own first) while the shift hands that piece on and brings the next; cp - 1 shifts. The first
// product writes out and lse; each later one writes part_ and is merged in.
void ContextParallelAttention::forward_ring(float* out, float* lse, const float* qkv,
                                            const nn::AttentionDropout& drop) {
  const int cp = split_.cp, W = 2 * KVH_ * HS_;
  // One rank makes one call (its chunks are adjacent): no partial result.
  float* part_out = part_.data_as<float>();
  float* part_lse =
      cp == 1 ? nullptr : part_out + static_cast<int64_t>(B_) * split_.tokens() * NH_ * HS_;
  copy_mine(kv_blocks_[0].data_as<float>(), qkv);
  bool first = true;
  for (int s = 0; s < cp; ++s) {
    const int cur = s % 2, owner = (split_.rank - s + cp) % cp;
    if (s + 1 < cp) start(*ring_kv_[cur]);
    // Its early chunk first: on the rank's own piece every row sees it.
    for (const PieceKeys& k : piece_keys(owner)) {
      const float* kv = kv_blocks_[cur].data_as<float>() + static_cast<int64_t>(k.piece_row) * W;
      nn::flash_attention_forward(first ? out : part_out, first ? lse : part_lse,
                                  scratch_.data_as<float>(), qkv, kv, k.rows, B_, NH_, KVH_, HS_,
                                  drop, blocks_);
      if (!first)
        nn::flash_attention_merge(out, lse, part_out, part_lse, B_, split_.tokens(), NH_, HS_);
      first = false;
    }
    if (s + 1 < cp) finish();
  }
}

// The ring backward (see the header). Step s: the piece of rank (rank - s) mod cp is in
// kv_blocks_[s % 2] and its accumulator arrives in dkv_blocks_[s % 2] (started at the end of step
// s - 1); the next piece's shift starts; this rank's queries' gradient of the piece's keys goes
// into dkv_step_ (step 0: straight into the accumulator), added once both shifts are done; then
// the accumulator leaves for the next rank. Step 0 multiplies only the rank's early chunk: its
// late chunk (the causal diagonal) is multiplied while the last shift brings the rank's own
// accumulator home, so no shift is waited for with nothing behind it.
void ContextParallelAttention::backward_ring(float* dqkv, const float* dout, const float* qkv,
                                             const float* out, const float* lse,
                                             const nn::AttentionDropout& drop) {
  const int cp = split_.cp, Tl = split_.tokens(), W = 2 * KVH_ * HS_;
  // The gradient through one call's keys, read from `piece`, into `dpiece` (both (B, Tl, W)).
  const auto product = [&](const PieceKeys& k, const Tensor& piece, Tensor& dpiece) {
    const int64_t at = static_cast<int64_t>(k.piece_row) * W;
    nn::flash_attention_backward(dqkv, dpiece.data_as<float>() + at, scratch_.data_as<float>(),
                                 dout, qkv, piece.data_as<float>() + at, out, lse, k.rows, B_, NH_,
                                 KVH_, HS_, drop, blocks_);
  };
  const auto zero = [](Tensor& t) { std::fill_n(t.data_as<float>(), t.numel(), 0.0f); };
  // dqkv's k and v columns += a (+ b: the own late chunk's, with cp > 1).
  const auto add = [&](const Tensor& a, const Tensor* b) {
    const int64_t C3 = static_cast<int64_t>(NH_ + 2 * KVH_) * HS_, q_cols = int64_t{NH_} * HS_;
    for (int64_t row = 0; row < static_cast<int64_t>(B_) * Tl; ++row) {
      float* d = dqkv + row * C3 + q_cols;
      const float* g = a.data_as<float>() + row * W;
      if (b == nullptr) {
        for (int j = 0; j < W; ++j) d[j] += g[j];
      } else {
        const float* own = b->data_as<float>() + row * W;
        for (int j = 0; j < W; ++j) d[j] += g[j] + own[j];
      }
    }
  };
  copy_mine(kv_blocks_[0].data_as<float>(), qkv);
  if (cp == 1) {  // no ring: its own piece, one call (its chunks are adjacent)
    zero(dkv_blocks_[0]);
    for (const PieceKeys& k : piece_keys(0)) product(k, kv_blocks_[0], dkv_blocks_[0]);
    return add(dkv_blocks_[0], nullptr);
  }
  const std::vector<PieceKeys> own = piece_keys(split_.rank, /*apart=*/true);  // early, late
  for (int s = 0; s < cp; ++s) {
    const int cur = s % 2, owner = (split_.rank - s + cp) % cp;
    if (s + 1 < cp) start(*ring_kv_[cur]);
    Tensor& into = s == 0 ? dkv_blocks_[0] : dkv_step_;
    zero(into);
    if (s == 0)
      product(own[0], kv_blocks_[0], into);  // the late chunk's rows leave as zeros
    else
      for (const PieceKeys& k : piece_keys(owner)) product(k, kv_blocks_[cur], into);
    finish();  // the next piece (but after the last), and this one's accumulator (but at step 0)
    if (s > 0) {
      float* acc = dkv_blocks_[cur].data_as<float>();
      const float* step = dkv_step_.data_as<float>();
      for (int64_t i = 0; i < dkv_step_.numel(); ++i) acc[i] += step[i];
    }
    start(*ring_d_[cur]);  // this accumulator on to the next rank, the previous rank's in
  }
  // While the last shift brings this rank's accumulator home (into dkv_blocks_[cp % 2]): its late
  // chunk, its piece copied again into the key buffer the shifts are done with.
  copy_mine(kv_blocks_[cp % 2].data_as<float>(), qkv);
  zero(dkv_step_);
  product(own[1], kv_blocks_[cp % 2], dkv_step_);
  finish();  // the accumulator of this rank's piece, from every other rank
  add(dkv_blocks_[cp % 2], &dkv_step_);
}

}  // namespace tandem::parallel
