// Linear layers (GPT-2's Conv1D: weight (in, out)), through core/gemm.h in f32 or with bf16
// operands (MatmulPrecision), the input f32 or already bf16.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "columns.h"
#include "matmul_operands.h"
#include "tandem/core/gemm.h"
#include "tandem/nn/layers.h"

namespace tandem::nn {
namespace {

using detail::in_bf16_for;
using detail::other_of;
using detail::rows_of;

// dbias[o] += sum over rows of dout[n, o], for columns [c0, c1).
void bias_grad(float* __restrict db, const float* __restrict dout, int N, int OC, int64_t c0,
               int64_t c1) {
  for (int n = 0; n < N; ++n) {
    const float* __restrict g = dout + static_cast<int64_t>(n) * OC;
    for (int64_t o = c0; o < c1; ++o) db[o] += g[o];
  }
}

// out (N, OC) = inp (N, IC) @ weight (IC, OC) + bias (OC)
template <typename In>
void forward(float* out, const In* inp, const float* weight, const float* bias, int N, int IC,
             int OC, const MatmulPrecision& mm) {
  const bool bf16s = in_bf16_for<In>(mm);
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
  if constexpr (std::is_same_v<In, float>)
    if (!bf16s) return gemm(false, false, N, OC, IC, 1.0f, inp, IC, weight, OC, 1.0f, out, OC);
  const bf16* x = rows_of(mm, inp, static_cast<int64_t>(N) * IC);
  const bf16* w = other_of(mm, weight, static_cast<int64_t>(IC) * OC);
  gemm(false, false, N, OC, IC, 1.0f, x, IC, w, OC, 1.0f, out, OC);
}

// dinp (N, IC) += dout (N, OC) @ weight^T; dweight (IC, OC) += inp^T @ dout; dbias (OC) += dout
// summed over rows.
template <typename In>
void backward(float* dinp, float* dweight, float* dbias, const float* dout, const In* inp,
              const float* weight, int N, int IC, int OC, const MatmulPrecision& mm) {
  const bool bf16s = in_bf16_for<In>(mm);
  if (N == 0 || OC == 0) return;
  if (IC > 0 && !bf16s) {
    if constexpr (std::is_same_v<In, float>) {
      if (dinp != nullptr) gemm(false, true, N, IC, OC, 1.0f, dout, OC, weight, OC, 1.0f, dinp, IC);
      gemm(true, false, IC, OC, N, 1.0f, inp, IC, dout, OC, 1.0f, dweight, OC);
    }
  } else if (IC > 0) {
    // dout's bf16 copy serves both products; `other` holds the weight, then an f32 input's copy.
    const bf16* g = rows_of(mm, dout, static_cast<int64_t>(N) * OC);
    if (dinp != nullptr) {
      const bf16* w = other_of(mm, weight, static_cast<int64_t>(IC) * OC);
      gemm(false, true, N, IC, OC, 1.0f, g, OC, w, OC, 1.0f, dinp, IC);
    }
    const bf16* x = other_of(mm, inp, static_cast<int64_t>(N) * IC);
    gemm(true, false, IC, OC, N, 1.0f, x, IC, g, OC, 1.0f, dweight, OC);
  }
  if (dbias != nullptr) {
    // Column blocks in parallel, each column summed over rows in order (columns.h).
    detail::for_column_blocks(
        OC, N, [&](int64_t c0, int64_t c1) { bias_grad(dbias, dout, N, OC, c0, c1); });
  }
}

}  // namespace

void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int IC, int OC, const MatmulPrecision& mm) {
  forward(out, inp, weight, bias, N, IC, OC, mm);
}
void linear_forward(float* out, const bf16* inp, const float* weight, const float* bias, int N,
                    int IC, int OC, const MatmulPrecision& mm) {
  forward(out, inp, weight, bias, N, IC, OC, mm);
}

void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int IC, int OC, const MatmulPrecision& mm) {
  backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC, mm);
}
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const bf16* inp,
                     const float* weight, int N, int IC, int OC, const MatmulPrecision& mm) {
  backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC, mm);
}

}  // namespace tandem::nn
