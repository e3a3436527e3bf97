// Every layer's forward and backward against its naive reference run in double, and the
// reference's backward against central finite differences, on small odd sizes.
//
// The chain of checks for each layer:
//   1. f32 forward  ~ double reference forward       (rtol 1e-5 of max|out|: f32 rounding over
//      sums of at most a few dozen terms stays near 1e-6; the exp/tanh approximations add 2e-7)
//   2. double reference backward ~ finite differences (rtol 1e-6: central differences in double
//      with h = 1e-5 are accurate to about 1e-10 here)
//   3. f32 backward ~ double reference backward      (rtol 2e-5 of max|grad|, as 1 with one more
//      GEMM or reduction in the chain)
//   4. calling the f32 backward twice doubles every gradient (gradients accumulate).
#include "tandem/nn/layers.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "nn/nn_test_util.h"
#include "tandem/core/blas.h"
#include "tandem/core/rng.h"
#include "tandem/nn/reference.h"

namespace tandem::nn {
namespace {

using namespace tandem::nn::testing;
using Vecs = std::vector<std::vector<double>>;
using Vecs32 = std::vector<std::vector<float>>;

struct LayerCase {
  std::string name;
  Vecs inputs;
  std::vector<bool> differentiable;
  std::function<std::vector<double>(const Vecs&)> ref_forward;
  std::function<std::vector<float>(const Vecs32&)> fast_forward;
  // Backward into zeroed gradient buffers (one per input, empty when not differentiable).
  std::function<Vecs(const Vecs&, const std::vector<double>&)> ref_backward;
  // The same, the kernel called `repeats` times on the same buffers.
  std::function<Vecs32(const Vecs32&, const std::vector<float>&, int repeats)> fast_backward;
  double fwd_rtol = 1e-5;
  double bwd_rtol = 2e-5;
  size_t fd_points = 160;  // finite-difference checks per input
};

Vecs32 to_f32(const Vecs& v) {
  Vecs32 out;
  for (const auto& x : v) out.push_back(testing::to_f32(x));
  return out;
}

void check_layer(const LayerCase& c) {
  SCOPED_TRACE(c.name);
  const Vecs32 in32 = to_f32(c.inputs);
  const std::vector<double> out_ref = c.ref_forward(c.inputs);
  EXPECT_TRUE(all_close(c.name + " forward", c.fast_forward(in32), out_ref, c.fwd_rtol));

  const std::vector<double> g = uniform(out_ref.size(), 99);  // the cotangent d(loss)/d(out)
  const Vecs dref = c.ref_backward(c.inputs, g);
  const Vecs32 d32 = c.fast_backward(in32, testing::to_f32(g), 1);
  const Vecs32 d32x2 = c.fast_backward(in32, testing::to_f32(g), 2);
  ASSERT_EQ(dref.size(), c.inputs.size());
  ASSERT_EQ(d32.size(), c.inputs.size());
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (!c.differentiable[i]) continue;
    const std::string what = c.name + " d(input " + std::to_string(i) + ")";
    // The reference backward against finite differences of the reference forward.
    const std::vector<size_t> idx = spread(c.inputs[i].size(), c.fd_points);
    const auto loss = [&](const std::vector<double>& x) {
      Vecs in = c.inputs;
      in[i] = x;
      return dot(c.ref_forward(in), g);
    };
    const std::vector<double> fd = finite_difference(loss, c.inputs[i], idx);
    EXPECT_TRUE(
        all_close(what + " reference vs finite differences", pick(dref[i], idx), fd, 1e-6, 1e-9));
    // The optimised backward against the reference, every element.
    EXPECT_TRUE(all_close(what + " f32 vs reference", d32[i], dref[i], c.bwd_rtol, 1e-7));
    std::vector<double> twice(dref[i].size());
    for (size_t k = 0; k < twice.size(); ++k) twice[k] = 2.0 * d32[i][k];
    EXPECT_TRUE(all_close(what + " accumulates", d32x2[i], twice, 1e-6, 1e-9));
  }
}

TEST(Layers, Encoder) {
  const int B = 2, T = 5, C = 7, V = 11, P = 6;
  const std::vector<int32_t> tok = {3, 0, 10, 3, 3, 7, 1, 10, 2, 5};  // repeats on purpose
  LayerCase c;
  c.name = "encoder";
  c.inputs = {uniform(V * C, 1), uniform(P * C, 2)};
  c.differentiable = {true, true};
  c.ref_forward = [&](const Vecs& in) {
    std::vector<double> out(B * T * C);
    ref::encoder_forward(out.data(), tok.data(), in[0].data(), in[1].data(), B, T, C);
    return out;
  };
  c.fast_forward = [&](const Vecs32& in) {
    std::vector<float> out(B * T * C);
    encoder_forward(out.data(), tok.data(), in[0].data(), in[1].data(), B, T, C);
    return out;
  };
  c.ref_backward = [&](const Vecs& in, const std::vector<double>& g) {
    Vecs d = {std::vector<double>(in[0].size()), std::vector<double>(in[1].size())};
    ref::encoder_backward(d[0].data(), d[1].data(), g.data(), tok.data(), B, T, C);
    return d;
  };
  c.fast_backward = [&](const Vecs32& in, const std::vector<float>& g, int repeats) {
    Vecs32 d = {std::vector<float>(in[0].size()), std::vector<float>(in[1].size())};
    for (int r = 0; r < repeats; ++r)
      encoder_backward(d[0].data(), d[1].data(), g.data(), tok.data(), B, T, C);
    return d;
  };
  check_layer(c);
}

// C = 37: two full lanes of 16 plus a tail, so both paths of the split reductions run.
TEST(Layers, LayerNorm) {
  const int N = 7, C = 37;
  LayerCase c;
  c.name = "layernorm";
  std::vector<double> x = uniform(N * C, 3, -2.0, 2.0);
  for (int i = 0; i < C; ++i) x[2 * C + i] += 50.0;  // a row with a large mean
  c.inputs = {x, uniform(C, 4, 0.5, 1.5), uniform(C, 5)};
  c.differentiable = {true, true, true};
  c.ref_forward = [&](const Vecs& in) {
    std::vector<double> out(N * C), mean(N), rstd(N);
    ref::layernorm_forward(out.data(), mean.data(), rstd.data(), in[0].data(), in[1].data(),
                           in[2].data(), N, C);
    return out;
  };
  c.fast_forward = [&](const Vecs32& in) {
    std::vector<float> out(N * C), mean(N), rstd(N);
    layernorm_forward(out.data(), mean.data(), rstd.data(), in[0].data(), in[1].data(),
                      in[2].data(), N, C);
    return out;
  };
  c.ref_backward = [&](const Vecs& in, const std::vector<double>& g) {
    std::vector<double> out(N * C), mean(N), rstd(N);
    ref::layernorm_forward(out.data(), mean.data(), rstd.data(), in[0].data(), in[1].data(),
                           in[2].data(), N, C);
    Vecs d = {std::vector<double>(N * C), std::vector<double>(C), std::vector<double>(C)};
    ref::layernorm_backward(d[0].data(), d[1].data(), d[2].data(), g.data(), in[0].data(),
                            in[1].data(), mean.data(), rstd.data(), N, C);
    return d;
  };
  c.fast_backward = [&](const Vecs32& in, const std::vector<float>& g, int repeats) {
    std::vector<float> out(N * C), mean(N), rstd(N);
    layernorm_forward(out.data(), mean.data(), rstd.data(), in[0].data(), in[1].data(),
                      in[2].data(), N, C);
    Vecs32 d = {std::vector<float>(N * C), std::vector<float>(C), std::vector<float>(C)};
    for (int r = 0; r < repeats; ++r)
      layernorm_backward(d[0].data(), d[1].data(), d[2].data(), g.data(), in[0].data(),
                         in[1].data(), mean.data(), rstd.data(), N, C);
    return d;
  };
  // The large-mean row loses about log2(50) bits to cancellation in f32 (x - mean).
  c.fwd_rtol = 3e-5;
  c.bwd_rtol = 5e-5;
  check_layer(c);
}

void linear_case(bool with_bias) {
  const int N = 5, IC = 7, OC = 11;
  LayerCase c;
  c.name = with_bias ? "linear" : "linear without bias";
  c.inputs = {uniform(N * IC, 6), uniform(IC * OC, 7), uniform(OC, 8)};
  c.differentiable = {true, true, with_bias};
  c.ref_forward = [&](const Vecs& in) {
    std::vector<double> out(N * OC);
    ref::linear_forward(out.data(), in[0].data(), in[1].data(), with_bias ? in[2].data() : nullptr,
                        N, IC, OC);
    return out;
  };
  c.fast_forward = [&](const Vecs32& in) {
    std::vector<float> out(N * OC);
    linear_forward(out.data(), in[0].data(), in[1].data(), with_bias ? in[2].data() : nullptr, N,
                   IC, OC);
    return out;
  };
  c.ref_backward = [&](const Vecs& in, const std::vector<double>& g) {
    Vecs d = {std::vector<double>(N * IC), std::vector<double>(IC * OC), std::vector<double>(OC)};
    ref::linear_backward(d[0].data(), d[1].data(), with_bias ? d[2].data() : nullptr, g.data(),
                         in[0].data(), in[1].data(), N, IC, OC);
    return d;
  };
  c.fast_backward = [&](const Vecs32& in, const std::vector<float>& g, int repeats) {
    Vecs32 d = {std::vector<float>(N * IC), std::vector<float>(IC * OC), std::vector<float>(OC)};
    for (int r = 0; r < repeats; ++r)
      linear_backward(d[0].data(), d[1].data(), with_bias ? d[2].data() : nullptr, g.data(),
                      in[0].data(), in[1].data(), N, IC, OC);
    return d;
  };
  check_layer(c);
}

TEST(Layers, Linear) { linear_case(true); }
TEST(Layers, LinearWithoutBiasForRowParallel) { linear_case(false); }

// T = 37 spans two of the kernel's 32-row causal chunks.
void attention_case(float p) {
  const int B = 2, T = 37, NH = 2, HS = 3, C = NH * HS;
  AttentionDropout drop;
  drop.p = p;
  drop.key = 1234;
  LayerCase c;
  c.name = p > 0 ? "attention with dropout" : "attention";
  c.inputs = {uniform(B * T * 3 * C, 9, -2.0, 2.0)};
  c.differentiable = {true};
  c.ref_forward = [&](const Vecs& in) {
    std::vector<double> out(B * T * C), att(B * NH * T * T);
    ref::attention_forward(out.data(), att.data(), in[0].data(), B, T, NH, HS, drop);
    return out;
  };
  c.fast_forward = [&](const Vecs32& in) {
    std::vector<float> out(B * T * C), att(B * NH * T * T), scratch(attention_scratch_floats(T));
    attention_forward(out.data(), att.data(), scratch.data(), in[0].data(), B, T, NH, NH, HS, drop);
    return out;
  };
  c.ref_backward = [&](const Vecs& in, const std::vector<double>& g) {
    std::vector<double> out(B * T * C), att(B * NH * T * T);
    ref::attention_forward(out.data(), att.data(), in[0].data(), B, T, NH, HS, drop);
    Vecs d = {std::vector<double>(in[0].size())};
    ref::attention_backward(d[0].data(), g.data(), in[0].data(), att.data(), B, T, NH, HS, drop);
    return d;
  };
  c.fast_backward = [&](const Vecs32& in, const std::vector<float>& g, int repeats) {
    std::vector<float> out(B * T * C), att(B * NH * T * T), scratch(attention_scratch_floats(T));
    attention_forward(out.data(), att.data(), scratch.data(), in[0].data(), B, T, NH, NH, HS, drop);
    Vecs32 d = {std::vector<float>(in[0].size())};
    for (int r = 0; r < repeats; ++r)
      attention_backward(d[0].data(), scratch.data(), g.data(), in[0].data(), att.data(), B, T, NH,
                         NH, HS, drop);
    return d;
  };
  check_layer(c);
}

TEST(Layers, Attention) { attention_case(0.0f); }
TEST(Layers, AttentionWithDropout) { attention_case(0.25f); }

TEST(Layers, AttentionSavesCausalSoftmax) {
  const int B = 1, T = 9, NH = 3, HS = 4, C = NH * HS;
  const std::vector<float> qkv = testing::to_f32(uniform(B * T * 3 * C, 10, -3.0, 3.0));
  std::vector<float> out(B * T * C), att(B * NH * T * T, -1.0f),
      scratch(attention_scratch_floats(T));
  attention_forward(out.data(), att.data(), scratch.data(), qkv.data(), B, T, NH, NH, HS, {});
  for (int h = 0; h < NH; ++h)
    for (int i = 0; i < T; ++i) {
      double row = 0.0;
      for (int j = 0; j < T; ++j) {
        const float a = att[(h * T + i) * T + j];
        if (j > i)
          EXPECT_EQ(a, 0.0f) << "head " << h << " row " << i << " col " << j;
        else
          EXPECT_GT(a, 0.0f);
        row += a;
      }
      EXPECT_NEAR(row, 1.0, 1e-6) << "head " << h << " row " << i;
    }
}

TEST(Layers, Gelu) {
  const int64_t n = 53;
  LayerCase c;
  c.name = "gelu";
  c.inputs = {uniform(n, 11, -6.0, 6.0)};
  c.differentiable = {true};
  c.ref_forward = [&](const Vecs& in) {
    std::vector<double> out(n);
    ref::gelu_forward(out.data(), in[0].data(), n);
    return out;
  };
  c.fast_forward = [&](const Vecs32& in) {
    std::vector<float> out(n);
    gelu_forward(out.data(), in[0].data(), n);
    return out;
  };
  c.ref_backward = [&](const Vecs& in, const std::vector<double>& g) {
    Vecs d = {std::vector<double>(n)};
    ref::gelu_backward(d[0].data(), in[0].data(), g.data(), n);
    return d;
  };
  c.fast_backward = [&](const Vecs32& in, const std::vector<float>& g, int repeats) {
    Vecs32 d = {std::vector<float>(n)};
    for (int r = 0; r < repeats; ++r) gelu_backward(d[0].data(), in[0].data(), g.data(), n);
    return d;
  };
  check_layer(c);
}

TEST(Layers, Dropout) {
  const int64_t n = 101;
  const Dropout drop{0.3f, 777, 5};  // an offset that is not a multiple of 4 (Philox blocks)
  LayerCase c;
  c.name = "dropout";
  c.inputs = {uniform(n, 12)};
  c.differentiable = {true};
  c.ref_forward = [&](const Vecs& in) {
    std::vector<double> out(n);
    ref::dropout_forward(out.data(), in[0].data(), n, drop);
    return out;
  };
  c.fast_forward = [&](const Vecs32& in) {
    std::vector<float> out(n);
    dropout_forward(out.data(), in[0].data(), n, drop);
    return out;
  };
  c.ref_backward = [&](const Vecs&, const std::vector<double>& g) {
    Vecs d = {std::vector<double>(n)};
    ref::dropout_backward(d[0].data(), g.data(), n, drop);
    return d;
  };
  c.fast_backward = [&](const Vecs32&, const std::vector<float>& g, int repeats) {
    Vecs32 d = {std::vector<float>(n)};
    for (int r = 0; r < repeats; ++r) dropout_backward(d[0].data(), g.data(), n, drop);
    return d;
  };
  check_layer(c);
}

TEST(Layers, Residual) {
  const int64_t n = 29;
  LayerCase c;
  c.name = "residual";
  c.inputs = {uniform(n, 13), uniform(n, 14)};
  c.differentiable = {true, true};
  c.ref_forward = [&](const Vecs& in) {
    std::vector<double> out(n);
    ref::residual_forward(out.data(), in[0].data(), in[1].data(), n);
    return out;
  };
  c.fast_forward = [&](const Vecs32& in) {
    std::vector<float> out(n);
    residual_forward(out.data(), in[0].data(), in[1].data(), n);
    return out;
  };
  c.ref_backward = [&](const Vecs&, const std::vector<double>& g) {
    Vecs d = {std::vector<double>(n), std::vector<double>(n)};
    ref::residual_backward(d[0].data(), d[1].data(), g.data(), n);
    return d;
  };
  c.fast_backward = [&](const Vecs32&, const std::vector<float>& g, int repeats) {
    Vecs32 d = {std::vector<float>(n), std::vector<float>(n)};
    for (int r = 0; r < repeats; ++r) residual_backward(d[0].data(), d[1].data(), g.data(), n);
    return d;
  };
  check_layer(c);
}

TEST(Layers, TiedLmHead) {
  const int N = 6, C = 5, V = 13;
  LayerCase c;
  c.name = "lm_head";
  c.inputs = {uniform(N * C, 15), uniform(V * C, 16)};
  c.differentiable = {true, true};
  c.ref_forward = [&](const Vecs& in) {
    std::vector<double> out(N * V);
    ref::lm_head_forward(out.data(), in[0].data(), in[1].data(), N, C, V);
    return out;
  };
  c.fast_forward = [&](const Vecs32& in) {
    std::vector<float> out(N * V);
    lm_head_forward(out.data(), in[0].data(), in[1].data(), N, C, V);
    return out;
  };
  c.ref_backward = [&](const Vecs& in, const std::vector<double>& g) {
    Vecs d = {std::vector<double>(N * C), std::vector<double>(V * C)};
    ref::lm_head_backward(d[0].data(), d[1].data(), g.data(), in[0].data(), in[1].data(), N, C, V);
    return d;
  };
  c.fast_backward = [&](const Vecs32& in, const std::vector<float>& g, int repeats) {
    Vecs32 d = {std::vector<float>(N * C), std::vector<float>(V * C)};
    for (int r = 0; r < repeats; ++r)
      lm_head_backward(d[0].data(), d[1].data(), g.data(), in[0].data(), in[1].data(), N, C, V);
    return d;
  };
  check_layer(c);
}

// The loss is a weighted sum of per-token losses here, so the cotangent of every token is the
// same scalar dloss, as crossentropy_backward takes it: the harness's random cotangent is
// replaced by that constant.
TEST(Layers, CrossEntropy) {
  const int N = 7, V = 19;
  const std::vector<int32_t> targets = {0, 18, 5, 5, 11, 2, 17};
  const double dloss = 1.0 / N;
  const Vecs inputs = {uniform(N * V, 17, -4.0, 4.0)};
  const auto ref_losses = [&](const std::vector<double>& logits) {
    std::vector<double> losses(N), probs(N * V);
    ref::crossentropy_forward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
    return losses;
  };
  // Forward: losses and probabilities (the fast kernel in place, as the model runs it).
  std::vector<float> probs32 = testing::to_f32(inputs[0]);
  std::vector<float> losses32(N);
  crossentropy_forward(losses32.data(), probs32.data(), probs32.data(), targets.data(), N, V);
  std::vector<double> probs(N * V), losses(N);
  ref::crossentropy_forward(losses.data(), probs.data(), inputs[0].data(), targets.data(), N, V);
  EXPECT_TRUE(all_close("crossentropy losses", losses32, losses, 1e-6));
  EXPECT_TRUE(all_close("crossentropy probs", probs32, probs, 1e-6));
  // Backward against finite differences of the mean loss.
  std::vector<double> dref(N * V);
  ref::crossentropy_backward(dref.data(), probs.data(), targets.data(), dloss, N, V);
  const auto mean_loss = [&](const std::vector<double>& x) {
    double s = 0.0;
    for (double l : ref_losses(x)) s += l * dloss;
    return s;
  };
  const std::vector<size_t> all = spread(N * V, N * V);
  EXPECT_TRUE(all_close("crossentropy reference vs finite differences", dref,
                        finite_difference(mean_loss, inputs[0], all), 1e-6, 1e-9));
  std::vector<float> d32(N * V, 0.0f);
  crossentropy_backward(d32.data(), probs32.data(), targets.data(), static_cast<float>(dloss), N,
                        V);
  EXPECT_TRUE(all_close("crossentropy f32 vs reference", d32, dref, 1e-5, 1e-8));
  // The in-place variants (the chunked LM head's): the same losses and gradient bit for bit.
  std::vector<float> scratch = testing::to_f32(inputs[0]), in_place = scratch;
  std::vector<float> losses_in_place(N);
  crossentropy_loss_inplace(losses_in_place.data(), scratch.data(), targets.data(), N, V);
  EXPECT_EQ(losses_in_place, losses32);
  crossentropy_backward_inplace(in_place.data(), targets.data(), static_cast<float>(dloss), N, V);
  EXPECT_EQ(in_place, d32);
}

TEST(Layers, CrossEntropyWithoutTargetsGivesProbabilities) {
  const int N = 3, V = 300;  // V above the lanes, odd
  std::vector<float> logits = testing::to_f32(uniform(N * V, 18, -30.0, 30.0));
  std::vector<float> probs(N * V);
  crossentropy_forward(nullptr, probs.data(), logits.data(), nullptr, N, V);
  for (int n = 0; n < N; ++n) {
    double s = 0.0;
    for (int v = 0; v < V; ++v) s += probs[n * V + v];
    EXPECT_NEAR(s, 1.0, 1e-5);
  }
}

}  // namespace
}  // namespace tandem::nn

