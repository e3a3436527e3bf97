// The Llama family of the GPT model: gradients against a double-precision naive Llama and finite
// differences (multi-query, grouped and multi-head attention, tied and untied heads, q/k/v
// biases, wide heads with scaled rotary frequencies), bitwise-reproducible forward, backward and
// per-block recompute, the loss at initialisation, and learning on a repeated batch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "nn/nn_test_util.h"
#include "nn/reference_llama.h"
#include "tandem/nn/gpt.h"

namespace tandem::nn {
namespace llama_test {

using namespace tandem::nn::testing;

// The tiny Llama: 2 layers, d_model 8, 4 heads of 2, ffn 12, vocabulary 256.
GPTConfig tiny_llama(int kv_heads, bool tied) {
  GPTConfig c;
  c.arch = Arch::Llama;
  c.vocab_size = 256;
  c.n_layers = 2;
  c.n_heads = 4;
  c.d_model = 8;
  c.kv_heads = kv_heads;
  c.ffn = 12;
  c.seq_len = 5;
  c.max_positions = 5;
  c.tie_embeddings = tied;
  return c;
}

std::vector<int32_t> llama_tokens(int n, uint64_t seed, int vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    t[static_cast<size_t>(i)] = static_cast<int32_t>(random_bits(seed, static_cast<uint64_t>(i)) %
                                                     static_cast<uint32_t>(vocab));
  return t;
}

// Parameters, gradients, saved activations and workspace for one (B, T).
struct LlamaModel {
  LlamaModel(const GPTConfig& c, int B, int T) : params(c), grads(c), acts(c, B, T), ws(c, B, T) {}
  ParameterSet params, grads;
  GPTActivations acts;
  Workspace ws;
};

std::vector<float> floats_of(const Tensor& t) {
  const float* p = t.data_as<float>();
  return std::vector<float>(p, p + t.numel());
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// gpt_init plus uniform noise in [-0.3, 0.3) on every element, so that no gradient is trivially
// zero, the RMSNorm weights are not all 1 and attention is far from uniform.
void init_perturbed(const ParameterSet& p, uint64_t seed) {
  gpt_init(p, seed);
  float* w = p.flat().data_as<float>();
  const std::vector<double> noise = uniform(static_cast<size_t>(p.size()), seed + 1, -0.3, 0.3);
  for (int64_t i = 0; i < p.size(); ++i) w[i] += static_cast<float>(noise[static_cast<size_t>(i)]);
}

struct GradCase {
  std::string name;
  GPTConfig config;
};

GradCase grad_case(std::string name, int kv_heads, bool tied) {
  return {std::move(name), tiny_llama(kv_heads, tied)};
}

// The instances: kv_heads 1 (multi-query), 2 (grouped) and 4 (multi-head), each with the head
// tied and untied; q/k/v biases (Qwen2); dropout at every site; and heads of 8 (four rotary
// frequencies, HF's pairs (i, i + 4) apart from adjacent ones) with theta 100 and Llama 3.1
// scaling, so the model must pass the config's frequencies to its rotation.
std::vector<GradCase> grad_cases() {
  std::vector<GradCase> cases;
  for (int kv : {1, 2, 4})
    for (bool tied : {true, false})
      cases.push_back(
          grad_case("kv" + std::to_string(kv) + (tied ? "_tied" : "_untied"), kv, tied));
  GradCase bias = grad_case("kv2_untied_qkv_bias", 2, false);
  bias.config.qkv_bias = true;
  cases.push_back(bias);
  GradCase drop = grad_case("kv2_tied_dropout", 2, true);
  drop.config.dropout = 0.1f;
  cases.push_back(drop);
  GradCase wide = grad_case("wide_heads_llama3_rope", 1, false);
  wide.config.d_model = 16;
  wide.config.n_heads = 2;
  wide.config.ffn = 20;
  wide.config.rope_theta = 100.0;
  wide.config.rope_scaling.type = RopeType::Llama3;
  wide.config.rope_scaling.factor = 4.0;
  wide.config.rope_scaling.original_max_position_embeddings = 16;  // one blended, three divided
  cases.push_back(wide);
  return cases;
}

// gtest names a failing instance by this, not by the struct's bytes.
void PrintTo(const GradCase& c, std::ostream* os) { *os << c.name; }

class LlamaGradients : public ::testing::TestWithParam<GradCase> {};

// The tiny model's gradients: f32 against the double reference model for every parameter, and the
// reference against central differences for a spread of every tensor's elements.
TEST_P(LlamaGradients, MatchReferenceModelAndFiniteDifferences) {
  const GPTConfig& c = GetParam().config;
  const int B = 2, T = 5;
  const std::vector<int32_t> tokens = llama_tokens(B * T, 1, c.vocab_size);
  const std::vector<int32_t> targets = llama_tokens(B * T, 2, c.vocab_size);
  const StepRng rng{42, 3, 0, true};

  LlamaModel m(c, B, T);
  init_perturbed(m.params, 7);
  const Batch batch{tokens.data(), targets.data(), B, T};
  const float loss32 = gpt_forward(m.params, m.acts, m.ws, batch, rng);
  gpt_backward(m.params, m.grads, m.acts, m.ws, batch, rng);

  const std::vector<double> p64 = to_f64(floats_of(m.params.flat()));
  const ReferenceLlama<double> ref(c);
  std::vector<double> g64(p64.size(), 0.0);
  const double loss64 = ref.run(p64, &g64, tokens, targets, B, T, rng);
  EXPECT_NEAR(loss32, loss64, 1e-5 * std::fabs(loss64));

  const std::vector<float> g32 = floats_of(m.grads.flat());
  const auto f = [&](const std::vector<double>& p) {
    return ref.run(p, nullptr, tokens, targets, B, T, rng);
  };
  int checked = 0;
  for (const ParamSpec& s : m.params.specs()) {
    if (s.numel() == 0) continue;  // a tensor Llama lacks
    ++checked;
    const auto begin = static_cast<size_t>(s.offset), end = begin + static_cast<size_t>(s.numel());
    const std::vector<float> got(g32.begin() + static_cast<long>(begin),
                                 g32.begin() + static_cast<long>(end));
    const std::vector<double> want(g64.begin() + static_cast<long>(begin),
                                   g64.begin() + static_cast<long>(end));
    // As GptGradients: f32 through two blocks and a 256-way softmax; every instance passes at
    // 2e-6 of the tensor's largest gradient, 2e-5 leaves room for other BLAS kernels.
    EXPECT_TRUE(all_close("d" + s.name + " f32 vs reference", got, want, 2e-5, 1e-8));
    std::vector<size_t> idx = spread(static_cast<size_t>(s.numel()), 24);
    for (size_t& i : idx) i += begin;
    EXPECT_TRUE(all_close("d" + s.name + " reference vs finite differences", pick(g64, idx),
                          finite_difference(f, p64, idx), 1e-6, 1e-9));
    // Every tensor the model has takes part in the loss.
    EXPECT_GT(max_abs(want), 1e-6) << s.name;
  }
  // wte, 2 x (ln_1, c_attn, [c_attn.bias], attn c_proj, ln_2, c_fc, mlp c_proj), ln_f, [lm_head].
  EXPECT_EQ(checked, 1 + c.n_layers * (6 + (c.qkv_bias ? 1 : 0)) + 1 + (c.tie_embeddings ? 0 : 1));
}

INSTANTIATE_TEST_SUITE_P(Llama, LlamaGradients, ::testing::ValuesIn(grad_cases()),
                         [](const auto& info) { return info.param.name; });

// A Llama for the reproducibility tests: heads of 12, grouped 2 to a key/value head, T = 40 (two
// causal chunks in attention), dropout everywhere.
GPTConfig reproducible_llama() {
  GPTConfig c = tiny_llama(2, false);
  c.d_model = 48;
  c.n_heads = 4;
  c.ffn = 64;
  c.dropout = 0.1f;
  c.seq_len = c.max_positions = 40;
  return c;
}

// Forward and backward twice give bitwise the same loss, activations and gradients; and each
// block run again on its saved input writes bitwise the same buffers into fresh memory.
TEST(Llama, ForwardBackwardAndBlockRecomputeAreBitwiseReproducible) {
  const GPTConfig c = reproducible_llama();
  const int B = 2, T = 40;
  const StepRng rng{9, 17, 0, true};
  const std::vector<int32_t> tokens = llama_tokens(B * T, 7, c.vocab_size);
  const std::vector<int32_t> targets = llama_tokens(B * T, 8, c.vocab_size);
  const Batch batch{tokens.data(), targets.data(), B, T};

  LlamaModel a(c, B, T), b(c, B, T);
  gpt_init(a.params, 3);
  gpt_init(b.params, 3);
  ASSERT_TRUE(same_bytes(a.params.flat(), b.params.flat()));
  const float la = gpt_forward(a.params, a.acts, a.ws, batch, rng);
  const float lb = gpt_forward(b.params, b.acts, b.ws, batch, rng);
  EXPECT_EQ(std::memcmp(&la, &lb, sizeof la), 0);
  const auto na = a.acts.named(), nb = b.acts.named();
  for (size_t i = 0; i < na.size(); ++i)
    EXPECT_TRUE(same_bytes(na[i].second, nb[i].second)) << na[i].first;
  gpt_backward(a.params, a.grads, a.acts, a.ws, batch, rng);
  gpt_backward(b.params, b.grads, b.acts, b.ws, batch, rng);
  EXPECT_TRUE(same_bytes(a.grads.flat(), b.grads.flat()));

  for (int l = 0; l < c.n_layers; ++l) {
    BlockActivations fresh = allocate_block_activations(c, B, T);
    Workspace ws(c, B, T);
    block_forward(c, l, a.params.block(l), fresh, a.acts.block_input(l), ws, B, T, rng);
    for (int k = 0; k < kNumActs<BlockAct>; ++k) {
      const BlockAct kind = static_cast<BlockAct>(k);
      EXPECT_TRUE(same_bytes(fresh[kind], a.acts.blocks[static_cast<size_t>(l)][kind]))
          << "h." << l << "." << act_suffix(c, kind);
    }
  }
}

// The out-of-core pattern: the hook drops each block's buffers after its forward pass and, before
// its backward pass, recomputes them into new memory and rebinds them. Gradients are bitwise
// those of the in-core run.
TEST(Llama, HookCanDropAndRecomputeBlocksWithBitwiseEqualGradients) {
  const GPTConfig c = reproducible_llama();
  const int B = 2, T = 40;
  const StepRng rng{5, 1, 0, true};
  const std::vector<int32_t> tokens = llama_tokens(B * T, 9, c.vocab_size);
  const std::vector<int32_t> targets = llama_tokens(B * T, 10, c.vocab_size);
  const Batch batch{tokens.data(), targets.data(), B, T};

  LlamaModel in_core(c, B, T), ooc(c, B, T);
  gpt_init(in_core.params, 4);
  gpt_init(ooc.params, 4);
  gpt_forward(in_core.params, in_core.acts, in_core.ws, batch, rng);
  gpt_backward(in_core.params, in_core.grads, in_core.acts, in_core.ws, batch, rng);

  const auto hook = [&](const LayerEvent& e) {
    if (e.stage != Stage::Block) return;
    BlockActivations& acts = ooc.acts.blocks[static_cast<size_t>(e.layer)];
    // Keep only Out (the next block's input, the checkpoint); drop the rest.
    if (e.pass == Pass::Forward && e.after) {
      for (int k = 0; k < kNumActs<BlockAct>; ++k)
        if (static_cast<BlockAct>(k) != BlockAct::Out) acts.buf[static_cast<size_t>(k)] = Tensor();
    }
    if (e.pass == Pass::Backward && !e.after) {
      BlockActivations re = allocate_block_activations(c, B, T);
      Workspace ws(c, B, T);
      block_forward(c, e.layer, ooc.params.block(e.layer), re, ooc.acts.block_input(e.layer), ws, B,
                    T, rng);
      acts = re;
    }
  };
  gpt_forward(ooc.params, ooc.acts, ooc.ws, batch, rng, hook);
  gpt_backward(ooc.params, ooc.grads, ooc.acts, ooc.ws, batch, rng, 1.0f, hook);
  EXPECT_TRUE(same_bytes(in_core.grads.flat(), ooc.grads.flat()));
}

// A Llama of d_model 32 (heads of 8, two key/value heads) for the training-level tests.
GPTConfig small_llama(bool tied) {
  GPTConfig c = tiny_llama(2, tied);
  c.d_model = 32;
  c.n_heads = 4;
  c.ffn = 64;
  c.seq_len = c.max_positions = 16;
  return c;
}

TEST(Llama, LossAtInitIsNearLnVocab) {
  for (bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied head" : "untied head");
    const GPTConfig c = small_llama(tied);
    const int B = 4, T = 16;
    LlamaModel m(c, B, T);
    gpt_init(m.params, 1);
    const std::vector<int32_t> tokens = llama_tokens(B * T, 3, c.vocab_size);
    const std::vector<int32_t> targets = llama_tokens(B * T, 4, c.vocab_size);
    const float loss =
        gpt_forward(m.params, m.acts, m.ws, {tokens.data(), targets.data(), B, T}, {});
    // ln_f.out has unit RMS, so with head weights of scale 0.02 the logits are of order
    // 0.02 * sqrt(C) ~ 0.1 (tied: the input token's own logit ~ 0.02 * C = 0.6, one of 256): the
    // distribution is near uniform, the loss within a few hundredths of ln 256 = 5.545.
    EXPECT_NEAR(loss, std::log(256.0), 0.05);
  }
}

TEST(Llama, SgdOnARepeatedBatchLowersTheLoss) {
  const GPTConfig c = small_llama(false);
  const int B = 2, T = 16;
  LlamaModel m(c, B, T);
  gpt_init(m.params, 2);
  const std::vector<int32_t> tokens = llama_tokens(B * T, 5, c.vocab_size);
  const std::vector<int32_t> targets = llama_tokens(B * T, 6, c.vocab_size);
  const Batch batch{tokens.data(), targets.data(), B, T};
  float* w = m.params.flat().data_as<float>();
  const float* g = m.grads.flat().data_as<float>();
  float first = 0.0f, last = 0.0f;
  for (int step = 0; step < 40; ++step) {
    const float loss = gpt_forward(m.params, m.acts, m.ws, batch, {});
    if (step == 0) first = loss;
    last = loss;
    m.grads.zero();
    gpt_backward(m.params, m.grads, m.acts, m.ws, batch, {});
    for (int64_t i = 0; i < m.params.size(); ++i) w[i] -= 0.3f * g[i];
  }
  // Memorising 32 random targets: from ln 256 = 5.5 the loss falls to about 0.07 in 40 steps of
  // lr 0.3; a broken gradient leaves it near chance.
  EXPECT_LT(last, 0.2f * first) << "loss went from " << first << " to " << last;
}

}  // namespace llama_test
}  // namespace tandem::nn
