// Fused, blocked causal attention ("flash" style): an online softmax over key blocks, only the
// per-row log-sum-exp saved, the scores recomputed block by block in the backward.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <optional>

#include "tandem/core/bf16.h"
#include "tandem/core/blas.h"
#include "tandem/core/error.h"
#include "tandem/core/gemm.h"
#include "tandem/core/parallel.h"
#include "tandem/nn/layers.h"
#include "vec.h"

namespace tandem::nn {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Keys of block [j0, j0 + cols) that query row i sees (j <= i): 0 .. cols.
int visible(int i, int j0, int cols) { return std::clamp(i + 1 - j0, 0, cols); }

// pd (n) <- p (n) * the dropout mask of row i's keys j0 .. j0 + n - 1.
void drop_row(float* __restrict pd, const float* __restrict p, int n, int i, int j0, int T,
              int64_t base, const AttentionDropout& drop) {
  dropout_mask(pd, n, Dropout{drop.p, drop.key, base + static_cast<int64_t>(i) * T + j0});
  for (int j = 0; j < n; ++j) pd[j] *= p[j];
}

// Runs task(t, scratch) for t in [0, tasks), handed out in order to whichever thread is free
// (a shared counter), each thread with its own scratch_floats of scratch. Tasks write disjoint
// memory and none reads another's output, so which thread ran a task changes no bit.
template <typename Task>
void for_each_task(int64_t tasks, float* scratch, int64_t scratch_floats, const Task& task) {
  const int parts =
      static_cast<int>(std::min<int64_t>({parallel_width(), attention_max_threads(), tasks}));
  if (parts <= 0) return;
  // Each part's GEMMs on its own thread (see blas::OnCallingThread); not needed for one part.
  std::optional<blas::OnCallingThread> serial;
  if (parts > 1) serial.emplace();
  std::atomic<int64_t> next{0};
  parallel_parts(parts, [&](int part) {
    float* mine = scratch + part * scratch_floats;
    for (int64_t t = next.fetch_add(1); t < tasks; t = next.fetch_add(1)) task(t, mine);
  });
}

void check_args(int NH, int KVH, const FlashBlocks& blocks, DType products) {
  TANDEM_CHECK(NH >= 1 && KVH >= 1 && NH % KVH == 0,
               "attention over {} query heads and {} key/value heads", NH, KVH);
  TANDEM_CHECK(blocks.rows >= 1 && blocks.cols >= 1, "flash attention blocks {} x {}", blocks.rows,
               blocks.cols);
  TANDEM_CHECK(products == DType::F32 || products == DType::BF16,
               "flash attention's block products in {}", dtype_name(products));
}

// dst (rows, n), rows `ld` apart <- bf16 of src (rows, n), rows `lds` apart.
void rows_to_bf16(bf16* dst, int64_t ld, const float* src, int64_t lds, int rows, int n) {
  for (int r = 0; r < rows; ++r) to_bf16(src + r * lds, dst + r * ld, static_cast<size_t>(n));
}

// The bf16 operands of a thread's block products (products == BF16), after its f32 scratch:
// q and dout rows (rows, HS), k and v rows (cols, HS), probabilities and scores' gradients
// (rows, cols), each contiguous. Floats of it: half the bf16 values, rounded up.
struct HalfTiles {
  bf16 *q, *dy, *k, *v, *p, *ds;
};
int64_t half_floats(int HS, const FlashBlocks& k) {
  return (int64_t{2} * k.rows * HS + int64_t{2} * k.cols * HS + int64_t{2} * k.rows * k.cols + 1) /
         2;
}
HalfTiles half_tiles(float* at, int HS, const FlashBlocks& k) {
  // The tiles are only ever read and written as bf16.
  bf16* h = reinterpret_cast<bf16*>(at);
  HalfTiles t;
  t.q = h;
  t.dy = t.q + int64_t{k.rows} * HS;
  t.k = t.dy + int64_t{k.rows} * HS;
  t.v = t.k + int64_t{k.cols} * HS;
  t.p = t.v + int64_t{k.cols} * HS;
  t.ds = t.p + int64_t{k.rows} * k.cols;
  return t;
}

// The blocks a call runs: at most T a side, so that a short sequence needs no more scratch than
// its T x T tiles.
FlashBlocks clipped(const FlashBlocks& k, int T) {
  return {std::min(k.rows, std::max(T, 1)), std::min(k.cols, std::max(T, 1))};
}

int64_t forward_floats(int HS, const FlashBlocks& k) {
  return int64_t{2} * k.rows * k.cols + int64_t{k.rows} * HS + 2 * k.rows;
}
int64_t backward_floats(int T, const FlashBlocks& k) { return T + int64_t{3} * k.rows * k.cols; }
// A thread's f32 scratch, then (bf16 products) its HalfTiles.
int64_t f32_floats(int T, int HS, const FlashBlocks& blocks) {
  const FlashBlocks k = clipped(blocks, T);
  return std::max(forward_floats(HS, k), backward_floats(T, k));
}
int64_t thread_floats(int T, int HS, const FlashBlocks& blocks, DType products) {
  return f32_floats(T, HS, blocks) +
         (products == DType::BF16 ? half_floats(HS, clipped(blocks, T)) : 0);
}

}  // namespace

