// A naive Llama (RMSNorm, rotate_half RoPE, grouped-query attention, SwiGLU, optional q/k/v
// biases, tied or untied head) templated on the scalar type: the oracle the Llama model tests
// compare the optimised f32 model against, and differentiate by finite differences in double.
//
// Written from the definitions, apart from the optimised code: its own loops for the Llama layers
// (the linear, head, cross-entropy and dropout kernels are reference.h's naive ones), every
// intermediate in its own vector, the backward written out by hand, the tensors looked up by name
// in gpt_parameter_specs(c)'s layout. What it shares with the model on purpose: the rotary
// frequencies (rope_inv_freq) and the angle as the f32 product position * inv_freq, so that both
// rotate by the same angles, and the dropout masks (site_dropout, attention_dropout).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/nn/gpt.h"
#include "tandem/nn/reference.h"

namespace tandem::nn::testing {

template <typename F>
class ReferenceLlama {
 public:
  explicit ReferenceLlama(const GPTConfig& c)
      : c_(c),
        specs_(gpt_parameter_specs(c)),
        inv_freq_(rope_inv_freq(c.head_size(), c.rope_theta, c.rope_scaling)) {
    TANDEM_CHECK(c.llama(), "ReferenceLlama of a {} config", arch_name(c.arch));
  }

