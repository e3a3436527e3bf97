// The tied LM head (logits = x @ wte^T), alone for chosen rows and fused with the softmax
// cross-entropy over chunks of rows for training, through core/gemm.h in f32 or with bf16
// operands (MatmulPrecision), the input f32 or already bf16.
#include <algorithm>
#include <type_traits>

#include "matmul_operands.h"
#include "tandem/core/gemm.h"
#include "tandem/nn/layers.h"

namespace tandem::nn {
namespace {

using detail::in_bf16;
using detail::other_of;
using detail::rows_of;

// logits (N, V) = inp (N, C) @ wte (V, C)^T
template <typename In>
void head_forward(float* logits, const In* inp, const float* wte, int N, int C, int V,
                  const MatmulPrecision& mm) {
  const bool bf16s = detail::in_bf16_for<In>(mm);
  if (N == 0 || V == 0) return;
  if (C == 0) {
    std::fill(logits, logits + static_cast<int64_t>(N) * V, 0.0f);
    return;
  }
  if constexpr (std::is_same_v<In, float>)
    if (!bf16s) return gemm(false, true, N, V, C, 1.0f, inp, C, wte, C, 0.0f, logits, V);
  const bf16* x = rows_of(mm, inp, static_cast<int64_t>(N) * C);
  const bf16* w = other_of(mm, wte, static_cast<int64_t>(V) * C);
  gemm(false, true, N, V, C, 1.0f, x, C, w, C, 0.0f, logits, V);
}

}  // namespace

void lm_head_forward(float* logits, const float* inp, const float* wte, int N, int C, int V,
                     const MatmulPrecision& mm) {
  head_forward(logits, inp, wte, N, C, V, mm);
}
void lm_head_forward(float* logits, const bf16* inp, const float* wte, int N, int C, int V,
                     const MatmulPrecision& mm) {
  head_forward(logits, inp, wte, N, C, V, mm);
}

// dinp (N, C) += dlogits (N, V) @ wte (V, C); dwte (V, C) += dlogits^T @ inp
void lm_head_backward(float* dinp, float* dwte, const float* dlogits, const float* inp,
                      const float* wte, int N, int C, int V, const MatmulPrecision& mm) {
  if (N == 0 || V == 0 || C == 0) return;
  if (!in_bf16(mm)) {
    if (dinp != nullptr) gemm(false, false, N, C, V, 1.0f, dlogits, V, wte, C, 1.0f, dinp, C);
    gemm(true, false, V, C, N, 1.0f, dlogits, V, inp, C, 1.0f, dwte, C);
    return;
  }
  const bf16* g = rows_of(mm, dlogits, static_cast<int64_t>(N) * V);
  if (dinp != nullptr) {
    const bf16* w = other_of(mm, wte, static_cast<int64_t>(V) * C);
    gemm(false, false, N, C, V, 1.0f, g, V, w, C, 1.0f, dinp, C);
  }
  const bf16* x = other_of(mm, inp, static_cast<int64_t>(N) * C);
  gemm(true, false, V, C, N, 1.0f, g, V, x, C, 1.0f, dwte, C);
}

// ---------------------------------------------------------------------------------------------
// The fused, chunked head.

int lm_head_chunk_rows(int N, int V) {
  const int64_t fit = kLmHeadChunkBytes / (static_cast<int64_t>(sizeof(float)) * std::max(V, 1));
  return static_cast<int>(std::clamp<int64_t>(fit, 1, std::max(N, 1)));
}

namespace {

// The operands of one call's GEMMs. In bf16: wte's copy in `other`, made once for all chunks
// (converting it per chunk would cost a pass over V x C each time); an f32 chunk's input rows
// converted at the start of `rows` (a bf16 input is used where it is), its dlogits after them.
struct HeadOperands {
  bool use_bf16 = false;
  const bf16* wte = nullptr;
  bf16* x = nullptr;  // chunk * C
  bf16* g = nullptr;  // chunk * V
};

template <typename In>
HeadOperands head_operands(const MatmulPrecision& mm, const float* wte, int chunk, int C, int V) {
  HeadOperands o;
  o.use_bf16 = detail::in_bf16_for<In>(mm);
  if (!o.use_bf16) return o;
  const int64_t xs = static_cast<int64_t>(chunk) * C, gs = static_cast<int64_t>(chunk) * V;
  TANDEM_CHECK(mm.rows != nullptr && mm.rows_size >= xs + gs,
               "bf16 matmul scratch 'rows' holds {} of the head's {} elements",
               mm.rows != nullptr ? mm.rows_size : 0, xs + gs);
  o.wte = other_of(mm, wte, static_cast<int64_t>(V) * C);
  o.x = mm.rows;
  o.g = mm.rows + xs;
  return o;
}

// A chunk's bf16 rows: an f32 chunk converted into o.x, a bf16 one as it is.
const bf16* chunk_rows(const float* x, const HeadOperands& o, int64_t n) {
  to_bf16_parallel(x, o.x, n);
  return o.x;
}
const bf16* chunk_rows(const bf16* x, const HeadOperands&, int64_t) { return x; }

// logits (rows, V) = x (rows, C) @ wte^T. Returns the bf16 rows the product used (null in f32),
// for the backward's dwte.
template <typename In>
const bf16* chunk_logits(float* logits, const In* x, const float* wte, const HeadOperands& o,
                         int rows, int C, int V) {
  if constexpr (std::is_same_v<In, float>)
    if (!o.use_bf16) {
      gemm(false, true, rows, V, C, 1.0f, x, C, wte, C, 0.0f, logits, V);
      return nullptr;
    }
  const bf16* xb = chunk_rows(x, o, static_cast<int64_t>(rows) * C);
  gemm(false, true, rows, V, C, 1.0f, xb, C, o.wte, C, 0.0f, logits, V);
  return xb;
}

void check_head(int N, int C, int V, int chunk) {
  TANDEM_CHECK(N >= 0 && C >= 1 && V >= 1 && chunk >= 1, "LM head of {} rows, C {}, V {}, chunk {}",
               N, C, V, chunk);
}

template <typename In>
void loss_forward(float* losses, float* logits, const In* inp, const float* wte,
                  const int32_t* targets, int N, int C, int V, int chunk,
                  const MatmulPrecision& mm) {
  check_head(N, C, V, chunk);
  if (N == 0) return;
  const HeadOperands o = head_operands<In>(mm, wte, chunk, C, V);
  for (int r0 = 0; r0 < N; r0 += chunk) {
    const int rows = std::min(chunk, N - r0);
    chunk_logits(logits, inp + static_cast<int64_t>(r0) * C, wte, o, rows, C, V);
    crossentropy_loss_inplace(losses + r0, logits, targets + r0, rows, V);
  }
}

template <typename In>
void loss_backward(float* dinp, float* dwte, float* logits, const In* inp, const float* wte,
                   const int32_t* targets, float dloss, int N, int C, int V, int chunk,
                   const MatmulPrecision& mm) {
  check_head(N, C, V, chunk);
  if (N == 0) return;
  const HeadOperands o = head_operands<In>(mm, wte, chunk, C, V);
  for (int r0 = 0; r0 < N; r0 += chunk) {
    const int rows = std::min(chunk, N - r0);
    const In* x = inp + static_cast<int64_t>(r0) * C;
    float* dx = dinp != nullptr ? dinp + static_cast<int64_t>(r0) * C : nullptr;
    // The forward's logits again (the price of not keeping them), then their gradient in place.
    const bf16* xb = chunk_logits(logits, x, wte, o, rows, C, V);
    crossentropy_backward_inplace(logits, targets + r0, dloss, rows, V);
    if constexpr (std::is_same_v<In, float>)
      if (!o.use_bf16) {
        if (dx != nullptr) gemm(false, false, rows, C, V, 1.0f, logits, V, wte, C, 1.0f, dx, C);
        gemm(true, false, V, C, rows, 1.0f, logits, V, x, C, 1.0f, dwte, C);
        continue;
      }
    to_bf16_parallel(logits, o.g, static_cast<int64_t>(rows) * V);
    if (dx != nullptr) gemm(false, false, rows, C, V, 1.0f, o.g, V, o.wte, C, 1.0f, dx, C);
    gemm(true, false, V, C, rows, 1.0f, o.g, V, xb, C, 1.0f, dwte, C);
  }
}

}  // namespace

void lm_head_loss_forward(float* losses, float* logits, const float* inp, const float* wte,
                          const int32_t* targets, int N, int C, int V, int chunk,
                          const MatmulPrecision& mm) {
  loss_forward(losses, logits, inp, wte, targets, N, C, V, chunk, mm);
}
void lm_head_loss_forward(float* losses, float* logits, const bf16* inp, const float* wte,
                          const int32_t* targets, int N, int C, int V, int chunk,
                          const MatmulPrecision& mm) {
  loss_forward(losses, logits, inp, wte, targets, N, C, V, chunk, mm);
}

void lm_head_loss_backward(float* dinp, float* dwte, float* logits, const float* inp,
                           const float* wte, const int32_t* targets, float dloss, int N, int C,
                           int V, int chunk, const MatmulPrecision& mm) {
  loss_backward(dinp, dwte, logits, inp, wte, targets, dloss, N, C, V, chunk, mm);
}
void lm_head_loss_backward(float* dinp, float* dwte, float* logits, const bf16* inp,
                           const float* wte, const int32_t* targets, float dloss, int N, int C,
                           int V, int chunk, const MatmulPrecision& mm) {
  loss_backward(dinp, dwte, logits, inp, wte, targets, dloss, N, C, V, chunk, mm);
}

}  // namespace tandem::nn
