// Causal multi-head self-attention over a fused QKV input: per-head f32 GEMMs (core/gemm.h),
// softmax saved for the backward pass, attention dropout drawn from the counter-based RNG.
#include <algorithm>
#include <cmath>
#include <optional>
#include <thread>

#include "tandem/core/blas.h"
#include "tandem/core/error.h"
#include "tandem/core/gemm.h"
#include "tandem/core/parallel.h"
#include "tandem/nn/layers.h"
#include "vec.h"

namespace tandem::nn {
namespace {

// Query rows are processed in chunks of this many: a chunk's keys stop at its last row, so the
// GEMMs skip most of the masked upper triangle (for T = 128, 62% of the full square's work)
// while each call stays large enough for BLAS to run at speed.
constexpr int kCausalRows = 32;

// row (n) <- softmax(row) in place, n >= 1.
void softmax_row(float* __restrict row, int n) {
  const float m = detail::lane_max(row, n);
  for (int j = 0; j < n; ++j) row[j] = detail::exp_approx(row[j] - m);
  const float inv = 1.0f / detail::lane_sum(row, n);
  for (int j = 0; j < n; ++j) row[j] *= inv;
}

// pd (n) <- att (n) * dropout mask of row i, drawn at indices base + i * T + j.
void dropped_row(float* __restrict pd, const float* __restrict att, int n, int i, int T,
                 int64_t base, const AttentionDropout& drop) {
  dropout_mask(pd, n, Dropout{drop.p, drop.key, base + static_cast<int64_t>(i) * T});
  for (int j = 0; j < n; ++j) pd[j] *= att[j];
}

// Runs head(b, h, scratch) for every (sample, head) pair, the pairs split into contiguous runs
// over the threads, each thread with its own scratch_floats of scratch. Pairs write disjoint
// memory (their own rows of out/att, their own head's columns of dqkv), so any split gives
// bitwise the same result.
template <typename Head>
void for_each_head(int B, int NH, float* scratch, int64_t scratch_floats, const Head& head) {
  const int64_t pairs = static_cast<int64_t>(B) * NH;
  const int parts =
      static_cast<int>(std::min<int64_t>({parallel_width(), attention_max_threads(), pairs}));
  // Each part's GEMMs on its own thread (see blas::OnCallingThread); not needed for one part.
  std::optional<blas::OnCallingThread> serial;
  if (parts > 1) serial.emplace();
  parallel_parts(parts, [&](int part) {
    float* mine = scratch + part * scratch_floats;
    for (int64_t pair = pairs * part / parts; pair < pairs * (part + 1) / parts; ++pair)
      head(static_cast<int>(pair / NH), static_cast<int>(pair % NH), mine);
  });
}

void check_heads(int NH, int KVH) {
  TANDEM_CHECK(NH >= 1 && KVH >= 1 && NH % KVH == 0,
               "attention over {} query heads and {} key/value heads", NH, KVH);
}

}  // namespace

int attention_max_threads() {
  static const int n = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 8);
  return n;
}

int64_t attention_scratch_floats(int T) {
  return 2 * static_cast<int64_t>(T) * T * attention_max_threads();
}

// out (B, T, NH*HS), att (B, NH, T, T) <- qkv (B, T, (NH + 2*KVH)*HS)
void attention_forward(float* out, float* att, float* scratch, const float* qkv, int B, int T,
                       int NH, int KVH, int HS, const AttentionDropout& drop) {
  check_heads(NH, KVH);
  const int C = NH * HS, C3 = (NH + 2 * KVH) * HS, group = NH / KVH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  // Every (sample, query head) writes its own rows of out and att: any split of them is exact.
  for_each_head(B, NH, scratch, 2 * static_cast<int64_t>(T) * T, [&](int b, int h, float* mine) {
    float* pdrop = mine;  // (T, T) the dropped probabilities of one head
    const float* row0 = qkv + static_cast<int64_t>(b) * T * C3;
    const float* q = row0 + h * HS;                // (T, HS), row stride C3
    const float* k = row0 + C + (h / group) * HS;  // the head's key/value head
    const float* v = k + static_cast<int64_t>(KVH) * HS;
    float* a = att + (static_cast<int64_t>(b) * NH + h) * T * T;  // (T, T)
    float* y = out + static_cast<int64_t>(b) * T * C + h * HS;    // (T, HS), row stride C
    const int64_t base = drop.active() ? drop.head_base(b, h, NH, T) : 0;
    for (int i0 = 0; i0 < T; i0 += kCausalRows) {
      const int i1 = std::min(T, i0 + kCausalRows);
      const int rows = i1 - i0;
      // preatt[i0:i1, 0:i1] (rows, i1) = q[i0:i1] @ k[0:i1]^T * scale
      gemm(false, true, rows, i1, HS, scale, q + static_cast<int64_t>(i0) * C3, C3, k, C3, 0.0f,
           a + static_cast<int64_t>(i0) * T, T);
      for (int i = i0; i < i1; ++i) {
        float* row = a + static_cast<int64_t>(i) * T;
        softmax_row(row, i + 1);
        std::fill(row + i + 1, row + T, 0.0f);  // causal mask: the saved att is exactly zero
        if (drop.active()) {
          float* pd = pdrop + static_cast<int64_t>(i) * T;
          dropped_row(pd, row, i + 1, i, T, base, drop);
          std::fill(pd + i + 1, pd + i1, 0.0f);
        }
      }
      const float* p = drop.active() ? pdrop : a;
      // y[i0:i1] (rows, HS) = p[i0:i1, 0:i1] @ v[0:i1]
      gemm(false, false, rows, HS, i1, 1.0f, p + static_cast<int64_t>(i0) * T, T, v, C3, 0.0f,
           y + static_cast<int64_t>(i0) * C, C);
    }
  });
}

