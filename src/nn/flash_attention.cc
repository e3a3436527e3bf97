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

// The blocks a call runs: at most Tq queries and Tk keys a side, so that a short sequence needs
// no more scratch than its Tq x Tk tiles.
FlashBlocks clipped(const FlashBlocks& k, int Tq, int Tk) {
  return {std::min(k.rows, std::max(Tq, 1)), std::min(k.cols, std::max(Tk, 1))};
}

int64_t forward_floats(int HS, const FlashBlocks& k) {
  return int64_t{2} * k.rows * k.cols + int64_t{k.rows} * HS + 2 * k.rows;
}
int64_t backward_floats(int Tq, const FlashBlocks& k) { return Tq + int64_t{3} * k.rows * k.cols; }
// A thread's f32 scratch, then (bf16 products) its HalfTiles.
int64_t f32_floats(int Tq, int Tk, int HS, const FlashBlocks& blocks) {
  const FlashBlocks k = clipped(blocks, Tq, Tk);
  return std::max(forward_floats(HS, k), backward_floats(Tq, k));
}
int64_t thread_floats(int Tq, int Tk, int HS, const FlashBlocks& blocks, DType products) {
  return f32_floats(Tq, Tk, HS, blocks) +
         (products == DType::BF16 ? half_floats(HS, clipped(blocks, Tq, Tk)) : 0);
}

// One call's operands: query rows (B, Tq, ldq), head h at column h * HS, and key and value rows
// (B, Tk, ldkv), key/value head g at column g * HS of k and of v; query row r sits at position
// pos[r] of the key sequence (ascending; null: pos[r] = r, with Tq = Tk) and sees keys 0 ..
// pos[r] of those the call reads, [key_lo, key_hi). The k and v buffers hold kv_rows rows a
// sample, row 0 at position kv_first (the whole sequence: Tk rows from 0). The gradients have the
// same layouts.
struct Operands {
  const float* q;
  int64_t ldq;
  const float* k;
  const float* v;
  int64_t ldkv;
  int Tq, Tk;
  const int* pos;
  int key_lo, key_hi;
  int64_t kv_rows;
  int kv_first;
  int at(int r) const { return pos != nullptr ? pos[r] : r; }
  // Offset of sample b's key key_lo in the k and v buffers (key j is (j - key_lo) rows on).
  int64_t first_key(int b) const {
    return (static_cast<int64_t>(b) * kv_rows + (key_lo - kv_first)) * ldkv;
  }
};

Operands fused_qkv(const float* qkv, int T, int NH, int KVH, int HS) {
  const int64_t C3 = int64_t{NH + 2 * KVH} * HS;
  const float* k = qkv + static_cast<int64_t>(NH) * HS;
  return {qkv, C3, k, k + static_cast<int64_t>(KVH) * HS, C3, T, T, nullptr, 0, T, T, 0};
}

Operands gathered_kv(const float* qkv, const float* kv, const AttentionRows& rows, int NH, int KVH,
                     int HS) {
  TANDEM_CHECK(rows.Tq >= 1 && rows.Tk >= 1 && rows.pos != nullptr,
               "attention rows: {} queries against {} keys", rows.Tq, rows.Tk);
  for (int r = 0; r < rows.Tq; ++r)
    TANDEM_CHECK(
        rows.pos[r] >= 0 && rows.pos[r] < rows.Tk && (r == 0 || rows.pos[r] > rows.pos[r - 1]),
        "attention rows: query row {} at position {} of {} keys (ascending)", r, rows.pos[r],
        rows.Tk);
  const int count = rows.key_count < 0 ? rows.Tk - rows.key_first : rows.key_count;
  TANDEM_CHECK(rows.key_first >= 0 && count >= 1 && rows.key_first + count <= rows.Tk,
               "attention rows: keys {} .. {} of {}", rows.key_first, rows.key_first + count - 1,
               rows.Tk);
  const int kv_rows = rows.kv_rows < 0 ? rows.Tk : rows.kv_rows;
  TANDEM_CHECK(rows.kv_first >= 0 && rows.kv_first <= rows.key_first &&
                   rows.key_first + count <= rows.kv_first + kv_rows,
               "attention rows: keys {} .. {} from a buffer of {} rows at {}", rows.key_first,
               rows.key_first + count - 1, kv_rows, rows.kv_first);
  const int64_t K = static_cast<int64_t>(KVH) * HS;
  return {qkv,
          int64_t{NH + 2 * KVH} * HS,
          kv,
          kv + K,
          2 * K,
          rows.Tq,
          rows.Tk,
          rows.pos,
          rows.key_first,
          rows.key_first + count,
          kv_rows,
          rows.kv_first};
}

}  // namespace

