// RMSNorm forward (output in f32 or rounded to bf16) and backward over the last dimension,
// saving rstd; Llama's normalisation, LayerNorm without the mean and the bias.
#include <algorithm>
#include <cmath>

#include "columns.h"
#include "matmul_operands.h"
#include "tandem/core/error.h"
#include "tandem/core/parallel.h"
#include "tandem/nn/layers.h"
#include "vec.h"

namespace tandem::nn {
namespace {

void check_sizes(int N, int C) { TANDEM_CHECK(N >= 0 && C >= 1, "RMSNorm of {} rows of {}", N, C); }

// Rows per thread: at least ~32K elements each, as in LayerNorm.
int64_t row_grain(int C) { return std::max<int64_t>(1, detail::kParallelGrain / std::max(C, 1)); }

// o (n) = x (n) * s * w (n): one row's output, or part of it (HF's order: (x * rstd) * w).
void scale_row(float* __restrict o, const float* __restrict x, float s, const float* __restrict w,
               int64_t n) {
  for (int64_t j = 0; j < n; ++j) o[j] = x[j] * s * w[j];
}

// out (N, C), rstd (N) = rmsnorm(inp (N, C)) * weight (C)
template <typename Out>
void forward(Out* out, float* rstd, const float* inp, const float* weight, int N, int C,
             float eps) {
  check_sizes(N, C);
  const float* __restrict w = weight;
  parallel_for(N, row_grain(C), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* __restrict x = inp + n * C;
      // mean(x^2) over fixed lanes: vectorised, and the same bits at any thread count.
      const float ms = detail::lane_dot(x, x, C) / static_cast<float>(C);
      const float s = 1.0f / std::sqrt(ms + eps);
      detail::write_output(out + n * C, C, [&](float* d, int64_t first, int64_t count) {
        scale_row(d, x + first, s, w + first, count);
      });
      rstd[n] = s;
    }
  });
}

// One row's input gradient given a = mean(w * g * norm), norm = x * s:
// dx += (w * g - norm * a) * s. Restrict on parameters, where GCC uses it to vectorise.
void rmsnorm_backward_row(float* __restrict dx, const float* __restrict g,
                          const float* __restrict x, const float* __restrict w, float s, float a,
                          int C) {
  for (int j = 0; j < C; ++j) {
    const float norm = x[j] * s;
    dx[j] += (w[j] * g[j] - norm * a) * s;
  }
}

// Columns [c0, c1) of dweight, summed over rows in row order: dw[j] += sum_n x[n, j] s[n] g[n, j].
void rmsnorm_backward_weight(float* __restrict dw, const float* __restrict dout,
                             const float* __restrict inp, const float* __restrict rstd, int N,
                             int C, int64_t c0, int64_t c1) {
  for (int n = 0; n < N; ++n) {
    const float* __restrict x = inp + static_cast<int64_t>(n) * C;
    const float* __restrict g = dout + static_cast<int64_t>(n) * C;
    const float s = rstd[n];
    for (int64_t j = c0; j < c1; ++j) dw[j] += x[j] * s * g[j];
  }
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps) {
  forward(out, rstd, inp, weight, N, C, eps);
}
void rmsnorm_forward(bf16* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps) {
  forward(out, rstd, inp, weight, N, C, eps);
}

// dinp (N, C), dweight (C) += backward of rmsnorm_forward for dout (N, C). As in LayerNorm: rows in
// parallel for dinp (each needs only its own mean), then column blocks for dweight, so no partial
// sums are kept and no bit depends on the thread count.
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C) {
  check_sizes(N, C);
  const float* __restrict w = weight;
  parallel_for(N, row_grain(C), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* __restrict x = inp + n * C;
      const float* __restrict g = dout + n * C;
      const float s = rstd[n];
      // a = mean(w * g * x * s): through rstd, every input feeds every output of its row.
      float acc[detail::kLanes] = {};
      int i = 0;
      for (; i + detail::kLanes <= C; i += detail::kLanes)
        for (int k = 0; k < detail::kLanes; ++k) acc[k] += w[i + k] * g[i + k] * (x[i + k] * s);
      float a = 0.0f;
      for (int k = 0; k < detail::kLanes; ++k) a += acc[k];
      for (; i < C; ++i) a += w[i] * g[i] * (x[i] * s);
      a /= static_cast<float>(C);
      rmsnorm_backward_row(dinp + n * C, g, x, w, s, a, C);
    }
  });
  detail::for_column_blocks(C, N, [&](int64_t c0, int64_t c1) {
    rmsnorm_backward_weight(dweight, dout, inp, rstd, N, C, c0, c1);
  });
}

}  // namespace tandem::nn
