// LayerNorm forward (output in f32 or rounded to bf16) and backward over the last dimension,
// saving mean and rstd.
#include <algorithm>
#include <cmath>

#include "columns.h"
#include "matmul_operands.h"
#include "tandem/core/parallel.h"
#include "tandem/nn/layers.h"
#include "vec.h"

namespace tandem::nn {

using detail::kLanes;

namespace {

// o (n) = (x (n) - m) * s * w (n) + b (n): one row's output, or part of it.
void normalize(float* __restrict o, const float* __restrict x, float m, float s,
               const float* __restrict w, const float* __restrict b, int64_t n) {
  for (int64_t j = 0; j < n; ++j) o[j] = (x[j] - m) * s * w[j] + b[j];
}

// out (N, C), mean (N), rstd (N) = layernorm(inp (N, C)) * weight (C) + bias (C)
template <typename Out>
void forward(Out* out, float* mean, float* rstd, const float* inp, const float* weight,
             const float* bias, int N, int C) {
  const float* __restrict w = weight;
  const float* __restrict bi = bias;
  // Rows are independent: split over threads, at least ~32K elements each.
  const int64_t grain = std::max<int64_t>(1, detail::kParallelGrain / std::max(C, 1));
  parallel_for(N, grain, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* __restrict x = inp + static_cast<int64_t>(n) * C;
      Out* o = out + static_cast<int64_t>(n) * C;
      const float m = detail::lane_sum(x, C) / static_cast<float>(C);
      // Two passes (mean, then squared deviations): no cancellation for rows with a large mean.
      float acc[kLanes] = {};
      int i = 0;
      for (; i + kLanes <= C; i += kLanes)
        for (int k = 0; k < kLanes; ++k) {
          const float dev = x[i + k] - m;
          acc[k] += dev * dev;
        }
      float var = 0.0f;
      for (int k = 0; k < kLanes; ++k) var += acc[k];
      for (; i < C; ++i) var += (x[i] - m) * (x[i] - m);
      const float s = 1.0f / std::sqrt(var / static_cast<float>(C) + kLayerNormEps);
      detail::write_output(o, C, [&](float* d, int64_t first, int64_t count) {
        normalize(d, x + first, m, s, w + first, bi + first, count);
      });
      mean[n] = m;
      rstd[n] = s;
    }
  });
}

// One row's input gradient, given its two row means. A function of its own so that the restrict
// qualifiers are on parameters, where GCC relies on them (on block-scope locals it gave up
// vectorising this loop).
void layernorm_backward_row(float* __restrict dx, const float* __restrict g,
                            const float* __restrict x, const float* __restrict w, float m, float s,
                            float dnorm_mean, float dnorm_norm_mean, int C) {
  for (int j = 0; j < C; ++j) {
    const float norm = (x[j] - m) * s;
    const float dnorm = w[j] * g[j];
    dx[j] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
  }
}

// Columns [c0, c1) of the parameter gradients, summed over rows in row order:
// dbias[j] += sum_n g[n, j], dweight[j] += sum_n norm[n, j] * g[n, j].
void layernorm_backward_params(float* __restrict dw, float* __restrict db,
                               const float* __restrict dout, const float* __restrict inp,
                               const float* __restrict mean, const float* __restrict rstd, int N,
                               int C, int64_t c0, int64_t c1) {
  for (int n = 0; n < N; ++n) {
    const float* __restrict x = inp + static_cast<int64_t>(n) * C;
    const float* __restrict g = dout + static_cast<int64_t>(n) * C;
    const float m = mean[n], s = rstd[n];
    for (int64_t j = c0; j < c1; ++j) {
      const float norm = (x[j] - m) * s;
      db[j] += g[j];
      dw[j] += norm * g[j];
    }
  }
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
  forward(out, mean, rstd, inp, weight, bias, N, C);
}
void layernorm_forward(bf16* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
  forward(out, mean, rstd, inp, weight, bias, N, C);
}

// dinp (N, C), dweight (C), dbias (C) += backward of layernorm_forward for dout (N, C).
// Two parallel passes: rows for dinp (each row needs only its own two means), then column blocks
// for dweight and dbias (each column summed over rows in order), so no partial sums are kept and
// the result is the same at any thread count.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
  const float* __restrict w = weight;
  const int64_t grain = std::max<int64_t>(1, detail::kParallelGrain / std::max(C, 1));
  parallel_for(N, grain, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* __restrict x = inp + n * C;
      const float* __restrict g = dout + n * C;
      const float m = mean[n], s = rstd[n];
      // The two row means the input gradient needs: mean(w * g) and mean(w * g * norm).
      float acc_g[kLanes] = {}, acc_gn[kLanes] = {};
      int i = 0;
      for (; i + kLanes <= C; i += kLanes)
        for (int k = 0; k < kLanes; ++k) {
          const float norm = (x[i + k] - m) * s;
          const float dnorm = w[i + k] * g[i + k];
          acc_g[k] += dnorm;
          acc_gn[k] += dnorm * norm;
        }
      float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
      for (int k = 0; k < kLanes; ++k) {
        dnorm_mean += acc_g[k];
        dnorm_norm_mean += acc_gn[k];
      }
      for (; i < C; ++i) {
        const float norm = (x[i] - m) * s;
        const float dnorm = w[i] * g[i];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
      }
      dnorm_mean /= static_cast<float>(C);
      dnorm_norm_mean /= static_cast<float>(C);
      layernorm_backward_row(dinp + n * C, g, x, w, m, s, dnorm_mean, dnorm_norm_mean, C);
    }
  });
  detail::for_column_blocks(C, N, [&](int64_t c0, int64_t c1) {
    layernorm_backward_params(dweight, dbias, dout, inp, mean, rstd, N, C, c0, c1);
  });
}

}  // namespace tandem::nn