  // The mean loss over the batch; when grads is not null, also grads += d(dloss * loss)/d(params).
  F run(const std::vector<F>& params, std::vector<F>* grads, const std::vector<int32_t>& tokens,
        const std::vector<int32_t>& targets, int B, int T, const StepRng& rng,
        F dloss = F(1)) const {
    const int C = c_.d_model, V = c_.vocab_size, L = c_.n_layers;
    const int QKV = static_cast<int>(c_.qkv_width()), FF = static_cast<int>(c_.mlp_width());
    const int N = B * T;
    const int64_t n = int64_t{N} * C;
    // A tensor's weights and gradient by name; null for one with no elements.
    const auto P = [&](const std::string& name) { return at(params.data(), name); };
    const auto G = [&](const std::string& name) { return at(grads->data(), name); };
    const auto vec = [](int64_t size) { return std::vector<F>(static_cast<size_t>(size)); };
    const std::string head = c_.tie_embeddings ? "wte.weight" : "lm_head.weight";

    struct Layer {
      std::vector<F> x, ln1, r1, qkv, att, y, proj1, res1, ln2, r2, fc, h, proj2;
    };
    std::vector<Layer> ls(static_cast<size_t>(L));
    // Embedding: token rows only (the positions are rotary, inside attention).
    std::vector<F> x = vec(n), enc = vec(n);
    const F* wte = P("wte.weight");
    for (int r = 0; r < N; ++r)
      for (int i = 0; i < C; ++i)
        enc[static_cast<size_t>(r * C + i)] = wte[tokens[static_cast<size_t>(r)] * C + i];
    ref::dropout_forward(x.data(), enc.data(), n,
                         site_dropout(c_, rng, -1, DropoutSite::Embedding, T));
    // Blocks.
    for (int l = 0; l < L; ++l) {
      Layer& s = ls[static_cast<size_t>(l)];
      const std::string h = "h." + std::to_string(l) + ".";
      s.x = x;
      s.ln1 = vec(n), s.r1 = vec(N), s.qkv = vec(int64_t{N} * QKV), s.y = vec(n);
      s.att = vec(int64_t{B} * c_.n_heads * T * T), s.proj1 = vec(n), s.res1 = vec(n);
      s.ln2 = vec(n), s.r2 = vec(N), s.fc = vec(int64_t{N} * 2 * FF), s.h = vec(int64_t{N} * FF);
      s.proj2 = vec(n);
      rmsnorm_forward(s.ln1.data(), s.r1.data(), s.x.data(), P(h + "ln_1.weight"), N);
      ref::linear_forward(s.qkv.data(), s.ln1.data(), P(h + "attn.c_attn.weight"),
                          P(h + "attn.c_attn.bias"), N, C, QKV);
      rope(s.qkv.data(), B, T, false);  // q and k rotated in place
      attention_forward(s.y.data(), s.att.data(), s.qkv.data(), B, T,
                        attention_dropout(c_, rng, l));
      std::vector<F> dropped = vec(n);
      ref::linear_forward(s.proj1.data(), s.y.data(), P(h + "attn.c_proj.weight"),
                          static_cast<const F*>(nullptr), N, C, C);
      ref::dropout_forward(dropped.data(), s.proj1.data(), n,
                           site_dropout(c_, rng, l, DropoutSite::AttnResidual, T));
      for (int64_t i = 0; i < n; ++i) s.res1[i] = s.x[i] + dropped[i];
      rmsnorm_forward(s.ln2.data(), s.r2.data(), s.res1.data(), P(h + "ln_2.weight"), N);
      ref::linear_forward(s.fc.data(), s.ln2.data(), P(h + "mlp.c_fc.weight"),
                          static_cast<const F*>(nullptr), N, C, 2 * FF);
      for (int r = 0; r < N; ++r)
        for (int j = 0; j < FF; ++j) {
          const F g = s.fc[static_cast<size_t>(r * 2 * FF + j)];
          const F u = s.fc[static_cast<size_t>(r * 2 * FF + FF + j)];
          s.h[static_cast<size_t>(r * FF + j)] = g * sigmoid(g) * u;  // silu(gate) * up
        }
      ref::linear_forward(s.proj2.data(), s.h.data(), P(h + "mlp.c_proj.weight"),
                          static_cast<const F*>(nullptr), N, FF, C);
      ref::dropout_forward(dropped.data(), s.proj2.data(), n,
                           site_dropout(c_, rng, l, DropoutSite::MlpResidual, T));
      for (int64_t i = 0; i < n; ++i) x[i] = s.res1[i] + dropped[i];
    }
    // Final: RMSNorm, the head, the mean cross-entropy.
    std::vector<F> lnf = vec(n), rf = vec(N), logits = vec(int64_t{N} * V),
                   probs = vec(int64_t{N} * V), losses = vec(N);
    rmsnorm_forward(lnf.data(), rf.data(), x.data(), P("ln_f.weight"), N);
    ref::lm_head_forward(logits.data(), lnf.data(), P(head), N, C, V);
    ref::crossentropy_forward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
    F loss = 0;
    for (F v : losses) loss += v;
    loss /= N;
    if (grads == nullptr) return loss;

    // Backward, every intermediate gradient in a fresh zeroed vector.
    std::vector<F> dlogits = vec(int64_t{N} * V), dlnf = vec(n), dx = vec(n);
    ref::crossentropy_backward(dlogits.data(), probs.data(), targets.data(), dloss / F(N), N, V);
    ref::lm_head_backward(dlnf.data(), G(head), dlogits.data(), lnf.data(), P(head), N, C, V);
    rmsnorm_backward(dx.data(), G("ln_f.weight"), dlnf.data(), x.data(), P("ln_f.weight"),
                     rf.data(), N);
    for (int l = L - 1; l >= 0; --l) {
      const Layer& s = ls[static_cast<size_t>(l)];
      const std::string h = "h." + std::to_string(l) + ".";
      // MLP half: out = res1 + dropout(c_proj(swiglu(c_fc(rmsnorm(res1))))).
      std::vector<F> dres1 = dx, dproj2 = vec(n), dh = vec(int64_t{N} * FF),
                     dfc = vec(int64_t{N} * 2 * FF), dln2 = vec(n);
      ref::dropout_backward(dproj2.data(), dx.data(), n,
                            site_dropout(c_, rng, l, DropoutSite::MlpResidual, T));
      ref::linear_backward(dh.data(), G(h + "mlp.c_proj.weight"), static_cast<F*>(nullptr),
                           dproj2.data(), s.h.data(), P(h + "mlp.c_proj.weight"), N, FF, C);
      for (int r = 0; r < N; ++r)
        for (int j = 0; j < FF; ++j) {
          const F g = s.fc[static_cast<size_t>(r * 2 * FF + j)];
          const F u = s.fc[static_cast<size_t>(r * 2 * FF + FF + j)];
          const F d = dh[static_cast<size_t>(r * FF + j)];
          const F sg = sigmoid(g);
          // d silu(g) / dg = sigmoid(g) + g sigmoid(g) (1 - sigmoid(g))
          dfc[static_cast<size_t>(r * 2 * FF + j)] += d * u * (sg + g * sg * (F(1) - sg));
          dfc[static_cast<size_t>(r * 2 * FF + FF + j)] += d * g * sg;
        }
      ref::linear_backward(dln2.data(), G(h + "mlp.c_fc.weight"), static_cast<F*>(nullptr),
                           dfc.data(), s.ln2.data(), P(h + "mlp.c_fc.weight"), N, C, 2 * FF);
      rmsnorm_backward(dres1.data(), G(h + "ln_2.weight"), dln2.data(), s.res1.data(),
                       P(h + "ln_2.weight"), s.r2.data(), N);
      // Attention half: res1 = x + dropout(c_proj(attention(rope(c_attn(rmsnorm(x)))))).
      std::vector<F> dxin = dres1, dproj1 = vec(n), dy = vec(n), dqkv = vec(int64_t{N} * QKV),
                     dln1 = vec(n);
      ref::dropout_backward(dproj1.data(), dres1.data(), n,
                            site_dropout(c_, rng, l, DropoutSite::AttnResidual, T));
      ref::linear_backward(dy.data(), G(h + "attn.c_proj.weight"), static_cast<F*>(nullptr),
                           dproj1.data(), s.y.data(), P(h + "attn.c_proj.weight"), N, C, C);
      attention_backward(dqkv.data(), dy.data(), s.qkv.data(), s.att.data(), B, T,
                         attention_dropout(c_, rng, l));
      rope(dqkv.data(), B, T, true);  // back through the rotation: its transpose
      ref::linear_backward(dln1.data(), G(h + "attn.c_attn.weight"), G(h + "attn.c_attn.bias"),
                           dqkv.data(), s.ln1.data(), P(h + "attn.c_attn.weight"), N, C, QKV);
      rmsnorm_backward(dxin.data(), G(h + "ln_1.weight"), dln1.data(), s.x.data(),
                       P(h + "ln_1.weight"), s.r1.data(), N);
      dx = dxin;
    }
    std::vector<F> denc = vec(n);
    ref::dropout_backward(denc.data(), dx.data(), n,
                          site_dropout(c_, rng, -1, DropoutSite::Embedding, T));
    F* dwte = G("wte.weight");
    for (int r = 0; r < N; ++r)
      for (int i = 0; i < C; ++i)
        dwte[tokens[static_cast<size_t>(r)] * C + i] += denc[static_cast<size_t>(r * C + i)];
    return loss;
  }