// dqkv (B, T, (NH + 2*KVH)*HS) += backward of attention_forward for dout (B, T, NH*HS)
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int NH, int KVH, int HS,
                        const AttentionDropout& drop) {
  check_heads(NH, KVH);
  const int C = NH * HS, C3 = (NH + 2 * KVH) * HS, group = NH / KVH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  // The query heads sharing a key/value head add into its dk and dv: they run one after another
  // on one thread, in head order, so the sums are exact at any thread count.
  for_each_head(B, KVH, scratch, 2 * static_cast<int64_t>(T) * T, [&](int b, int g, float* mine) {
    for (int h = g * group; h < (g + 1) * group; ++h) {
      float* datt = mine;                                 // (T, T) d(att), then d(preatt)
      float* pdrop = mine + static_cast<int64_t>(T) * T;  // (T, T) the dropped probabilities
      const int64_t row0 = static_cast<int64_t>(b) * T * C3;
      const float* q = qkv + row0 + h * HS;
      const float* k = qkv + row0 + C + g * HS;
      const float* v = k + static_cast<int64_t>(KVH) * HS;
      float* dq = dqkv + row0 + h * HS;
      float* dk = dqkv + row0 + C + g * HS;
      float* dv = dk + static_cast<int64_t>(KVH) * HS;
      const float* a = att + (static_cast<int64_t>(b) * NH + h) * T * T;
      const float* dy = dout + static_cast<int64_t>(b) * T * C + h * HS;
      const int64_t base = drop.active() ? drop.head_base(b, h, NH, T) : 0;
      for (int i0 = 0; i0 < T; i0 += kCausalRows) {
        const int i1 = std::min(T, i0 + kCausalRows);
        const int rows = i1 - i0;
        float* dc = datt + static_cast<int64_t>(i0) * T;
        // d(dropped att)[i0:i1, 0:i1] = dy[i0:i1] @ v[0:i1]^T
        gemm(false, true, rows, i1, HS, 1.0f, dy + static_cast<int64_t>(i0) * C, C, v, C3, 0.0f, dc,
             T);
        const float* p = a;
        if (drop.active()) {
          for (int i = i0; i < i1; ++i) {
            float* pd = pdrop + static_cast<int64_t>(i) * T;
            float* d = datt + static_cast<int64_t>(i) * T;
            // The mask once, for both uses: d(att) = d(dropped) * mask; dropped = att * mask.
            dropout_mask(pd, i + 1, Dropout{drop.p, drop.key, base + static_cast<int64_t>(i) * T});
            for (int j = 0; j <= i; ++j) d[j] *= pd[j];
            const float* ar = a + static_cast<int64_t>(i) * T;
            for (int j = 0; j <= i; ++j) pd[j] *= ar[j];
            std::fill(pd + i + 1, pd + i1, 0.0f);
          }
          p = pdrop;
        }
        // dv[0:i1] (i1, HS) += p[i0:i1, 0:i1]^T @ dy[i0:i1]
        gemm(true, false, i1, HS, rows, 1.0f, p + static_cast<int64_t>(i0) * T, T,
             dy + static_cast<int64_t>(i0) * C, C, 1.0f, dv, C3);
        // Softmax backward per row: dpre_j = att_j (datt_j - sum_k att_k datt_k), zero above i.
        for (int i = i0; i < i1; ++i) {
          const float* ar = a + static_cast<int64_t>(i) * T;
          float* __restrict d = datt + static_cast<int64_t>(i) * T;
          const float dot = detail::lane_dot(ar, d, i + 1);
          for (int j = 0; j <= i; ++j) d[j] = ar[j] * (d[j] - dot);
          std::fill(d + i + 1, d + i1, 0.0f);
        }
        // dq[i0:i1] += dpre[i0:i1, 0:i1] @ k[0:i1] * scale
        gemm(false, false, rows, HS, i1, scale, dc, T, k, C3, 1.0f,
             dq + static_cast<int64_t>(i0) * C3, C3);
        // dk[0:i1] += dpre[i0:i1, 0:i1]^T @ q[i0:i1] * scale
        gemm(true, false, i1, HS, rows, scale, dc, T, q + static_cast<int64_t>(i0) * C3, C3, 1.0f,
             dk, C3);
      }
    }
  });
}

}  // namespace tandem::nn