int64_t flash_attention_scratch_floats(int T, int HS, const FlashBlocks& blocks, DType products) {
  return thread_floats(T, T, HS, blocks, products) * attention_max_threads();
}

int64_t flash_attention_scratch_floats(const AttentionRows& rows, int HS, const FlashBlocks& blocks,
                                       DType products) {
  return thread_floats(rows.Tq, rows.Tk, HS, blocks, products) * attention_max_threads();
}

namespace {

// out (B, Tq, NH*HS), lse (B, NH, Tq) <- o's queries against its keys and values
void forward(float* out, float* lse, float* scratch, const Operands& o, int B, int NH, int KVH,
             int HS, const AttentionDropout& drop, const FlashBlocks& blocks, DType products) {
  check_args(NH, KVH, blocks, products);
  const bool half = products == DType::BF16;
  const int C = NH * HS, group = NH / KVH, Tq = o.Tq, Tk = o.Tk;
  const FlashBlocks kb = clipped(blocks, Tq, Tk);
  const int BR = kb.rows, BC = kb.cols;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int64_t heads = static_cast<int64_t>(B) * NH, query_blocks = (Tq + BR - 1) / BR;
  const int64_t ldq = o.ldq, ldkv = o.ldkv;
  // Task t is query block query_blocks - 1 - t / heads of head t % heads: the causal mask gives
  // later blocks more keys, so the longest tasks go first and the last ones fill the gaps.
  for_each_task(
      heads * query_blocks, scratch, thread_floats(Tq, Tk, HS, blocks, products),
      [&](int64_t t, float* mine) {
        const int qb = static_cast<int>(query_blocks - 1 - t / heads);
        const int b = static_cast<int>(t % heads / NH), h = static_cast<int>(t % heads % NH);
        float* s = mine;                                  // (BR, BC) scores, then probabilities
        float* pd = s + static_cast<int64_t>(BR) * BC;    // (BR, BC) dropped probabilities
        float* acc = pd + static_cast<int64_t>(BR) * BC;  // (BR, HS) unnormalised output rows
        float* m = acc + static_cast<int64_t>(BR) * HS;   // (BR) running row maximum
        float* l = m + BR;                                // (BR) running row sum at that maximum
        const int i0 = qb * BR, i1 = std::min(Tq, i0 + BR), rows = i1 - i0;
        // The block's last row sees the most keys (positions ascend): keys [key_lo, hi).
        const int hi = std::min(o.at(i1 - 1) + 1, o.key_hi);
        const float* q = o.q + (static_cast<int64_t>(b) * Tq + i0) * ldq + h * HS;  // (rows, HS)
        const float* k = o.k + o.first_key(b) + (h / group) * HS;  // from key key_lo, stride ldkv
        const float* v = o.v + o.first_key(b) + (h / group) * HS;
        const int64_t base = drop.active() ? drop.head_base(b, h, NH, Tk) : 0;
        const HalfTiles ht =
            half ? half_tiles(mine + f32_floats(Tq, Tk, HS, blocks), HS, kb) : HalfTiles{};
        if (half) rows_to_bf16(ht.q, HS, q, ldq, rows, HS);
        std::fill(m, m + rows, kNegInf);
        std::fill(l, l + rows, 0.0f);
        std::fill(acc, acc + static_cast<int64_t>(rows) * HS, 0.0f);
        // Key blocks up to the diagonal: the ones above it are never visited.
        for (int j0 = o.key_lo; j0 < hi; j0 += BC) {
          const int cols = std::min(hi, j0 + BC) - j0;
          // s (rows, cols) = q k[j0:j0+cols]^T * scale
          if (half) {
            rows_to_bf16(ht.k, HS, k + static_cast<int64_t>(j0 - o.key_lo) * ldkv, ldkv, cols, HS);
            rows_to_bf16(ht.v, HS, v + static_cast<int64_t>(j0 - o.key_lo) * ldkv, ldkv, cols, HS);
            gemm(false, true, rows, cols, HS, scale, ht.q, HS, ht.k, HS, 0.0f, s, BC);
          } else {
            gemm(false, true, rows, cols, HS, scale, q, ldq,
                 k + static_cast<int64_t>(j0 - o.key_lo) * ldkv, ldkv, 0.0f, s, BC);
          }
          for (int r = 0; r < rows; ++r) {
            const int i = o.at(i0 + r), n = visible(i, j0, cols);
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
              drop_row(pdr, row, n, i, j0, Tk, base, drop);
              std::fill(pdr + n, pdr + cols, 0.0f);
            }
          }
          // acc (rows, HS) += p (rows, cols) @ v[j0:j0+cols]
          if (half) {
            rows_to_bf16(ht.p, cols, drop.active() ? pd : s, BC, rows, cols);
            gemm(false, false, rows, HS, cols, 1.0f, ht.p, cols, ht.v, HS, 1.0f, acc, HS);
          } else {
            gemm(false, false, rows, HS, cols, 1.0f, drop.active() ? pd : s, BC,
                 v + static_cast<int64_t>(j0 - o.key_lo) * ldkv, ldkv, 1.0f, acc, HS);
          }
        }
        // The block's output rows, once, and each row's log-sum-exp for the backward.
        float* y = out + (static_cast<int64_t>(b) * Tq + i0) * C + h * HS;  // (rows, HS), stride C
        float* lse_h = lse + (static_cast<int64_t>(b) * NH + h) * Tq + i0;
        for (int r = 0; r < rows; ++r) {
          float* yr = y + static_cast<int64_t>(r) * C;
          if (m[r] == kNegInf) {  // the row saw none of the keys read (a key range's call)
            std::fill(yr, yr + HS, 0.0f);
            lse_h[r] = kNegInf;
            continue;
          }
          const float inv = 1.0f / l[r];
          const float* a = acc + static_cast<int64_t>(r) * HS;
          for (int d = 0; d < HS; ++d) yr[d] = a[d] * inv;
          lse_h[r] = m[r] + std::log(l[r]);
        }
      });
}