 private:
  // The tensor called `name` in `base`'s layout, or null when it has no elements (a bias or a
  // wpe Llama lacks). Names not in the layout are the test's bug.
  F* at(F* base, const std::string& name) const {
    for (const ParamSpec& s : specs_)
      if (s.name == name) return s.numel() == 0 ? nullptr : base + s.offset;
    internal_error("ReferenceLlama: no parameter " + name);
  }
  const F* at(const F* base, const std::string& name) const {
    return at(const_cast<F*>(base), name);
  }

  static F sigmoid(F v) { return F(1) / (F(1) + std::exp(-v)); }

  // out (N, C), rstd (N) = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps) per row.
  void rmsnorm_forward(F* out, F* rstd, const F* x, const F* w, int N) const {
    const int C = c_.d_model;
    for (int r = 0; r < N; ++r) {
      F ss = 0;
      for (int i = 0; i < C; ++i) ss += x[r * C + i] * x[r * C + i];
      rstd[r] = F(1) / std::sqrt(ss / F(C) + F(c_.norm_eps));
      for (int i = 0; i < C; ++i) out[r * C + i] = x[r * C + i] * rstd[r] * w[i];
    }
  }

  // d rstd / d x_i = -rstd^3 x_i / C, so dx_i += rstd w_i g_i - x_i rstd^3 / C sum_j w_j g_j x_j;
  // dw_i += x_i rstd g_i.
  void rmsnorm_backward(F* dx, F* dw, const F* g, const F* x, const F* w, const F* rstd,
                        int N) const {
    const int C = c_.d_model;
    for (int r = 0; r < N; ++r) {
      const F s = rstd[r];
      F wgx = 0;
      for (int j = 0; j < C; ++j) wgx += w[j] * g[r * C + j] * x[r * C + j];
      for (int i = 0; i < C; ++i) {
        dx[r * C + i] += s * w[i] * g[r * C + i] - x[r * C + i] * s * s * s / F(C) * wgx;
        dw[i] += x[r * C + i] * s * g[r * C + i];
      }
    }
  }

  // Rotates the q heads and the k heads of every qkv row (N, QKV) in place, Hugging Face's
  // rotate_half: the pair (i, i + HS/2) at position t by the angle t * inv_freq[i], formed as an
  // f32 product like the model's; with inverse, by minus that angle (the transpose, which is the
  // rotation's backward). v is left alone.
  void rope(F* qkv, int B, int T, bool inverse) const {
    const int HS = c_.head_size(), half = HS / 2, QKV = static_cast<int>(c_.qkv_width());
    const int heads = c_.n_heads + c_.n_kv_heads();  // q heads then k heads, contiguous
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t)
        for (int hd = 0; hd < heads; ++hd) {
          F* x = qkv + (b * T + t) * QKV + hd * HS;
          for (int i = 0; i < half; ++i) {
            const float angle = static_cast<float>(t) * inv_freq_[static_cast<size_t>(i)];
            const F cs = std::cos(F(angle));
            const F sn = inverse ? -std::sin(F(angle)) : std::sin(F(angle));
            const F x1 = x[i], x2 = x[i + half];
            x[i] = x1 * cs - x2 * sn;
            x[i + half] = x2 * cs + x1 * sn;
          }
        }
  }

