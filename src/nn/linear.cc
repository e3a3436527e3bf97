// Linear layers (GPT-2's Conv1D: weight (in, out)) and the tied LM head, through BLAS.
#include <algorithm>
#include <cstring>

#include "columns.h"
#include "tandem/core/blas.h"
#include "tandem/nn/layers.h"

namespace tandem::nn {
namespace {

// dbias[o] += sum over rows of dout[n, o], for columns [c0, c1).
void bias_grad(float* __restrict db, const float* __restrict dout, int N, int OC, int64_t c0,
               int64_t c1) {
  for (int n = 0; n < N; ++n) {
    const float* __restrict g = dout + static_cast<int64_t>(n) * OC;
    for (int64_t o = c0; o < c1; ++o) db[o] += g[o];
  }
}

}  // namespace

// out (N, OC) = inp (N, IC) @ weight (IC, OC) + bias (OC)
void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int IC, int OC) {
  if (N == 0 || OC == 0) return;
  // The bias is written first and the product added onto it (beta = 1): one pass over out.
  if (bias != nullptr) {
    for (int n = 0; n < N; ++n)
      std::memcpy(out + static_cast<int64_t>(n) * OC, bias,
                  sizeof(float) * static_cast<size_t>(OC));
  } else {
    std::fill(out, out + static_cast<int64_t>(N) * OC, 0.0f);
  }
  if (IC == 0) return;
  blas::sgemm(false, false, N, OC, IC, 1.0f, inp, IC, weight, OC, 1.0f, out, OC);
}

// dinp (N, IC) += dout (N, OC) @ weight^T; dweight (IC, OC) += inp^T @ dout; dbias (OC) += dout
// summed over rows.
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int IC, int OC) {
  if (N == 0 || OC == 0) return;
  if (IC > 0) {
    if (dinp != nullptr)
      blas::sgemm(false, true, N, IC, OC, 1.0f, dout, OC, weight, OC, 1.0f, dinp, IC);
    blas::sgemm(true, false, IC, OC, N, 1.0f, inp, IC, dout, OC, 1.0f, dweight, OC);
  }
  if (dbias != nullptr) {
    // Column blocks in parallel, each column summed over rows in order (columns.h).
    detail::for_column_blocks(
        OC, N, [&](int64_t c0, int64_t c1) { bias_grad(dbias, dout, N, OC, c0, c1); });
  }
}

// logits (N, V) = inp (N, C) @ wte (V, C)^T
void lm_head_forward(float* logits, const float* inp, const float* wte, int N, int C, int V) {
  if (N == 0 || V == 0) return;
  if (C == 0) {
    std::fill(logits, logits + static_cast<int64_t>(N) * V, 0.0f);
    return;
  }
  blas::sgemm(false, true, N, V, C, 1.0f, inp, C, wte, C, 0.0f, logits, V);
}

// dinp (N, C) += dlogits (N, V) @ wte (V, C); dwte (V, C) += dlogits^T @ inp
void lm_head_backward(float* dinp, float* dwte, const float* dlogits, const float* inp,
                      const float* wte, int N, int C, int V) {
  if (N == 0 || V == 0 || C == 0) return;
  if (dinp != nullptr) blas::sgemm(false, false, N, C, V, 1.0f, dlogits, V, wte, C, 1.0f, dinp, C);
  blas::sgemm(true, false, V, C, N, 1.0f, dlogits, V, inp, C, 1.0f, dwte, C);
}

}  // namespace tandem::nn
