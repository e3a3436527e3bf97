// Linear layers (GPT-2's Conv1D: weight (in, out)) and the tied LM head, through core/gemm.h in
// f32 or with bf16 operands (MatmulPrecision).
#include <algorithm>
#include <cstring>

#include "columns.h"
#include "tandem/core/bf16.h"
#include "tandem/core/error.h"
#include "tandem/core/gemm.h"
#include "tandem/core/parallel.h"
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

// dst (n) = bf16 of src (n), split over threads: each element converts alone, so any split gives
// the same bits.
void convert(const float* src, bf16* dst, int64_t n) {
  parallel_for(n, int64_t{1} << 16, [&](int64_t b, int64_t e) {
    to_bf16(src + b, dst + b, static_cast<size_t>(e - b));
  });
}

// The bf16 copy of an n-element operand in one of the scratch buffers.
const bf16* operand(const float* src, int64_t n, bf16* scratch, int64_t size, const char* which) {
  TANDEM_CHECK(scratch != nullptr && size >= n, "bf16 matmul scratch '{}' holds {} of {} elements",
               which, scratch != nullptr ? size : 0, n);
  convert(src, scratch, n);
  return scratch;
}
const bf16* rows_of(const MatmulPrecision& mm, const float* src, int64_t n) {
  return operand(src, n, mm.rows, mm.rows_size, "rows");
}
const bf16* other_of(const MatmulPrecision& mm, const float* src, int64_t n) {
  return operand(src, n, mm.other, mm.other_size, "other");
}

bool in_bf16(const MatmulPrecision& mm) {
  TANDEM_CHECK(mm.type == DType::F32 || mm.type == DType::BF16, "{} matmuls", dtype_name(mm.type));
  return mm.type == DType::BF16;
}

}  // namespace

// out (N, OC) = inp (N, IC) @ weight (IC, OC) + bias (OC)
void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int IC, int OC, const MatmulPrecision& mm) {
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
  if (!in_bf16(mm)) return gemm(false, false, N, OC, IC, 1.0f, inp, IC, weight, OC, 1.0f, out, OC);
  const bf16* x = rows_of(mm, inp, static_cast<int64_t>(N) * IC);
  const bf16* w = other_of(mm, weight, static_cast<int64_t>(IC) * OC);
  gemm(false, false, N, OC, IC, 1.0f, x, IC, w, OC, 1.0f, out, OC);
}

// dinp (N, IC) += dout (N, OC) @ weight^T; dweight (IC, OC) += inp^T @ dout; dbias (OC) += dout
// summed over rows.
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int IC, int OC, const MatmulPrecision& mm) {
  if (N == 0 || OC == 0) return;
  if (IC > 0 && !in_bf16(mm)) {
    if (dinp != nullptr) gemm(false, true, N, IC, OC, 1.0f, dout, OC, weight, OC, 1.0f, dinp, IC);
    gemm(true, false, IC, OC, N, 1.0f, inp, IC, dout, OC, 1.0f, dweight, OC);
  } else if (IC > 0) {
    // dout's bf16 copy serves both products; `other` holds the weight, then the input.
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

// logits (N, V) = inp (N, C) @ wte (V, C)^T
void lm_head_forward(float* logits, const float* inp, const float* wte, int N, int C, int V,
                     const MatmulPrecision& mm) {
  if (N == 0 || V == 0) return;
  if (C == 0) {
    std::fill(logits, logits + static_cast<int64_t>(N) * V, 0.0f);
    return;
  }
  if (!in_bf16(mm)) return gemm(false, true, N, V, C, 1.0f, inp, C, wte, C, 0.0f, logits, V);
  const bf16* x = rows_of(mm, inp, static_cast<int64_t>(N) * C);
  const bf16* w = other_of(mm, wte, static_cast<int64_t>(V) * C);
  gemm(false, true, N, V, C, 1.0f, x, C, w, C, 0.0f, logits, V);
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

}  // namespace tandem::nn
