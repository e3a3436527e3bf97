// The encoder: token embedding plus learned position embedding (none for Llama: wpe null).
#include <algorithm>

#include "columns.h"
#include "tandem/nn/layers.h"

namespace tandem::nn {
namespace {

// Columns [c0, c1) of dwte and dwpe, rows visited in (b, t) order.
void encoder_backward_columns(float* __restrict dwte, float* __restrict dwpe,
                              const float* __restrict dout, const int32_t* __restrict inp, int B,
                              int T, int C, int64_t c0, int64_t c1) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const float* __restrict g = dout + (static_cast<int64_t>(b) * T + t) * C;
      float* __restrict dw = dwte + static_cast<int64_t>(inp[b * T + t]) * C;
      float* __restrict dp = dwpe == nullptr ? nullptr : dwpe + static_cast<int64_t>(t) * C;
      for (int64_t i = c0; i < c1; ++i) dw[i] += g[i];
      if (dwpe == nullptr) continue;
      for (int64_t i = c0; i < c1; ++i) dp[i] += g[i];
    }
}

}  // namespace

// out (B, T, C) = wte (V, C)[inp (B, T)] + wpe (maxT, C)[t]; rows split over threads.
void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                     int T, int C) {
  const int64_t grain = std::max<int64_t>(1, detail::kParallelGrain / std::max(C, 1));
  parallel_for(static_cast<int64_t>(B) * T, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = r % T;
      float* __restrict o = out + r * C;
      const float* __restrict w = wte + static_cast<int64_t>(inp[r]) * C;
      if (wpe == nullptr) {  // no learned positions (Llama's are rotary, inside attention)
        std::copy(w, w + C, o);
        continue;
      }
      const float* __restrict p = wpe + t * C;
      for (int i = 0; i < C; ++i) o[i] = w[i] + p[i];
    }
  });
}

// dwte (V, C) += dout rows by token; dwpe (maxT, C) += dout rows by position. Column blocks run
// in parallel and each visits the rows in a fixed order, so repeated tokens accumulate
// deterministically at any thread count.
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T,
                      int C) {
  detail::for_column_blocks(C, static_cast<int64_t>(B) * T, [&](int64_t c0, int64_t c1) {
    encoder_backward_columns(dwte, dwpe, dout, inp, B, T, C, c0, c1);
  });
}

}  // namespace tandem::nn