int64_t flash_attention_scratch_floats(int T, int HS, const FlashBlocks& blocks, DType products) {
  return thread_floats(T, HS, blocks, products) * attention_max_threads();
}

// out (B, T, NH*HS), lse (B, NH, T) <- qkv (B, T, (NH + 2*KVH)*HS)
void flash_attention_forward(float* out, float* lse, float* scratch, const float* qkv, int B, int T,
                             int NH, int KVH, int HS, const AttentionDropout& drop,
                             const FlashBlocks& blocks, DType products) {
  check_args(NH, KVH, blocks, products);
  const bool half = products == DType::BF16;
  const int C = NH * HS, C3 = (NH + 2 * KVH) * HS, group = NH / KVH;
  const int BR = clipped(blocks, T).rows, BC = clipped(blocks, T).cols;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int64_t heads = static_cast<int64_t>(B) * NH, query_blocks = (T + BR - 1) / BR;
  // Task t is query block query_blocks - 1 - t / heads of head t % heads: the causal mask gives
  // later blocks more keys, so the longest tasks go first and the last ones fill the gaps.
  for_each_task(
      heads * query_blocks, scratch, thread_floats(T, HS, blocks, products),
      [&](int64_t t, float* mine) {
        const int qb = static_cast<int>(query_blocks - 1 - t / heads);
        const int b = static_cast<int>(t % heads / NH), h = static_cast<int>(t % heads % NH);
        float* s = mine;                                  // (BR, BC) scores, then probabilities
        float* pd = s + static_cast<int64_t>(BR) * BC;    // (BR, BC) dropped probabilities
        float* acc = pd + static_cast<int64_t>(BR) * BC;  // (BR, HS) unnormalised output rows
        float* m = acc + static_cast<int64_t>(BR) * HS;   // (BR) running row maximum
        float* l = m + BR;                                // (BR) running row sum at that maximum
        const int i0 = qb * BR, i1 = std::min(T, i0 + BR), rows = i1 - i0;
        const float* row0 = qkv + static_cast<int64_t>(b) * T * C3;
        const float* q = row0 + static_cast<int64_t>(i0) * C3 + h * HS;  // (rows, HS), stride C3
        const float* k = row0 + C + (h / group) * HS;                    // (T, HS), stride C3
        const float* v = k + static_cast<int64_t>(KVH) * HS;
        const int64_t base = drop.active() ? drop.head_base(b, h, NH, T) : 0;
        const HalfTiles ht =
            half ? half_tiles(mine + f32_floats(T, HS, blocks), HS, {BR, BC}) : HalfTiles{};
        if (half) rows_to_bf16(ht.q, HS, q, C3, rows, HS);
        std::fill(m, m + rows, kNegInf);
        std::fill(l, l + rows, 0.0f);
        std::fill(acc, acc + static_cast<int64_t>(rows) * HS, 0.0f);
        // Key blocks up to the diagonal: the ones above it are never visited.
        for (int j0 = 0; j0 < i1; j0 += BC) {
          const int cols = std::min(i1, j0 + BC) - j0;
          // s (rows, cols) = q k[j0:j0+cols]^T * scale
          if (half) {
            rows_to_bf16(ht.k, HS, k + static_cast<int64_t>(j0) * C3, C3, cols, HS);
            rows_to_bf16(ht.v, HS, v + static_cast<int64_t>(j0) * C3, C3, cols, HS);
            gemm(false, true, rows, cols, HS, scale, ht.q, HS, ht.k, HS, 0.0f, s, BC);
          } else {
            gemm(false, true, rows, cols, HS, scale, q, C3, k + static_cast<int64_t>(j0) * C3, C3,
                 0.0f, s, BC);
          }
          for (int r = 0; r < rows; ++r) {
            const int i = i0 + r, n = visible(i, j0, cols);
            float* __restrict row = s + static_cast<int64_t>(r) * BC;
            float* __restrict pdr = pd + static_cast<int64_t>(r) * BC;
            if (n == 0) {  // every key of the block is above row i's diagonal
              std::fill(row, row + cols, 0.0f);
              if (drop.active()) std::fill(pdr, pdr + cols, 0.0f);
              continue;
            }
            // The online softmax: a new maximum rescales what was summed at the old one.
            const float mnew = std::max(m[r], detail::lane_max(row, n));
            const float corr = m[r] == kNegInf ? 0.0f : detail::exp_approx(m[r] - mnew);
            for (int j = 0; j < n; ++j) row[j] = detail::exp_approx(row[j] - mnew);
            std::fill(row + n, row + cols, 0.0f);
            l[r] = l[r] * corr + detail::lane_sum(row, n);
            m[r] = mnew;
            float* __restrict a = acc + static_cast<int64_t>(r) * HS;
            for (int d = 0; d < HS; ++d) a[d] *= corr;
            if (drop.active()) {
              drop_row(pdr, row, n, i, j0, T, base, drop);
              std::fill(pdr + n, pdr + cols, 0.0f);
            }
          }
          // acc (rows, HS) += p (rows, cols) @ v[j0:j0+cols]
          if (half) {
            rows_to_bf16(ht.p, cols, drop.active() ? pd : s, BC, rows, cols);
            gemm(false, false, rows, HS, cols, 1.0f, ht.p, cols, ht.v, HS, 1.0f, acc, HS);
          } else {
            gemm(false, false, rows, HS, cols, 1.0f, drop.active() ? pd : s, BC,
                 v + static_cast<int64_t>(j0) * C3, C3, 1.0f, acc, HS);
          }
        }
        // The block's output rows, once, and each row's log-sum-exp for the backward.
        float* y = out + (static_cast<int64_t>(b) * T + i0) * C + h * HS;  // (rows, HS), stride C
        float* lse_h = lse + (static_cast<int64_t>(b) * NH + h) * T + i0;
        for (int r = 0; r < rows; ++r) {
          const float inv = 1.0f / l[r];
          const float* a = acc + static_cast<int64_t>(r) * HS;
          float* yr = y + static_cast<int64_t>(r) * C;
          for (int d = 0; d < HS; ++d) yr[d] = a[d] * inv;
          lse_h[r] = m[r] + std::log(l[r]);
        }
      });
}