  // Offsets in a qkv row of query head h and of key and value head g.
  int q_at(int h) const { return h * c_.head_size(); }
  int k_at(int g) const { return c_.d_model + g * c_.head_size(); }
  int v_at(int g) const { return c_.d_model + (c_.n_kv_heads() + g) * c_.head_size(); }
  // The key/value head query head h reads: heads are grouped consecutively.
  int kv_of(int h) const { return h / (c_.n_heads / c_.n_kv_heads()); }

  // y (B, T, C), att (B, NH, T, T) from the rotated qkv (B, T, QKV): causal softmax of
  // q.k / sqrt(HS) per query head against its key head, then the dropped probabilities times v.
  void attention_forward(F* y, F* att, const F* qkv, int B, int T,
                         const AttentionDropout& drop) const {
    const int NH = c_.n_heads, HS = c_.head_size(), C = c_.d_model;
    const int QKV = static_cast<int>(c_.qkv_width());
    const F scale = F(1) / std::sqrt(F(HS));
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < NH; ++h) {
        const int g = kv_of(h);
        for (int i = 0; i < T; ++i) {
          const F* q = qkv + (b * T + i) * QKV + q_at(h);
          F* a = att + ((b * NH + h) * T + i) * T;
          F m = -INFINITY;
          for (int j = 0; j <= i; ++j) {
            const F* k = qkv + (b * T + j) * QKV + k_at(g);
            F dot = 0;
            for (int d = 0; d < HS; ++d) dot += q[d] * k[d];
            a[j] = dot * scale;
            m = a[j] > m ? a[j] : m;
          }
          F sum = 0;
          for (int j = 0; j <= i; ++j) sum += (a[j] = std::exp(a[j] - m));
          for (int j = 0; j < T; ++j) a[j] = j <= i ? a[j] / sum : F(0);
          F* out = y + (b * T + i) * C + h * HS;
          for (int d = 0; d < HS; ++d) out[d] = 0;
          for (int j = 0; j <= i; ++j) {
            const F p = a[j] * ref::attention_dropout_factor<F>(drop, b, h, i, j, NH, T);
            const F* v = qkv + (b * T + j) * QKV + v_at(g);
            for (int d = 0; d < HS; ++d) out[d] += p * v[d];
          }
        }
      }
  }

  // dqkv (B, T, QKV) += the gradient through attention_forward for dy (B, T, C); the query heads
  // of a group add into their shared key and value heads.
  void attention_backward(F* dqkv, const F* dy, const F* qkv, const F* att, int B, int T,
                          const AttentionDropout& drop) const {
    const int NH = c_.n_heads, HS = c_.head_size(), C = c_.d_model;
    const int QKV = static_cast<int>(c_.qkv_width());
    const F scale = F(1) / std::sqrt(F(HS));
    std::vector<F> datt(static_cast<size_t>(T));
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < NH; ++h) {
        const int g = kv_of(h);
        for (int i = 0; i < T; ++i) {
          const F* a = att + ((b * NH + h) * T + i) * T;
          const F* go = dy + (b * T + i) * C + h * HS;
          // y_i = sum_j a_j f_j v_j: d a_j = f_j (dy . v_j), d v_j += a_j f_j dy.
          F dot = 0;  // sum_j a_j d a_j
          for (int j = 0; j <= i; ++j) {
            const F f = ref::attention_dropout_factor<F>(drop, b, h, i, j, NH, T);
            const F* v = qkv + (b * T + j) * QKV + v_at(g);
            F* dv = dqkv + (b * T + j) * QKV + v_at(g);
            F s = 0;
            for (int d = 0; d < HS; ++d) {
              s += go[d] * v[d];
              dv[d] += a[j] * f * go[d];
            }
            datt[static_cast<size_t>(j)] = s * f;
            dot += a[j] * datt[static_cast<size_t>(j)];
          }
          // Softmax: d score_j = a_j (d a_j - dot); score_j = q . k_j * scale.
          const F* q = qkv + (b * T + i) * QKV + q_at(h);
          F* dq = dqkv + (b * T + i) * QKV + q_at(h);
          for (int j = 0; j <= i; ++j) {
            const F ds = a[j] * (datt[static_cast<size_t>(j)] - dot) * scale;
            const F* k = qkv + (b * T + j) * QKV + k_at(g);
            F* dk = dqkv + (b * T + j) * QKV + k_at(g);
            for (int d = 0; d < HS; ++d) {
              dq[d] += ds * k[d];
              dk[d] += ds * q[d];
            }
          }
        }
      }
  }

  GPTConfig c_;
  std::vector<ParamSpec> specs_;
  std::vector<float> inv_freq_;
};

}  // namespace tandem::nn::testing