// The gradients of `forward` for dout (B, Tq, NH*HS), added into dq (laid out as o.q) and dk, dv
// (laid out as o.k and o.v).
void backward(float* dq_all, float* dk_all, float* dv_all, float* scratch, const float* dout,
              const Operands& o, const float* out, const float* lse, int B, int NH, int KVH, int HS,
              const AttentionDropout& drop, const FlashBlocks& blocks, DType products) {
  check_args(NH, KVH, blocks, products);
  const bool half = products == DType::BF16;
  const int C = NH * HS, group = NH / KVH, Tq = o.Tq, Tk = o.Tk;
  const FlashBlocks kb = clipped(blocks, Tq, Tk);
  const int BR = kb.rows, BC = kb.cols;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int64_t ldq = o.ldq, ldkv = o.ldkv;
  // Keys past the last query's position are seen by no row.
  const int keys = std::min(o.at(Tq - 1) + 1, o.key_hi);
  // One task a (sample, key/value head): the query heads sharing it add into its dk and dv one
  // after another on one thread, so no two threads write one head's gradients and the order of
  // every sum is fixed.
  for_each_task(
      static_cast<int64_t>(B) * KVH, scratch, thread_floats(Tq, Tk, HS, blocks, products),
      [&](int64_t t, float* mine) {
        const int b = static_cast<int>(t / KVH), g = static_cast<int>(t % KVH);
        float* dsum = mine;                             // (Tq) D_i = dout_i . out_i
        float* s = dsum + Tq;                           // (BR, BC) probabilities
        float* dp = s + static_cast<int64_t>(BR) * BC;  // (BR, BC) d(probabilities), then d(scores)
        float* pd = dp + static_cast<int64_t>(BR) * BC;  // (BR, BC) dropped probabilities
        const HalfTiles ht =
            half ? half_tiles(mine + f32_floats(Tq, Tk, HS, blocks), HS, kb) : HalfTiles{};
        const int64_t qrow0 = static_cast<int64_t>(b) * Tq * ldq;
        const int64_t krow0 = o.first_key(b) + g * HS;
        const float* k = o.k + krow0;  // from key key_lo, stride ldkv
        const float* v = o.v + krow0;
        float* dk = dk_all + krow0;
        float* dv = dv_all + krow0;
        for (int h = g * group; h < (g + 1) * group; ++h) {
          const float* q = o.q + qrow0 + h * HS;
          float* dq = dq_all + qrow0 + h * HS;
          const float* dy = dout + static_cast<int64_t>(b) * Tq * C + h * HS;  // (Tq, HS), stride C
          const float* y = out + static_cast<int64_t>(b) * Tq * C + h * HS;
          const float* lse_h = lse + (static_cast<int64_t>(b) * NH + h) * Tq;
          const int64_t base = drop.active() ? drop.head_base(b, h, NH, Tk) : 0;
          // The softmax backward's row term sum_j p_ij dp_ij, which is dout_i . out_i (dropout
          // included: out_i = sum_j p_ij mask_ij v_j).
          for (int i = 0; i < Tq; ++i)
            dsum[i] = detail::lane_dot(dy + static_cast<int64_t>(i) * C,
                                       y + static_cast<int64_t>(i) * C, HS);
          for (int j0 = o.key_lo; j0 < keys; j0 += BC) {
            const int cols = std::min(keys, j0 + BC) - j0;
            const float* kj = k + static_cast<int64_t>(j0 - o.key_lo) * ldkv;
            const float* vj = v + static_cast<int64_t>(j0 - o.key_lo) * ldkv;
            if (half) {
              rows_to_bf16(ht.k, HS, kj, ldkv, cols, HS);
              rows_to_bf16(ht.v, HS, vj, ldkv, cols, HS);
            }
            for (int i0 = 0; i0 < Tq; i0 += BR) {
              const int rows = std::min(Tq, i0 + BR) - i0;
              // A query block whose last row comes before key j0 sees none of these keys.
              if (o.at(i0 + rows - 1) < j0) continue;
              const float* qi = q + static_cast<int64_t>(i0) * ldq;
              const float* dyi = dy + static_cast<int64_t>(i0) * C;
              // s (rows, cols) = q_i k_j^T * scale, then p = exp(s - lse) below the diagonal;
              // dp (rows, cols) = dout_i v_j^T: the gradient of the dropped probabilities
              if (half) {
                rows_to_bf16(ht.q, HS, qi, ldq, rows, HS);
                rows_to_bf16(ht.dy, HS, dyi, C, rows, HS);
                gemm(false, true, rows, cols, HS, scale, ht.q, HS, ht.k, HS, 0.0f, s, BC);
                gemm(false, true, rows, cols, HS, 1.0f, ht.dy, HS, ht.v, HS, 0.0f, dp, BC);
              } else {
                gemm(false, true, rows, cols, HS, scale, qi, ldq, kj, ldkv, 0.0f, s, BC);
                gemm(false, true, rows, cols, HS, 1.0f, dyi, C, vj, ldkv, 0.0f, dp, BC);
              }
              for (int r = 0; r < rows; ++r) {
                const int i = o.at(i0 + r), n = visible(i, j0, cols);
                float* __restrict p = s + static_cast<int64_t>(r) * BC;
                float* __restrict d = dp + static_cast<int64_t>(r) * BC;
                const float m = lse_h[i0 + r];
                for (int j = 0; j < n; ++j) p[j] = detail::exp_approx(p[j] - m);
                std::fill(p + n, p + cols, 0.0f);
                if (drop.active()) {
                  // The mask once, for both uses: d(p) = d(dropped) * mask; dropped = p * mask.
                  float* __restrict pdr = pd + static_cast<int64_t>(r) * BC;
                  dropout_mask(pdr, n,
                               Dropout{drop.p, drop.key, base + static_cast<int64_t>(i) * Tk + j0});
                  for (int j = 0; j < n; ++j) d[j] *= pdr[j];
                  for (int j = 0; j < n; ++j) pdr[j] *= p[j];
                  std::fill(pdr + n, pdr + cols, 0.0f);
                }
              }
              // dv_j (cols, HS) += dropped p^T (cols, rows) @ dout_i (rows, HS)
              float* dvj = dv + static_cast<int64_t>(j0 - o.key_lo) * ldkv;
              if (half) {
                rows_to_bf16(ht.p, cols, drop.active() ? pd : s, BC, rows, cols);
                gemm(true, false, cols, HS, rows, 1.0f, ht.p, cols, ht.dy, HS, 1.0f, dvj, ldkv);
              } else {
                gemm(true, false, cols, HS, rows, 1.0f, drop.active() ? pd : s, BC, dyi, C, 1.0f,
                     dvj, ldkv);
              }
              // d(scores) = p (dp - D_i), zero above the diagonal
              for (int r = 0; r < rows; ++r) {
                const int n = visible(o.at(i0 + r), j0, cols);
                const float* __restrict p = s + static_cast<int64_t>(r) * BC;
                float* __restrict d = dp + static_cast<int64_t>(r) * BC;
                const float di = dsum[i0 + r];
                for (int j = 0; j < n; ++j) d[j] = p[j] * (d[j] - di);
                std::fill(d + n, d + cols, 0.0f);
              }
              // dq_i (rows, HS) += ds (rows, cols) @ k_j * scale;
              // dk_j (cols, HS) += ds^T (cols, rows) @ q_i * scale
              float* dqi = dq + static_cast<int64_t>(i0) * ldq;
              float* dkj = dk + static_cast<int64_t>(j0 - o.key_lo) * ldkv;
              if (half) {
                rows_to_bf16(ht.ds, cols, dp, BC, rows, cols);
                gemm(false, false, rows, HS, cols, scale, ht.ds, cols, ht.k, HS, 1.0f, dqi, ldq);
                gemm(true, false, cols, HS, rows, scale, ht.ds, cols, ht.q, HS, 1.0f, dkj, ldkv);
              } else {
                gemm(false, false, rows, HS, cols, scale, dp, BC, kj, ldkv, 1.0f, dqi, ldq);
                gemm(true, false, cols, HS, rows, scale, dp, BC, qi, ldq, 1.0f, dkj, ldkv);
              }
            }
          }
        }
      });
}

}  // namespace

