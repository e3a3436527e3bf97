// The whole GPT model: gradients against a double-precision reference model and finite
// differences, the loss at initialisation, learning on a repeated batch, bitwise-reproducible
// forward, backward and per-block recompute, the layer hook, and dropout masks that do not depend
// on how the batch is split; the fused attention kernel against the unfused one in the model.
#include "tandem/nn/gpt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "nn/nn_test_util.h"
#include "nn/reference_gpt.h"
#include "tandem/core/error.h"

namespace tandem::nn {
namespace {

using namespace tandem::nn::testing;

GPTConfig tiny_config(float dropout) {
  GPTConfig c;
  c.vocab_size = 256;
  c.n_layers = 2;
  c.n_heads = 2;
  c.d_model = 8;
  c.seq_len = 5;
  c.max_positions = 7;  // two rows of wpe no batch reaches: their gradient must stay zero
  c.dropout = dropout;
  return c;
}

std::vector<int32_t> tokens_for(int n, uint64_t seed, int vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    t[static_cast<size_t>(i)] = static_cast<int32_t>(random_bits(seed, static_cast<uint64_t>(i)) %
                                                     static_cast<uint32_t>(vocab));
  return t;
}

// Parameters, gradients, saved activations and workspace for one (B, T).
struct Model {
  Model(const GPTConfig& c, int B, int T) : params(c), grads(c), acts(c, B, T), ws(c, B, T) {}
  ParameterSet params, grads;
  GPTActivations acts;
  Workspace ws;
};

std::vector<float> copy_of(const Tensor& t) {
  const float* p = t.data_as<float>();
  return std::vector<float>(p, p + t.numel());
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

class GptGradients : public ::testing::TestWithParam<float> {};

// The tiny model's gradients: f32 against the double reference model for every parameter, and the
// reference against central differences for a spread of every tensor's elements.
TEST_P(GptGradients, MatchReferenceModelAndFiniteDifferences) {
  const GPTConfig c = tiny_config(GetParam());
  const int B = 2, T = 5;
  const std::vector<int32_t> tokens = tokens_for(B * T, 1, c.vocab_size);
  const std::vector<int32_t> targets = tokens_for(B * T, 2, c.vocab_size);
  const StepRng rng{42, 3, 0, true};

  Model m(c, B, T);
  gpt_init(m.params, 7);
  // Perturb every parameter (biases and LayerNorm too) so that no gradient is trivially zero
  // and attention is far from uniform.
  float* w = m.params.flat().data_as<float>();
  const std::vector<double> noise = uniform(static_cast<size_t>(m.params.size()), 8, -0.3, 0.3);
  for (int64_t i = 0; i < m.params.size(); ++i)
    w[i] += static_cast<float>(noise[static_cast<size_t>(i)]);

  const Batch batch{tokens.data(), targets.data(), B, T};
  const float loss32 = gpt_forward(m.params, m.acts, m.ws, batch, rng);
  gpt_backward(m.params, m.grads, m.acts, m.ws, batch, rng);

  const std::vector<double> p64 = to_f64(copy_of(m.params.flat()));
  const ReferenceGPT<double> ref(c);
  std::vector<double> g64(p64.size(), 0.0);
  const double loss64 = ref.run(p64, &g64, tokens, targets, B, T, rng);
  EXPECT_NEAR(loss32, loss64, 1e-5 * std::fabs(loss64));

  const std::vector<float> g32 = copy_of(m.grads.flat());
  const auto f = [&](const std::vector<double>& p) {
    return ref.run(p, nullptr, tokens, targets, B, T, rng);
  };
  for (const ParamSpec& s : m.params.specs()) {
    const auto begin = static_cast<size_t>(s.offset), end = begin + static_cast<size_t>(s.numel());
    const std::vector<float> got(g32.begin() + static_cast<long>(begin),
                                 g32.begin() + static_cast<long>(end));
    const std::vector<double> want(g64.begin() + static_cast<long>(begin),
                                   g64.begin() + static_cast<long>(end));
    // f32 through two blocks, a 256-way softmax and the exp/tanh approximations: the worst
    // error measured is 1e-6 of the tensor's largest gradient; 2e-5 leaves room for other BLAS
    // kernels.
    EXPECT_TRUE(all_close("d" + s.name + " f32 vs reference", got, want, 2e-5, 1e-8));
    std::vector<size_t> idx = spread(static_cast<size_t>(s.numel()), 24);
    for (size_t& i : idx) i += begin;
    EXPECT_TRUE(all_close("d" + s.name + " reference vs finite differences", pick(g64, idx),
                          finite_difference(f, p64, idx), 1e-6, 1e-9));
  }
  // Positions no batch reaches get no gradient.
  const Tensor dwpe = m.grads["wpe.weight"];
  for (int64_t i = static_cast<int64_t>(T) * c.d_model; i < dwpe.numel(); ++i)
    ASSERT_EQ(dwpe.get(i), 0.0f) << "wpe element " << i;
}

INSTANTIATE_TEST_SUITE_P(Dropout, GptGradients, ::testing::Values(0.0f, 0.1f),
                         [](const auto& info) { return info.param > 0 ? "p0_1" : "p0"; });

// A vocabulary large enough that the head runs in two chunks of tokens (lm_head_chunk_rows): the
// loss and every gradient still match the reference model, which holds the whole logits.
TEST(Gpt, ChunkedHeadMatchesReferenceModel) {
  GPTConfig c = tiny_config(0.0f);
  c.vocab_size = 16384;
  c.n_layers = 1;
  c.seq_len = c.max_positions = 160;
  const int B = 4, T = 160, N = B * T;
  ASSERT_EQ(lm_head_chunk_rows(N, c.vocab_size), 512) << "two chunks: 512 and 128 rows";
  const std::vector<int32_t> tokens = tokens_for(N, 21, c.vocab_size);
  const std::vector<int32_t> targets = tokens_for(N, 22, c.vocab_size);
  Model m(c, B, T);
  gpt_init(m.params, 9);
  float* w = m.params.flat().data_as<float>();
  const std::vector<double> noise = uniform(static_cast<size_t>(m.params.size()), 10, -0.3, 0.3);
  for (int64_t i = 0; i < m.params.size(); ++i)
    w[i] += static_cast<float>(noise[static_cast<size_t>(i)]);
  const Batch batch{tokens.data(), targets.data(), B, T};
  const float loss32 = gpt_forward(m.params, m.acts, m.ws, batch, {});
  gpt_backward(m.params, m.grads, m.acts, m.ws, batch, {});

  const ReferenceGPT<double> ref(c);
  std::vector<double> g64(static_cast<size_t>(m.params.size()), 0.0);
  const double loss64 = ref.run(to_f64(copy_of(m.params.flat())), &g64, tokens, targets, B, T, {});
  EXPECT_NEAR(loss32, loss64, 1e-5 * std::fabs(loss64));
  const std::vector<float> g32 = copy_of(m.grads.flat());
  for (const ParamSpec& s : m.params.specs()) {
    const auto begin = static_cast<long>(s.offset), end = begin + static_cast<long>(s.numel());
    EXPECT_TRUE(all_close("d" + s.name, std::vector<float>(g32.begin() + begin, g32.begin() + end),
                          std::vector<double>(g64.begin() + begin, g64.begin() + end), 2e-5, 1e-8));
  }
}

TEST(Gpt, LossAtInitIsNearLnVocab) {
  GPTConfig c = tiny_config(0.0f);
  c.d_model = 32;
  c.n_heads = 4;
  c.seq_len = c.max_positions = 16;
  const int B = 4, T = 16;
  Model m(c, B, T);
  gpt_init(m.params, 1);
  const std::vector<int32_t> tokens = tokens_for(B * T, 3, c.vocab_size);
  const std::vector<int32_t> targets = tokens_for(B * T, 4, c.vocab_size);
  const float loss = gpt_forward(m.params, m.acts, m.ws, {tokens.data(), targets.data(), B, T}, {});
  // Weights of scale 0.02 give logits of order 0.02 * sqrt(C) * |ln_f.out| ~ 0.1: the
  // distribution is near uniform, the loss within a few hundredths of ln 256 = 5.545.
  EXPECT_NEAR(loss, std::log(256.0), 0.05);
}

TEST(Gpt, SgdOnARepeatedBatchLowersTheLoss) {
  GPTConfig c = tiny_config(0.0f);
  c.d_model = 32;
  c.n_heads = 4;
  c.seq_len = c.max_positions = 16;
  const int B = 2, T = 16;
  Model m(c, B, T);
  gpt_init(m.params, 2);
  const std::vector<int32_t> tokens = tokens_for(B * T, 5, c.vocab_size);
  const std::vector<int32_t> targets = tokens_for(B * T, 6, c.vocab_size);
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
  // Memorising 32 random targets: from ln 256 = 5.5 the loss falls to about 0.26 in 40 steps of
  // lr 0.3 (1.0 diverges); a broken gradient leaves it near chance.
  EXPECT_LT(last, 0.2f * first) << "loss went from " << first << " to " << last;
}

// Forward and backward twice give bitwise the same loss, activations and gradients; and each
// block run again on its saved input writes bitwise the same buffers into fresh memory.
TEST(Gpt, ForwardBackwardAndBlockRecomputeAreBitwiseReproducible) {
  GPTConfig c = tiny_config(0.1f);
  c.d_model = 48;
  c.n_heads = 3;
  c.seq_len = c.max_positions = 40;  // two causal chunks in attention
  const int B = 2, T = 40;
  const StepRng rng{9, 17, 0, true};
  const std::vector<int32_t> tokens = tokens_for(B * T, 7, c.vocab_size);
  const std::vector<int32_t> targets = tokens_for(B * T, 8, c.vocab_size);
  const Batch batch{tokens.data(), targets.data(), B, T};

  Model a(c, B, T), b(c, B, T);
  gpt_init(a.params, 3);
  gpt_init(b.params, 3);
  ASSERT_TRUE(bitwise_equal(a.params.flat(), b.params.flat()));
  const float la = gpt_forward(a.params, a.acts, a.ws, batch, rng);
  const float lb = gpt_forward(b.params, b.acts, b.ws, batch, rng);
  EXPECT_EQ(std::memcmp(&la, &lb, sizeof la), 0);
  const auto na = a.acts.named(), nb = b.acts.named();
  for (size_t i = 0; i < na.size(); ++i)
    EXPECT_TRUE(bitwise_equal(na[i].second, nb[i].second)) << na[i].first;
  gpt_backward(a.params, a.grads, a.acts, a.ws, batch, rng);
  gpt_backward(b.params, b.grads, b.acts, b.ws, batch, rng);
  EXPECT_TRUE(bitwise_equal(a.grads.flat(), b.grads.flat()));

  for (int l = 0; l < c.n_layers; ++l) {
    BlockActivations fresh = allocate_block_activations(c, B, T);
    Workspace ws(c, B, T);
    block_forward(c, l, a.params.block(l), fresh, a.acts.block_input(l), ws, B, T, rng);
    for (int k = 0; k < kNumActs<BlockAct>; ++k) {
      const BlockAct kind = static_cast<BlockAct>(k);
      EXPECT_TRUE(bitwise_equal(fresh[kind], a.acts.blocks[static_cast<size_t>(l)][kind]))
          << "h." << l << "." << act_suffix(c, kind);
    }
  }
}

// The model with the fused attention kernel (the default) against the same model with the
// unfused one, the reference: the loss and every gradient within f32 rounding, GPT-2 with
// dropout and in bf16, and Llama with grouped-query heads; and the attention's saved buffer is
// (B, NH, T) instead of (B, NH, T, T).
TEST(Gpt, FusedAttentionMatchesTheUnfusedKernelInTheModel) {
  GPTConfig gpt2 = tiny_config(0.1f);
  gpt2.d_model = 48;
  gpt2.n_heads = 3;
  gpt2.seq_len = gpt2.max_positions = 40;
  GPTConfig bf16 = gpt2;
  bf16.matmul = DType::BF16;
  GPTConfig llama = gpt2;
  llama.arch = Arch::Llama;
  llama.n_heads = 4;
  llama.kv_heads = 2;
  llama.d_model = 32;
  llama.ffn = 40;
  for (const GPTConfig& base : {gpt2, bf16, llama}) {
    SCOPED_TRACE(std::string(arch_name(base.arch)) + " " + std::string(dtype_name(base.matmul)));
    const int B = 2, T = 37;
    const StepRng rng{5, 1, 0, true};
    const std::vector<int32_t> tokens = tokens_for(B * T, 11, base.vocab_size);
    const std::vector<int32_t> targets = tokens_for(B * T, 12, base.vocab_size);
    const Batch batch{tokens.data(), targets.data(), B, T};
    GPTConfig fused = base, unfused = base;
    fused.attention = AttentionKernel::Fused;
    unfused.attention = AttentionKernel::Unfused;
    Model f(fused, B, T), u(unfused, B, T);
    gpt_init(f.params, 4);
    gpt_init(u.params, 4);
    EXPECT_EQ(f.acts.blocks[0][BlockAct::AttSaved].shape(), (Shape{B, base.n_heads, T}));
    EXPECT_EQ(u.acts.blocks[0][BlockAct::AttSaved].shape(), (Shape{B, base.n_heads, T, T}));
    // bf16 matmuls round their operands, so a last-bit difference in attention's output can
    // move a rounded value by one bf16 step: looser bounds there.
    const bool bf16 = base.matmul == DType::BF16;
    const float lf = gpt_forward(f.params, f.acts, f.ws, batch, rng);
    const float lu = gpt_forward(u.params, u.acts, u.ws, batch, rng);
    EXPECT_NEAR(lf, lu, (bf16 ? 1e-4 : 1e-6) * std::fabs(lu));
    gpt_backward(f.params, f.grads, f.acts, f.ws, batch, rng);
    gpt_backward(u.params, u.grads, u.acts, u.ws, batch, rng);
    const double rtol = bf16 ? 2e-3 : 2e-5;
    EXPECT_TRUE(all_close("gradients", copy_of(f.grads.flat()), copy_of(u.grads.flat()), rtol));
  }
}

// The out-of-core pattern: the hook drops each block's buffers after its forward pass and, before
// its backward pass, recomputes them into new memory and rebinds them. Gradients are bitwise
// those of the in-core run.
TEST(Gpt, HookCanDropAndRecomputeBlocksWithBitwiseEqualGradients) {
  const GPTConfig c = [] {
    GPTConfig g = tiny_config(0.1f);
    g.d_model = 16;
    return g;
  }();
  const int B = 2, T = 5;
  const StepRng rng{5, 1, 0, true};
  const std::vector<int32_t> tokens = tokens_for(B * T, 9, c.vocab_size);
  const std::vector<int32_t> targets = tokens_for(B * T, 10, c.vocab_size);
  const Batch batch{tokens.data(), targets.data(), B, T};

  Model in_core(c, B, T), ooc(c, B, T);
  gpt_init(in_core.params, 4);
  gpt_init(ooc.params, 4);
  gpt_forward(in_core.params, in_core.acts, in_core.ws, batch, rng);
  gpt_backward(in_core.params, in_core.grads, in_core.acts, in_core.ws, batch, rng);

  std::vector<LayerEvent> events;
  const auto hook = [&](const LayerEvent& e) {
    events.push_back(e);
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
  EXPECT_TRUE(bitwise_equal(in_core.grads.flat(), ooc.grads.flat()));

  // Every stage, before and after, in pipeline order.
  const int L = c.n_layers;
  ASSERT_EQ(events.size(), static_cast<size_t>(2 * 2 * (L + 2)));
  EXPECT_EQ(events[0].stage, Stage::Embedding);
  EXPECT_FALSE(events[0].after);
  EXPECT_EQ(events[2].stage, Stage::Block);
  EXPECT_EQ(events[2].layer, 0);
  EXPECT_EQ(events[2 * (L + 1)].stage, Stage::Final);
  const size_t back = static_cast<size_t>(2 * (L + 2));
  EXPECT_EQ(events[back].pass, Pass::Backward);
  EXPECT_EQ(events[back].stage, Stage::Final);
  EXPECT_EQ(events[back + 2].layer, L - 1);
  EXPECT_EQ(events.back().stage, Stage::Embedding);
  EXPECT_TRUE(events.back().after);
}

// Data parallelism: the two halves of a batch, each run with its sample offset, draw the dropout
// masks the whole batch draws, so their per-token losses and summed gradients match it.
TEST(Gpt, BatchShardsWithSampleOffsetsDrawTheWholeBatchsDropout) {
  GPTConfig c = tiny_config(0.2f);
  c.d_model = 16;
  const int B = 4, T = 5, half = B / 2;
  const std::vector<int32_t> tokens = tokens_for(B * T, 11, c.vocab_size);
  const std::vector<int32_t> targets = tokens_for(B * T, 12, c.vocab_size);
  Model whole(c, B, T);
  gpt_init(whole.params, 5);
  const StepRng rng{77, 2, 0, true};
  gpt_forward(whole.params, whole.acts, whole.ws, {tokens.data(), targets.data(), B, T}, rng);
  gpt_backward(whole.params, whole.grads, whole.acts, whole.ws,
               {tokens.data(), targets.data(), B, T}, rng);
  const std::vector<float> whole_losses = copy_of(whole.acts.head[FinalAct::Losses]);

  std::vector<float> shard_losses;
  ParameterSet summed(c);
  for (int r = 0; r < 2; ++r) {
    Model m(c, half, T);
    gpt_init(m.params, 5);
    const StepRng shard_rng{77, 2, r * half, true};
    const Batch batch{tokens.data() + r * half * T, targets.data() + r * half * T, half, T};
    gpt_forward(m.params, m.acts, m.ws, batch, shard_rng);
    gpt_backward(m.params, summed, m.acts, m.ws, batch, shard_rng, 0.5f);  // mean of two halves
    const std::vector<float> l = copy_of(m.acts.head[FinalAct::Losses]);
    shard_losses.insert(shard_losses.end(), l.begin(), l.end());
  }
  // Not bitwise: the GEMMs see other row counts. A wrong mask would change losses by O(1).
  EXPECT_TRUE(all_close("per-token losses", shard_losses, whole_losses, 1e-5));
  EXPECT_TRUE(
      all_close("gradients", copy_of(summed.flat()), copy_of(whole.grads.flat()), 1e-4, 1e-7));
}

TEST(Gpt, ForwardWithoutTargetsGivesProbabilitiesAndNaNLoss) {
  const GPTConfig c = tiny_config(0.0f);
  const int B = 1, T = 3;
  Model m(c, B, T);
  gpt_init(m.params, 6);
  const std::vector<int32_t> tokens = {1, 2, 3}, targets = {2, 3, 4};
  const float loss = gpt_forward(m.params, m.acts, m.ws, {tokens.data(), nullptr, B, T}, {});
  EXPECT_TRUE(std::isnan(loss));
  // Every row's distribution sums to 1, and it is the one the loss sees: -log p[target].
  const int V = c.vocab_size;
  std::vector<float> probs(static_cast<size_t>(T) * V);
  final_probabilities(c, m.params.final_stage(), m.acts.head, m.ws, B, T, 0, T, probs.data());
  gpt_forward(m.params, m.acts, m.ws, {tokens.data(), targets.data(), B, T}, {});
  const std::vector<float> losses = copy_of(m.acts.head[FinalAct::Losses]);
  for (int t = 0; t < T; ++t) {
    double s = 0.0;
    for (int v = 0; v < V; ++v) s += probs[static_cast<size_t>(t * V + v)];
    EXPECT_NEAR(s, 1.0, 1e-5) << "row " << t;
    EXPECT_NEAR(-std::log(probs[static_cast<size_t>(t * V + targets[t])]), losses[t], 1e-5)
        << "row " << t;
  }
  // The last row alone, as sampling asks for it, is the same distribution.
  std::vector<float> last(static_cast<size_t>(V));
  final_probabilities(c, m.params.final_stage(), m.acts.head, m.ws, B, T, T - 1, 1, last.data());
  EXPECT_TRUE(all_close("last row", last, std::vector<float>(probs.end() - V, probs.end()), 1e-6));
  EXPECT_THROW(final_probabilities(c, m.params.final_stage(), m.acts.head, m.ws, B, T, T - 1, 2,
                                   last.data()),
               UserError);
}

}  // namespace
}  // namespace tandem::nn
