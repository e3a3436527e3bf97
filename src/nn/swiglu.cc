// SwiGLU, Llama's gated MLP activation silu(gate) * up, forward (output in f32 or rounded to bf16)
// and backward, vectorised through exp_approx.
#include <algorithm>

#include "matmul_operands.h"
#include "tandem/core/parallel.h"
#include "tandem/nn/layers.h"
#include "vec.h"

namespace tandem::nn {
namespace {

// Elements per thread at least, as in GELU.
constexpr int64_t kGrain = 1 << 15;

// sigmoid(g) = 1 / (1 + exp(-g)); exp_approx saturates instead of overflowing, so large |g| give
// 0 or 1 without an inf in between.
inline float sigmoid(float g) { return 1.0f / (1.0f + detail::exp_approx(-g)); }

void swiglu_forward_range(float* __restrict o, const float* __restrict g, const float* __restrict u,
                          int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = g[i] * sigmoid(g[i]) * u[i];
}

// silu'(g) = s (1 + g (1 - s)), s = sigmoid(g).
void swiglu_backward_range(float* __restrict dg, float* __restrict du, const float* __restrict d,
                           const float* __restrict g, const float* __restrict u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float s = sigmoid(g[i]);
    const float silu = g[i] * s;
    dg[i] += d[i] * u[i] * (s * (1.0f + g[i] * (1.0f - s)));
    du[i] += d[i] * silu;
  }
}

// out (n) = silu(gate (n)) * up (n) in f32 or rounded to bf16 (matmul_operands.h, write_output).
template <typename Out>
void forward(Out* out, const float* gate, const float* up, int64_t n) {
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    detail::write_output(out + b, e - b, [&](float* d, int64_t first, int64_t count) {
      swiglu_forward_range(d, gate + b + first, up + b + first, count);
    });
  });
}

// out (N, F) = silu(fc[:, :F]) * fc[:, F:]: the fused gate|up projection's rows.
template <typename Out>
void rows_forward(Out* out, const float* fc, int64_t N, int F) {
  parallel_for(N, std::max<int64_t>(1, kGrain / std::max(F, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* g = fc + r * 2 * F;
      detail::write_output(out + r * F, F, [&](float* d, int64_t first, int64_t count) {
        swiglu_forward_range(d, g + first, g + F + first, count);
      });
    }
  });
}

}  // namespace

void swiglu_forward(float* out, const float* gate, const float* up, int64_t n) {
  forward(out, gate, up, n);
}
void swiglu_forward(bf16* out, const float* gate, const float* up, int64_t n) {
  forward(out, gate, up, n);
}

// dgate (n) += dout * up * silu'(gate); dup (n) += dout * silu(gate)
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, int64_t n) {
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    swiglu_backward_range(dgate + b, dup + b, dout + b, gate + b, up + b, e - b);
  });
}

void swiglu_rows_forward(float* out, const float* fc, int64_t N, int F) {
  rows_forward(out, fc, N, F);
}
void swiglu_rows_forward(bf16* out, const float* fc, int64_t N, int F) {
  rows_forward(out, fc, N, F);
}

// dfc (N, 2F) += the gradients of gate (first F columns) and up (last F) from dout (N, F)
void swiglu_rows_backward(float* dfc, const float* dout, const float* fc, int64_t N, int F) {
  parallel_for(N, std::max<int64_t>(1, kGrain / std::max(F, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* g = fc + r * 2 * F;
      float* dg = dfc + r * 2 * F;
      swiglu_backward_range(dg, dg + F, dout + r * F, g, g + F, F);
    }
  });
}

}  // namespace tandem::nn