// out (B, T, NH*HS), lse (B, NH, T) <- qkv (B, T, (NH + 2*KVH)*HS)
void flash_attention_forward(float* out, float* lse, float* scratch, const float* qkv, int B, int T,
                             int NH, int KVH, int HS, const AttentionDropout& drop,
                             const FlashBlocks& blocks, DType products) {
  forward(out, lse, scratch, fused_qkv(qkv, T, NH, KVH, HS), B, NH, KVH, HS, drop, blocks,
          products);
}

// dqkv (B, T, (NH + 2*KVH)*HS) += backward of flash_attention_forward for dout (B, T, NH*HS)
void flash_attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                              const float* out, const float* lse, int B, int T, int NH, int KVH,
                              int HS, const AttentionDropout& drop, const FlashBlocks& blocks,
                              DType products) {
  const Operands o = fused_qkv(qkv, T, NH, KVH, HS);
  float* dk = dqkv + (o.k - o.q);
  backward(dqkv, dk, dk + (o.v - o.k), scratch, dout, o, out, lse, B, NH, KVH, HS, drop, blocks,
           products);
}

void flash_attention_forward(float* out, float* lse, float* scratch, const float* qkv,
                             const float* kv, const AttentionRows& rows, int B, int NH, int KVH,
                             int HS, const AttentionDropout& drop, const FlashBlocks& blocks,
                             DType products) {
  forward(out, lse, scratch, gathered_kv(qkv, kv, rows, NH, KVH, HS), B, NH, KVH, HS, drop, blocks,
          products);
}

