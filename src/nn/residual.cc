// The residual add and its backward.
#include "tandem/nn/layers.h"

namespace tandem::nn {

// out (n) = inp1 (n) + inp2 (n); out may equal either input, so no restrict here (GCC's runtime
// overlap check still picks the vector loop for exact aliasing).
void residual_forward(float* out, const float* inp1, const float* inp2, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = inp1[i] + inp2[i];
}

// dinp1 (n) += dout; dinp2 (n) += dout
void residual_backward(float* dinp1, float* dinp2, const float* dout, int64_t n) {
  float* __restrict d1 = dinp1;
  float* __restrict d2 = dinp2;
  const float* __restrict g = dout;
  for (int64_t i = 0; i < n; ++i) {
    d1[i] += g[i];
    d2[i] += g[i];
  }
}

}  // namespace tandem::nn