// dqkv (B, T, (NH + 2*KVH)*HS) += backward of flash_attention_forward for dout (B, T, NH*HS)
void flash_attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                              const float* out, const float* lse, int B, int T, int NH, int KVH,
                              int HS, const AttentionDropout& drop, const FlashBlocks& blocks,
                              DType products) {
  check_args(NH, KVH, blocks, products);
  const bool half = products == DType::BF16;
  const int C = NH * HS, C3 = (NH + 2 * KVH) * HS, group = NH / KVH;
  const int BR = clipped(blocks, T).rows, BC = clipped(blocks, T).cols;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  // One task a (sample, key/value head): the query heads sharing it add into its dk and dv one
  // after another on one thread, so no two threads write one head's gradients and the order of
  // every sum is fixed.
  for_each_task(
      static_cast<int64_t>(B) * KVH, scratch, thread_floats(T, HS, blocks, products),
      [&](int64_t t, float* mine) {
        const int b = static_cast<int>(t / KVH), g = static_cast<int>(t % KVH);
        float* dsum = mine;                             // (T) D_i = dout_i . out_i
        float* s = dsum + T;                            // (BR, BC) probabilities
        float* dp = s + static_cast<int64_t>(BR) * BC;  // (BR, BC) d(probabilities), then d(scores)
        float* pd = dp + static_cast<int64_t>(BR) * BC;  // (BR, BC) dropped probabilities
        const HalfTiles ht =
            half ? half_tiles(mine + f32_floats(T, HS, blocks), HS, {BR, BC}) : HalfTiles{};
        const int64_t row0 = static_cast<int64_t>(b) * T * C3;
        const float* k = qkv + row0 + C + g * HS;  // (T, HS), stride C3
        const float* v = k + static_cast<int64_t>(KVH) * HS;
        float* dk = dqkv + row0 + C + g * HS;
        float* dv = dk + static_cast<int64_t>(KVH) * HS;
        for (int h = g * group; h < (g + 1) * group; ++h) {
          const float* q = qkv + row0 + h * HS;
          float* dq = dqkv + row0 + h * HS;
          const float* dy = dout + static_cast<int64_t>(b) * T * C + h * HS;  // (T, HS), stride C
          const float* o = out + static_cast<int64_t>(b) * T * C + h * HS;
          const float* lse_h = lse + (static_cast<int64_t>(b) * NH + h) * T;
          const int64_t base = drop.active() ? drop.head_base(b, h, NH, T) : 0;
          // The softmax backward's row term sum_j p_ij dp_ij, which is dout_i . out_i (dropout
          // included: out_i = sum_j p_ij mask_ij v_j).
          for (int i = 0; i < T; ++i)
            dsum[i] = detail::lane_dot(dy + static_cast<int64_t>(i) * C,
                                       o + static_cast<int64_t>(i) * C, HS);
          for (int j0 = 0; j0 < T; j0 += BC) {
            const int cols = std::min(T, j0 + BC) - j0;
            const float* kj = k + static_cast<int64_t>(j0) * C3;
            const float* vj = v + static_cast<int64_t>(j0) * C3;
            if (half) {
              rows_to_bf16(ht.k, HS, kj, C3, cols, HS);
              rows_to_bf16(ht.v, HS, vj, C3, cols, HS);
            }
            // Query blocks from the one holding row j0: those before it see none of these keys.
            for (int i0 = j0 / BR * BR; i0 < T; i0 += BR) {
              const int rows = std::min(T, i0 + BR) - i0;
              const float* qi = q + static_cast<int64_t>(i0) * C3;
              const float* dyi = dy + static_cast<int64_t>(i0) * C;
              // s (rows, cols) = q_i k_j^T * scale, then p = exp(s - lse) below the diagonal;
              // dp (rows, cols) = dout_i v_j^T: the gradient of the dropped probabilities
              if (half) {
                rows_to_bf16(ht.q, HS, qi, C3, rows, HS);
                rows_to_bf16(ht.dy, HS, dyi, C, rows, HS);
                gemm(false, true, rows, cols, HS, scale, ht.q, HS, ht.k, HS, 0.0f, s, BC);
                gemm(false, true, rows, cols, HS, 1.0f, ht.dy, HS, ht.v, HS, 0.0f, dp, BC);
              } else {
                gemm(false, true, rows, cols, HS, scale, qi, C3, kj, C3, 0.0f, s, BC);
                gemm(false, true, rows, cols, HS, 1.0f, dyi, C, vj, C3, 0.0f, dp, BC);
              }
              for (int r = 0; r < rows; ++r) {
                const int i = i0 + r, n = visible(i, j0, cols);
                float* __restrict p = s + static_cast<int64_t>(r) * BC;
                float* __restrict d = dp + static_cast<int64_t>(r) * BC;
                const float m = lse_h[i];
                for (int j = 0; j < n; ++j) p[j] = detail::exp_approx(p[j] - m);
                std::fill(p + n, p + cols, 0.0f);
                if (drop.active()) {
                  // The mask once, for both uses: d(p) = d(dropped) * mask; dropped = p * mask.
                  float* __restrict pdr = pd + static_cast<int64_t>(r) * BC;
                  dropout_mask(pdr, n,
                               Dropout{drop.p, drop.key, base + static_cast<int64_t>(i) * T + j0});
                  for (int j = 0; j < n; ++j) d[j] *= pdr[j];
                  for (int j = 0; j < n; ++j) pdr[j] *= p[j];
                  std::fill(pdr + n, pdr + cols, 0.0f);
                }
              }
              // dv_j (cols, HS) += dropped p^T (cols, rows) @ dout_i (rows, HS)
              float* dvj = dv + static_cast<int64_t>(j0) * C3;
              if (half) {
                rows_to_bf16(ht.p, cols, drop.active() ? pd : s, BC, rows, cols);
                gemm(true, false, cols, HS, rows, 1.0f, ht.p, cols, ht.dy, HS, 1.0f, dvj, C3);
              } else {
                gemm(true, false, cols, HS, rows, 1.0f, drop.active() ? pd : s, BC, dyi, C, 1.0f,
                     dvj, C3);
              }
              // d(scores) = p (dp - D_i), zero above the diagonal
              for (int r = 0; r < rows; ++r) {
                const int n = visible(i0 + r, j0, cols);
                const float* __restrict p = s + static_cast<int64_t>(r) * BC;
                float* __restrict d = dp + static_cast<int64_t>(r) * BC;
                const float di = dsum[i0 + r];
                for (int j = 0; j < n; ++j) d[j] = p[j] * (d[j] - di);
                std::fill(d + n, d + cols, 0.0f);
              }
              // dq_i (rows, HS) += ds (rows, cols) @ k_j * scale;
              // dk_j (cols, HS) += ds^T (cols, rows) @ q_i * scale
              float* dqi = dq + static_cast<int64_t>(i0) * C3;
              float* dkj = dk + static_cast<int64_t>(j0) * C3;
              if (half) {
                rows_to_bf16(ht.ds, cols, dp, BC, rows, cols);
                gemm(false, false, rows, HS, cols, scale, ht.ds, cols, ht.k, HS, 1.0f, dqi, C3);
                gemm(true, false, cols, HS, rows, scale, ht.ds, cols, ht.q, HS, 1.0f, dkj, C3);
              } else {
                gemm(false, false, rows, HS, cols, scale, dp, BC, kj, C3, 1.0f, dqi, C3);
                gemm(true, false, cols, HS, rows, scale, dp, BC, qi, C3, 1.0f, dkj, C3);
              }
            }
          }
        }
      });
}

}  // namespace tandem::nn