void flash_attention_backward(float* dqkv, float* dkv, float* scratch, const float* dout,
                              const float* qkv, const float* kv, const float* out, const float* lse,
                              const AttentionRows& rows, int B, int NH, int KVH, int HS,
                              const AttentionDropout& drop, const FlashBlocks& blocks,
                              DType products) {
  const Operands o = gathered_kv(qkv, kv, rows, NH, KVH, HS);
  float* dk = dkv;
  backward(dqkv, dk, dk + (o.v - o.k), scratch, dout, o, out, lse, B, NH, KVH, HS, drop, blocks,
           products);
}

// Per row: the two parts' weights e^(lse - new lse), in f32 from the larger lse (so each <= 1).
void flash_attention_merge(float* out, float* lse, const float* out2, const float* lse2, int B,
                           int Tq, int NH, int HS) {
  const int C = NH * HS;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int r = 0; r < Tq; ++r) {
        const int64_t li = (static_cast<int64_t>(b) * NH + h) * Tq + r;
        const float a = lse[li], c = lse2[li];
        if (c == kNegInf) continue;  // the second part saw no key of this row
        float* y = out + (static_cast<int64_t>(b) * Tq + r) * C + h * HS;
        const float* y2 = out2 + (static_cast<int64_t>(b) * Tq + r) * C + h * HS;
        if (a == kNegInf) {
          std::copy(y2, y2 + HS, y);
          lse[li] = c;
          continue;
        }
        const float m = std::max(a, c);
        const float ea = std::exp(a - m), ec = std::exp(c - m), sum = ea + ec;
        const float wa = ea / sum, wc = ec / sum;
        for (int d = 0; d < HS; ++d) y[d] = y[d] * wa + y2[d] * wc;
        lse[li] = m + std::log(sum);
      }
}

}  // namespace tandem::nn