namespace tandem::nn {
namespace {

// Heads and elementwise passes split over threads (core/parallel.h): results are bitwise the same
// at one and at two threads.
TEST(Layers, ThreadCountDoesNotChangeAnyBit) {
  const int B = 3, T = 37, NH = 3, HS = 5, C = NH * HS;
  AttentionDropout drop;
  drop.p = 0.2f;
  drop.key = 99;
  const std::vector<float> qkv = testing::to_f32(uniform(B * T * 3 * C, 5, -2.0, 2.0));
  const std::vector<float> g = testing::to_f32(uniform(B * T * C, 6, -1.0, 1.0));
  const std::vector<float> x =
      testing::to_f32(uniform(100003, 7, -3.0, 3.0));  // above the split grain
  const std::vector<float> y = testing::to_f32(uniform(x.size(), 8, -3.0, 3.0));
  // Row-wise layers and row reductions at sizes that split both rows and column blocks (700 rows
  // of 100 columns: 7 blocks of 16, the last one partial).
  // IC = 0 leaves linear_backward only its bias gradient: OpenBLAS's own GEMM bits may depend on
  // its thread count, which is not this contract.
  const int N = 700, W = 100, IC = 0, V = 50, EB = 7, ET = 100;
  const std::vector<float> rows = testing::to_f32(uniform(N * W, 9, -2.0, 2.0));
  const std::vector<float> drows = testing::to_f32(uniform(N * W, 10, -1.0, 1.0));
  const std::vector<float> lnw = testing::to_f32(uniform(W, 11, 0.5, 1.5));
  const std::vector<float> lnb = testing::to_f32(uniform(W, 12, -0.5, 0.5));
  const std::vector<float> lin = testing::to_f32(uniform(N * IC, 13, -1.0, 1.0));
  const std::vector<float> linw = testing::to_f32(uniform(IC * W, 14, -1.0, 1.0));
  const std::vector<float> wte = testing::to_f32(uniform(V * W, 15, -1.0, 1.0));
  const std::vector<float> wpe = testing::to_f32(uniform(ET * W, 16, -1.0, 1.0));
  std::vector<int32_t> targets(N), tokens(EB * ET);
  for (int n = 0; n < N; ++n) targets[n] = (n * 7) % W;
  for (int i = 0; i < EB * ET; ++i) tokens[i] = (i * 13) % V;  // tokens repeat: a real scatter
  Dropout d;
  d.p = 0.3f;
  d.key = 1234;
  d.index_offset = 4097;  // not a multiple of 4: chunks start inside a Philox block
  auto run = [&](int threads) {
    const int old = blas::num_threads();
    blas::set_num_threads(threads);
    std::vector<float> out(B * T * C), att(B * NH * T * T), scratch(attention_scratch_floats(T));
    std::vector<float> dqkv(qkv.size()), gelu(x.size()), dgelu(x.size(), 0.5f);
    attention_forward(out.data(), att.data(), scratch.data(), qkv.data(), B, T, NH, NH, HS, drop);
    attention_backward(dqkv.data(), scratch.data(), g.data(), qkv.data(), att.data(), B, T, NH, NH,
                       HS, drop);
    gelu_forward(gelu.data(), x.data(), static_cast<int64_t>(x.size()));
    gelu_backward(dgelu.data(), x.data(), gelu.data(), static_cast<int64_t>(x.size()));
    const auto nx = static_cast<int64_t>(x.size());
    // LayerNorm.
    std::vector<float> ln(N * W), mean(N), rstd(N), dln(N * W, 0.25f), dlnw(W, 0.5f),
        dlnb(W, -0.5f);
    layernorm_forward(ln.data(), mean.data(), rstd.data(), rows.data(), lnw.data(), lnb.data(), N,
                      W);
    layernorm_backward(dln.data(), dlnw.data(), dlnb.data(), drows.data(), rows.data(), lnw.data(),
                       mean.data(), rstd.data(), N, W);
    // Linear's bias gradient (and its GEMMs).
    std::vector<float> dlin(N * IC, 0.0f), dlinw(IC * W, 0.0f), dlinb(W, 0.125f);
    linear_backward(dlin.data(), dlinw.data(), dlinb.data(), drows.data(), lin.data(), linw.data(),
                    N, IC, W);
    // Residual.
    std::vector<float> res(x.size()), dres1(x.size(), 1.0f), dres2(y);
    residual_forward(res.data(), x.data(), y.data(), nx);
    residual_backward(dres1.data(), dres2.data(), x.data(), nx);
    // Cross-entropy (in place, as the model runs it).
    std::vector<float> losses(N), probs(rows), dlogits(N * W, 0.0f);
    crossentropy_forward(losses.data(), probs.data(), probs.data(), targets.data(), N, W);
    crossentropy_backward(dlogits.data(), probs.data(), targets.data(), 1.0f / N, N, W);
    // And in place on the logits, as the chunked LM head runs it.
    std::vector<float> ilosses(N), iexp(rows), igrad(rows);
    crossentropy_loss_inplace(ilosses.data(), iexp.data(), targets.data(), N, W);
    crossentropy_backward_inplace(igrad.data(), targets.data(), 1.0f / N, N, W);
    // Encoder.
    std::vector<float> enc(EB * ET * W), dwte(V * W, 0.0f), dwpe(ET * W, 0.0f);
    encoder_forward(enc.data(), tokens.data(), wte.data(), wpe.data(), EB, ET, W);
    encoder_backward(dwte.data(), dwpe.data(), drows.data(), tokens.data(), EB, ET, W);
    // Dropout.
    std::vector<float> mask(x.size()), dropped(x.size()), ddrop(y);
    dropout_mask(mask.data(), nx, d);
    dropout_forward(dropped.data(), x.data(), nx, d);
    dropout_backward(ddrop.data(), x.data(), nx, d);
    blas::set_num_threads(old);
    return std::vector<std::vector<float>>{
        out,     att,  dqkv,  gelu,  dgelu, ln,    mean,  rstd,    dln,   dlnw,
        dlnb,    dlin, dlinw, dlinb, res,   dres1, dres2, losses,  probs, dlogits,
        ilosses, iexp, igrad, enc,   dwte,  dwpe,  mask,  dropped, ddrop};
  };
  const auto one = run(1), two = run(2);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_EQ(one[i], two[i]) << "output " << i;
  // The split dropout mask is still dropout_keep element by element.
  const std::vector<float>& mask = two[two.size() - 3];
  for (size_t i = 0; i < mask.size(); ++i)
    ASSERT_EQ(mask[i], dropout_keep(d.key, static_cast<uint64_t>(d.index_offset) + i, d.p)
                           ? d.scale()
                           : 0.0f)
        << "element " << i;
}

}  // namespace
}  // namespace tandem::nn
