// Naive reference kernels for every layer in layers.h: plain loops in the order the math is
// written, templated on the scalar type so that tests can run them in double (finite
// differences) and compare the optimised f32 kernels against them. Same signatures, same
// accumulate-into-gradients convention, same dropout masks.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include "tandem/core/rng.h"
#include "tandem/nn/layers.h"

namespace tandem::nn::ref {

// Dropout's multiplier for global element `index`: 1 / (1 - p) if kept, else 0.
template <typename F>
F dropout_factor(float p, uint64_t key, int64_t index) {
  if (p <= 0.0f) return F(1);
  return dropout_keep(key, static_cast<uint64_t>(index), p) ? F(1) / (F(1) - F(p)) : F(0);
}

template <typename F>
void dropout_forward(F* out, const F* inp, int64_t n, const Dropout& d) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = inp[i] * dropout_factor<F>(d.p, d.key, d.index_offset + i);
}

template <typename F>
void dropout_backward(F* dinp, const F* dout, int64_t n, const Dropout& d) {
  for (int64_t i = 0; i < n; ++i)
    dinp[i] += dout[i] * dropout_factor<F>(d.p, d.key, d.index_offset + i);
}

// out (B, T, C) = wte[inp] + wpe[t]
template <typename F>
void encoder_forward(F* out, const int32_t* inp, const F* wte, const F* wpe, int B, int T, int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < C; ++i)
        out[(b * T + t) * C + i] = wte[inp[b * T + t] * C + i] + wpe[t * C + i];
}

template <typename F>
void encoder_backward(F* dwte, F* dwpe, const F* dout, const int32_t* inp, int B, int T, int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < C; ++i) {
        dwte[inp[b * T + t] * C + i] += dout[(b * T + t) * C + i];
        dwpe[t * C + i] += dout[(b * T + t) * C + i];
      }
}

// out (N, C), mean (N), rstd (N)
template <typename F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* inp, const F* weight, const F* bias,
                       int N, int C) {
  for (int n = 0; n < N; ++n) {
    const F* x = inp + n * C;
    F m = 0;
    for (int i = 0; i < C; ++i) m += x[i];
    m /= C;
    F v = 0;
    for (int i = 0; i < C; ++i) v += (x[i] - m) * (x[i] - m);
    v /= C;
    const F s = F(1) / std::sqrt(v + F(kLayerNormEps));
    for (int i = 0; i < C; ++i) out[n * C + i] = (x[i] - m) * s * weight[i] + bias[i];
    mean[n] = m;
    rstd[n] = s;
  }
}

template <typename F>
void layernorm_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight,
                        const F* mean, const F* rstd, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const F* x = inp + n * C;
    const F* g = dout + n * C;
    F a = 0, b = 0;
    for (int i = 0; i < C; ++i) {
      const F norm = (x[i] - mean[n]) * rstd[n];
      a += weight[i] * g[i];
      b += weight[i] * g[i] * norm;
    }
    a /= C;
    b /= C;
    for (int i = 0; i < C; ++i) {
      const F norm = (x[i] - mean[n]) * rstd[n];
      dbias[i] += g[i];
      dweight[i] += norm * g[i];
      dinp[n * C + i] += (weight[i] * g[i] - a - norm * b) * rstd[n];
    }
  }
}

// out (N, OC) = inp (N, IC) @ weight (IC, OC) + bias (OC); bias may be null.
template <typename F>
void linear_forward(F* out, const F* inp, const F* weight, const F* bias, int N, int IC, int OC) {
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      F s = bias != nullptr ? bias[o] : F(0);
      for (int i = 0; i < IC; ++i) s += inp[n * IC + i] * weight[i * OC + o];
      out[n * OC + o] = s;
    }
}

template <typename F>
void linear_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight,
                     int N, int IC, int OC) {
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      const F g = dout[n * OC + o];
      if (dbias != nullptr) dbias[o] += g;
      for (int i = 0; i < IC; ++i) {
        if (dinp != nullptr) dinp[n * IC + i] += g * weight[i * OC + o];
        dweight[i * OC + o] += g * inp[n * IC + i];
      }
    }
}

// The dropout multiplier of attention element (b, h, i, j), as layers.h defines its index.
template <typename F>
F attention_dropout_factor(const AttentionDropout& d, int b, int h, int i, int j, int NH, int T) {
  if (!d.active()) return F(1);
  const int64_t heads = d.n_heads_total > 0 ? d.n_heads_total : NH;
  const int64_t index =
      ((d.sample_offset + b) * heads + d.head_offset + h) * int64_t{T} * T + int64_t{i} * T + j;
  return dropout_factor<F>(d.p, d.key, index);
}

// out (B, T, NH*HS), att (B, NH, T, T) <- qkv (B, T, 3*NH*HS); the scratch is not needed.
template <typename F>
void attention_forward(F* out, F* att, const F* qkv, int B, int T, int NH, int HS,
                       const AttentionDropout& drop) {
  const int C = NH * HS;
  const F scale = F(1) / std::sqrt(F(HS));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < T; ++i) {
        const F* q = qkv + (b * T + i) * 3 * C + h * HS;
        F* a = att + ((b * NH + h) * T + i) * T;
        F m = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          const F* k = qkv + (b * T + j) * 3 * C + C + h * HS;
          F s = 0;
          for (int d = 0; d < HS; ++d) s += q[d] * k[d];
          a[j] = s * scale;
          if (a[j] > m) m = a[j];
        }
        F sum = 0;
        for (int j = 0; j <= i; ++j) {
          a[j] = std::exp(a[j] - m);
          sum += a[j];
        }
        for (int j = 0; j < T; ++j) a[j] = j <= i ? a[j] / sum : F(0);
        F* y = out + (b * T + i) * C + h * HS;
        for (int d = 0; d < HS; ++d) y[d] = 0;
        for (int j = 0; j <= i; ++j) {
          const F* v = qkv + (b * T + j) * 3 * C + 2 * C + h * HS;
          const F p = a[j] * attention_dropout_factor<F>(drop, b, h, i, j, NH, T);
          for (int d = 0; d < HS; ++d) y[d] += p * v[d];
        }
      }
}

