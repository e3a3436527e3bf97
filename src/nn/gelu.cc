// GELU with GPT-2's tanh approximation, forward (output in f32 or rounded to bf16) and backward,
// vectorised through tanh_approx.
#include "matmul_operands.h"
#include "tandem/core/parallel.h"
#include "tandem/nn/layers.h"
#include "vec.h"

namespace tandem::nn {
namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
// Elements per thread at least: below this, waking a helper costs more than it saves.
constexpr int64_t kGrain = 1 << 15;

void gelu_forward_range(float* __restrict o, const float* __restrict x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float u = kSqrt2OverPi * (v + kCubic * v * v * v);
    o[i] = 0.5f * v * (1.0f + detail::tanh_approx(u));
  }
}

// out (n) = gelu(inp (n)) in f32 or rounded to bf16 (matmul_operands.h, write_output).
template <typename Out>
void forward(Out* out, const float* inp, int64_t n) {
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    detail::write_output(out + b, e - b, [&](float* d, int64_t first, int64_t count) {
      gelu_forward_range(d, inp + b + first, count);
    });
  });
}

inline float gelu_grad(float v) {
  const float u = kSqrt2OverPi * (v + kCubic * v * v * v);
  const float th = detail::tanh_approx(u);
  const float sech2 = 1.0f - th * th;
  return 0.5f * (1.0f + th) + 0.5f * v * sech2 * kSqrt2OverPi * (1.0f + 3.0f * kCubic * v * v);
}

void gelu_backward_range(float* __restrict dx, const float* __restrict x, const float* __restrict g,
                         int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] += gelu_grad(x[i]) * g[i];
}

void gelu_backward_inplace_range(float* __restrict d, const float* __restrict x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = gelu_grad(x[i]) * d[i];
}

}  // namespace

// out (n) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
void gelu_forward(float* out, const float* inp, int64_t n) { forward(out, inp, n); }
void gelu_forward(bf16* out, const float* inp, int64_t n) { forward(out, inp, n); }

// dinp (n) += gelu'(inp) * dout
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    gelu_backward_range(dinp + b, inp + b, dout + b, e - b);
  });
}

void gelu_backward_inplace(float* d, const float* inp, int64_t n) {
  parallel_for(n, kGrain,
               [&](int64_t b, int64_t e) { gelu_backward_inplace_range(d + b, inp + b, e - b); });
}

}  // namespace tandem::nn
