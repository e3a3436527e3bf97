// The residual add and its backward, split over threads (core/parallel.h).
#include "columns.h"
#include "tandem/nn/layers.h"

namespace tandem::nn {
namespace {

// out may equal either input, so no restrict here (GCC's runtime overlap check still picks the
// vector loop for exact aliasing).
void residual_forward_range(float* out, const float* inp1, const float* inp2, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = inp1[i] + inp2[i];
}

void residual_backward_range(float* __restrict d1, float* __restrict d2, const float* __restrict g,
                             int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    d1[i] += g[i];
    d2[i] += g[i];
  }
}

}  // namespace

// out (n) = inp1 (n) + inp2 (n); out may equal either input.
void residual_forward(float* out, const float* inp1, const float* inp2, int64_t n) {
  parallel_for(n, detail::kParallelGrain, [&](int64_t b, int64_t e) {
    residual_forward_range(out + b, inp1 + b, inp2 + b, e - b);
  });
}

// dinp1 (n) += dout; dinp2 (n) += dout
void residual_backward(float* dinp1, float* dinp2, const float* dout, int64_t n) {
  parallel_for(n, detail::kParallelGrain, [&](int64_t b, int64_t e) {
    residual_backward_range(dinp1 + b, dinp2 + b, dout + b, e - b);
  });
}

}  // namespace tandem::nn
