// A naive GPT-2 built from the reference kernels, templated on the scalar type: the oracle the
// model tests compare the optimised f32 model against, and differentiate by finite differences in
// double. It keeps every intermediate in its own vector and writes the residual backward out
// explicitly, so it shares none of the optimised model's buffer reuse.
#pragma once

#include <cstdint>
#include <vector>

#include "tandem/nn/gpt.h"
#include "tandem/nn/reference.h"

namespace tandem::nn::testing {

template <typename F>
class ReferenceGPT {
 public:
  explicit ReferenceGPT(const GPTConfig& c) : c_(c), specs_(gpt_parameter_specs(c)) {}

  // The mean loss over the batch; when grads is not null, also grads += d(dloss * loss)/d(params).
  F run(const std::vector<F>& params, std::vector<F>* grads, const std::vector<int32_t>& tokens,
        const std::vector<int32_t>& targets, int B, int T, const StepRng& rng,
        F dloss = F(1)) const {
    const int C = c_.d_model, V = c_.vocab_size, NH = c_.n_heads, HS = c_.head_size(),
              L = c_.n_layers;
    const int N = B * T;
    const int64_t n = int64_t{N} * C;
    const auto P = [&](size_t i) { return params.data() + specs_[i].offset; };
    const auto G = [&](size_t i) { return grads->data() + specs_[i].offset; };
    const auto vec = [](int64_t size) { return std::vector<F>(static_cast<size_t>(size)); };

    struct Layer {
      std::vector<F> x, ln1, m1, r1s, qkv, att, y, proj1, drop1, res1, ln2, m2, r2s, fc, gelu,
          proj2, drop2;
    };
    std::vector<Layer> ls(static_cast<size_t>(L));
    // Embedding.
    std::vector<F> enc = vec(n), x = vec(n);
    ref::encoder_forward(enc.data(), tokens.data(), P(0), P(1), B, T, C);
    ref::dropout_forward(x.data(), enc.data(), n,
                         site_dropout(c_, rng, -1, DropoutSite::Embedding, T));
    // Blocks.
    for (int l = 0; l < L; ++l) {
      Layer& s = ls[static_cast<size_t>(l)];
      const size_t b = 2 + 12 * static_cast<size_t>(l);
      s.x = x;
      s.ln1 = vec(n), s.m1 = vec(N), s.r1s = vec(N), s.qkv = vec(3 * n), s.y = vec(n);
      s.att = vec(int64_t{B} * NH * T * T), s.proj1 = vec(n), s.drop1 = vec(n), s.res1 = vec(n);
      s.ln2 = vec(n), s.m2 = vec(N), s.r2s = vec(N), s.fc = vec(4 * n), s.gelu = vec(4 * n);
      s.proj2 = vec(n), s.drop2 = vec(n);
      ref::layernorm_forward(s.ln1.data(), s.m1.data(), s.r1s.data(), s.x.data(), P(b), P(b + 1), N,
                             C);
      ref::linear_forward(s.qkv.data(), s.ln1.data(), P(b + 2), P(b + 3), N, C, 3 * C);
      ref::attention_forward(s.y.data(), s.att.data(), s.qkv.data(), B, T, NH, HS,
                             attention_dropout(c_, rng, l));
      ref::linear_forward(s.proj1.data(), s.y.data(), P(b + 4), P(b + 5), N, C, C);
      ref::dropout_forward(s.drop1.data(), s.proj1.data(), n,
                           site_dropout(c_, rng, l, DropoutSite::AttnResidual, T));
      ref::residual_forward(s.res1.data(), s.x.data(), s.drop1.data(), n);
      ref::layernorm_forward(s.ln2.data(), s.m2.data(), s.r2s.data(), s.res1.data(), P(b + 6),
                             P(b + 7), N, C);
      ref::linear_forward(s.fc.data(), s.ln2.data(), P(b + 8), P(b + 9), N, C, 4 * C);
      ref::gelu_forward(s.gelu.data(), s.fc.data(), 4 * n);
      ref::linear_forward(s.proj2.data(), s.gelu.data(), P(b + 10), P(b + 11), N, 4 * C, C);
      ref::dropout_forward(s.drop2.data(), s.proj2.data(), n,
                           site_dropout(c_, rng, l, DropoutSite::MlpResidual, T));
      ref::residual_forward(x.data(), s.res1.data(), s.drop2.data(), n);
    }
    // Final.
    const size_t f = specs_.size() - 2;
    std::vector<F> lnf = vec(n), mf = vec(N), rf = vec(N), logits = vec(int64_t{N} * V),
                   probs = vec(int64_t{N} * V), losses = vec(N);
    ref::layernorm_forward(lnf.data(), mf.data(), rf.data(), x.data(), P(f), P(f + 1), N, C);
    ref::lm_head_forward(logits.data(), lnf.data(), P(0), N, C, V);
    ref::crossentropy_forward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
    F loss = 0;
    for (F v : losses) loss += v;
    loss /= N;
    if (grads == nullptr) return loss;

    // Backward, every intermediate gradient in a fresh zeroed vector.
    std::vector<F> dlogits = vec(int64_t{N} * V), dlnf = vec(n), dx = vec(n);
    ref::crossentropy_backward(dlogits.data(), probs.data(), targets.data(), dloss / F(N), N, V);
    ref::lm_head_backward(dlnf.data(), G(0), dlogits.data(), lnf.data(), P(0), N, C, V);
    ref::layernorm_backward(dx.data(), G(f), G(f + 1), dlnf.data(), x.data(), P(f), mf.data(),
                            rf.data(), N, C);
    for (int l = L - 1; l >= 0; --l) {
      const Layer& s = ls[static_cast<size_t>(l)];
      const size_t b = 2 + 12 * static_cast<size_t>(l);
      std::vector<F> dres1 = vec(n), ddrop2 = vec(n), dproj2 = vec(n), dgelu = vec(4 * n),
                     dfc = vec(4 * n), dln2 = vec(n), dxin = vec(n), ddrop1 = vec(n),
                     dproj1 = vec(n), dy = vec(n), dqkv = vec(3 * n), dln1 = vec(n);
      ref::residual_backward(dres1.data(), ddrop2.data(), dx.data(), n);
      ref::dropout_backward(dproj2.data(), ddrop2.data(), n,
                            site_dropout(c_, rng, l, DropoutSite::MlpResidual, T));
      ref::linear_backward(dgelu.data(), G(b + 10), G(b + 11), dproj2.data(), s.gelu.data(),
                           P(b + 10), N, 4 * C, C);
      ref::gelu_backward(dfc.data(), s.fc.data(), dgelu.data(), 4 * n);
      ref::linear_backward(dln2.data(), G(b + 8), G(b + 9), dfc.data(), s.ln2.data(), P(b + 8), N,
                           C, 4 * C);
      ref::layernorm_backward(dres1.data(), G(b + 6), G(b + 7), dln2.data(), s.res1.data(),
                              P(b + 6), s.m2.data(), s.r2s.data(), N, C);
      ref::residual_backward(dxin.data(), ddrop1.data(), dres1.data(), n);
      ref::dropout_backward(dproj1.data(), ddrop1.data(), n,
                            site_dropout(c_, rng, l, DropoutSite::AttnResidual, T));
      ref::linear_backward(dy.data(), G(b + 4), G(b + 5), dproj1.data(), s.y.data(), P(b + 4), N, C,
                           C);
      ref::attention_backward(dqkv.data(), dy.data(), s.qkv.data(), s.att.data(), B, T, NH, HS,
                              attention_dropout(c_, rng, l));
      ref::linear_backward(dln1.data(), G(b + 2), G(b + 3), dqkv.data(), s.ln1.data(), P(b + 2), N,
                           C, 3 * C);
      ref::layernorm_backward(dxin.data(), G(b), G(b + 1), dln1.data(), s.x.data(), P(b),
                              s.m1.data(), s.r1s.data(), N, C);
      dx = dxin;
    }
    std::vector<F> denc = vec(n);
    ref::dropout_backward(denc.data(), dx.data(), n,
                          site_dropout(c_, rng, -1, DropoutSite::Embedding, T));
    ref::encoder_backward(G(0), G(1), denc.data(), tokens.data(), B, T, C);
    return loss;
  }

 private:
  GPTConfig c_;
  std::vector<ParamSpec> specs_;
};

}  // namespace tandem::nn::testing
