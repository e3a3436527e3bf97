// The encoder: token embedding plus learned position embedding.
#include "tandem/nn/layers.h"

namespace tandem::nn {

// out (B, T, C) = wte (V, C)[inp (B, T)] + wpe (maxT, C)[t]
void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                     int T, int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      float* __restrict o = out + (static_cast<int64_t>(b) * T + t) * C;
      const float* __restrict w = wte + static_cast<int64_t>(inp[b * T + t]) * C;
      const float* __restrict p = wpe + static_cast<int64_t>(t) * C;
      for (int i = 0; i < C; ++i) o[i] = w[i] + p[i];
    }
}

// dwte (V, C) += dout rows by token; dwpe (maxT, C) += dout rows by position. Rows are visited in
// a fixed order, so repeated tokens accumulate deterministically.
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T,
                      int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const float* __restrict g = dout + (static_cast<int64_t>(b) * T + t) * C;
      float* __restrict dw = dwte + static_cast<int64_t>(inp[b * T + t]) * C;
      float* __restrict dp = dwpe + static_cast<int64_t>(t) * C;
      for (int i = 0; i < C; ++i) dw[i] += g[i];
      for (int i = 0; i < C; ++i) dp[i] += g[i];
    }
}

}  // namespace tandem::nn