template <typename F>
void attention_backward(F* dqkv, const F* dout, const F* qkv, const F* att, int B, int T, int NH,
                        int HS, const AttentionDropout& drop) {
  const int C = NH * HS;
  const F scale = F(1) / std::sqrt(F(HS));
  std::vector<F> datt(static_cast<size_t>(T));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < T; ++i) {
        const F* a = att + ((b * NH + h) * T + i) * T;
        const F* dy = dout + (b * T + i) * C + h * HS;
        // d(att)[j] through y = sum_j att_j * factor_j * v_j; also dv.
        F datt_dot = 0;
        for (int j = 0; j <= i; ++j) {
          const F f = attention_dropout_factor<F>(drop, b, h, i, j, NH, T);
          const F* v = qkv + (b * T + j) * 3 * C + 2 * C + h * HS;
          F* dv = dqkv + (b * T + j) * 3 * C + 2 * C + h * HS;
          F s = 0;
          for (int d = 0; d < HS; ++d) {
            s += dy[d] * v[d];
            dv[d] += a[j] * f * dy[d];
          }
          datt[j] = s * f;
          datt_dot += datt[j] * a[j];
        }
        const F* q = qkv + (b * T + i) * 3 * C + h * HS;
        F* dq = dqkv + (b * T + i) * 3 * C + h * HS;
        for (int j = 0; j <= i; ++j) {
          const F dpre = a[j] * (datt[j] - datt_dot) * scale;
          const F* k = qkv + (b * T + j) * 3 * C + C + h * HS;
          F* dk = dqkv + (b * T + j) * 3 * C + C + h * HS;
          for (int d = 0; d < HS; ++d) {
            dq[d] += dpre * k[d];
            dk[d] += dpre * q[d];
          }
        }
      }
}

template <typename F>
F gelu(F x) {
  const F k = std::sqrt(F(2) / std::numbers::pi_v<F>);
  return F(0.5) * x * (F(1) + std::tanh(k * (x + F(0.044715) * x * x * x)));
}

template <typename F>
void gelu_forward(F* out, const F* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gelu(inp[i]);
}

template <typename F>
void gelu_backward(F* dinp, const F* inp, const F* dout, int64_t n) {
  const F k = std::sqrt(F(2) / std::numbers::pi_v<F>);
  for (int64_t i = 0; i < n; ++i) {
    const F x = inp[i];
    const F th = std::tanh(k * (x + F(0.044715) * x * x * x));
    const F local = F(0.5) * (F(1) + th) +
                    F(0.5) * x * (F(1) - th * th) * k * (F(1) + F(3) * F(0.044715) * x * x);
    dinp[i] += local * dout[i];
  }
}

template <typename F>
void residual_forward(F* out, const F* inp1, const F* inp2, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = inp1[i] + inp2[i];
}

template <typename F>
void residual_backward(F* dinp1, F* dinp2, const F* dout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    dinp1[i] += dout[i];
    dinp2[i] += dout[i];
  }
}

// logits (N, V) = inp (N, C) @ wte (V, C)^T
template <typename F>
void lm_head_forward(F* logits, const F* inp, const F* wte, int N, int C, int V) {
  for (int n = 0; n < N; ++n)
    for (int v = 0; v < V; ++v) {
      F s = 0;
      for (int i = 0; i < C; ++i) s += inp[n * C + i] * wte[v * C + i];
      logits[n * V + v] = s;
    }
}

template <typename F>
void lm_head_backward(F* dinp, F* dwte, const F* dlogits, const F* inp, const F* wte, int N, int C,
                      int V) {
  for (int n = 0; n < N; ++n)
    for (int v = 0; v < V; ++v) {
      const F g = dlogits[n * V + v];
      for (int i = 0; i < C; ++i) {
        if (dinp != nullptr) dinp[n * C + i] += g * wte[v * C + i];
        dwte[v * C + i] += g * inp[n * C + i];
      }
    }
}

// losses (N), probs (N, V); probs may equal logits.
template <typename F>
void crossentropy_forward(F* losses, F* probs, const F* logits, const int32_t* targets, int N,
                          int V) {
  for (int n = 0; n < N; ++n) {
    const F* l = logits + n * V;
    F m = l[0];
    for (int v = 1; v < V; ++v) m = l[v] > m ? l[v] : m;
    F sum = 0;
    for (int v = 0; v < V; ++v) sum += std::exp(l[v] - m);
    const F lse = m + std::log(sum);
    if (targets != nullptr) losses[n] = lse - l[targets[n]];
    for (int v = 0; v < V; ++v) probs[n * V + v] = std::exp(l[v] - lse);
  }
}

template <typename F>
void crossentropy_backward(F* dlogits, const F* probs, const int32_t* targets, F dloss, int N,
                           int V) {
  for (int n = 0; n < N; ++n)
    for (int v = 0; v < V; ++v)
      dlogits[n * V + v] += (probs[n * V + v] - (v == targets[n] ? F(1) : F(0))) * dloss;
}

}  // namespace tandem::nn::ref
