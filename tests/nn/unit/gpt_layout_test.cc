// The model's layout: parameter names and shapes as GPT-2's, GPT-2's initialisation, the named
// activation buffers and workspace, and the dropout masks and keys.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "tandem/core/allocator.h"
#include "tandem/core/rng.h"
#include "tandem/nn/gpt.h"

namespace tandem::nn {
namespace {

GPTConfig two_layers() {
  GPTConfig c;
  c.vocab_size = 256;
  c.n_layers = 2;
  c.n_heads = 2;
  c.d_model = 8;
  c.seq_len = 5;
  c.max_positions = 6;
  return c;
}

TEST(GptLayout, ParameterNamesAndShapesAreGpt2s) {
  const GPTConfig c = two_layers();
  const int64_t C = 8;
  std::vector<std::pair<std::string, Shape>> want = {{"wte.weight", {256, C}},
                                                     {"wpe.weight", {6, C}}};
  for (int i = 0; i < 2; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    want.push_back({h + "ln_1.weight", {C}});
    want.push_back({h + "ln_1.bias", {C}});
    want.push_back({h + "attn.c_attn.weight", {C, 3 * C}});
    want.push_back({h + "attn.c_attn.bias", {3 * C}});
    want.push_back({h + "attn.c_proj.weight", {C, C}});
    want.push_back({h + "attn.c_proj.bias", {C}});
    want.push_back({h + "ln_2.weight", {C}});
    want.push_back({h + "ln_2.bias", {C}});
    want.push_back({h + "mlp.c_fc.weight", {C, 4 * C}});
    want.push_back({h + "mlp.c_fc.bias", {4 * C}});
    want.push_back({h + "mlp.c_proj.weight", {4 * C, C}});
    want.push_back({h + "mlp.c_proj.bias", {C}});
  }
  want.push_back({"ln_f.weight", {C}});
  want.push_back({"ln_f.bias", {C}});

  const ParameterSet p(c);
  const auto named = p.named();
  ASSERT_EQ(named.size(), want.size());
  int64_t offset = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(named[i].first, want[i].first);
    EXPECT_EQ(named[i].second.shape(), want[i].second) << want[i].first;
    // Packed in order, no gaps: the flat buffer is the concatenation.
    EXPECT_EQ(named[i].second.data_as<float>(), p.flat().data_as<float>() + offset)
        << want[i].first;
    offset += want[i].second.numel();
  }
  EXPECT_EQ(offset, p.size());
  EXPECT_EQ(p["h.1.mlp.c_fc.bias"].data(), named[2 + 12 + 9].second.data());
}

TEST(GptLayout, Gpt2SmallHasItsWellKnownParameterCount) {
  GPTConfig c;
  c.vocab_size = 50257;
  c.n_layers = 12;
  c.n_heads = 12;
  c.d_model = 768;
  c.seq_len = c.max_positions = 1024;
  EXPECT_EQ(gpt_num_parameters(c), 124439808);  // HF gpt2: sum of numel over its state dict
}

TEST(GptLayout, StageViewsPointIntoTheFlatBuffer) {
  const ParameterSet p(two_layers());
  EXPECT_EQ(p.embedding().wte, p["wte.weight"].data());
  EXPECT_EQ(p.embedding().wpe, p["wpe.weight"].data());
  const BlockParams b = p.block(1);
  EXPECT_EQ(b.ln_1_w, p["h.1.ln_1.weight"].data());
  EXPECT_EQ(b.c_attn_w, p["h.1.attn.c_attn.weight"].data());
  EXPECT_EQ(b.attn_proj_b, p["h.1.attn.c_proj.bias"].data());
  EXPECT_EQ(b.c_fc_b, p["h.1.mlp.c_fc.bias"].data());
  EXPECT_EQ(b.mlp_proj_w, p["h.1.mlp.c_proj.weight"].data());
  EXPECT_EQ(b.mlp_proj_b, p["h.1.mlp.c_proj.bias"].data());
  EXPECT_EQ(p.final_stage().ln_f_b, p["ln_f.bias"].data());
  EXPECT_EQ(p.final_stage().wte, p["wte.weight"].data());  // tied
  // A block is one contiguous slice from ln_1.weight to mlp.c_proj.bias.
  const Tensor slice = p.block_flat(1);
  EXPECT_EQ(slice.data(), p["h.1.ln_1.weight"].data());
  EXPECT_EQ(slice.data_as<float>() + slice.numel(), p["h.1.mlp.c_proj.bias"].data_as<float>() + 8);
}

TEST(GptLayout, InitialisationIsGpt2sAndTheSameEverywhere) {
  GPTConfig c = two_layers();
  c.d_model = 64;
  const ParameterSet a(c), b(c), other(c);
  gpt_init(a, 11);
  gpt_init(b, 11);
  gpt_init(other, 12);
  EXPECT_EQ(std::memcmp(a.flat().data(), b.flat().data(), a.flat().nbytes()), 0);
  EXPECT_NE(std::memcmp(a.flat().data(), other.flat().data(), a.flat().nbytes()), 0);
  const auto stddev = [](const Tensor& t) {
    double s = 0.0, s2 = 0.0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      s += t.get(i);
      s2 += static_cast<double>(t.get(i)) * t.get(i);
    }
    const double m = s / static_cast<double>(t.numel());
    return std::sqrt(s2 / static_cast<double>(t.numel()) - m * m);
  };
  // 12288+ samples each: the sample std is within 2% of the target.
  EXPECT_NEAR(stddev(a["wte.weight"]), 0.02, 0.0005);
  EXPECT_NEAR(stddev(a["h.0.attn.c_attn.weight"]), 0.02, 0.0005);
  EXPECT_NEAR(stddev(a["h.1.mlp.c_fc.weight"]), 0.02, 0.0005);
  const double resid = 0.02 / std::sqrt(2.0 * c.n_layers);
  EXPECT_NEAR(stddev(a["h.0.attn.c_proj.weight"]), resid, 0.03 * resid);
  EXPECT_NEAR(stddev(a["h.1.mlp.c_proj.weight"]), resid, 0.03 * resid);
  for (const char* name : {"h.0.ln_1.weight", "h.1.ln_2.weight", "ln_f.weight"})
    for (int64_t i = 0; i < 64; ++i) ASSERT_EQ(a[name].get(i), 1.0f) << name;
  for (const auto& [name, t] : a.named()) {
    if (!name.ends_with(".bias")) continue;
    for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(t.get(i), 0.0f) << name;
  }
}

TEST(GptLayout, BlockActivationSpecsNameEverySavedBuffer) {
  GPTConfig c = two_layers();
  c.n_heads = 4;
  const int B = 3, T = 5;
  const auto specs = block_activation_specs(c, 3, B, T);
  ASSERT_EQ(specs.size(), static_cast<size_t>(kNumActs<BlockAct>));
  const std::vector<std::pair<std::string, Shape>> want = {{"h.3.ln_1.out", {B, T, 8}},
                                                           {"h.3.ln_1.mean", {B, T}},
                                                           {"h.3.ln_1.rstd", {B, T}},
                                                           {"h.3.attn.c_attn.out", {B, T, 24}},
                                                           {"h.3.attn.softmax", {B, 4, T, T}},
                                                           {"h.3.attn.y", {B, T, 8}},
                                                           {"h.3.resid_1", {B, T, 8}},
                                                           {"h.3.ln_2.out", {B, T, 8}},
                                                           {"h.3.ln_2.mean", {B, T}},
                                                           {"h.3.ln_2.rstd", {B, T}},
                                                           {"h.3.mlp.c_fc.out", {B, T, 32}},
                                                           {"h.3.mlp.gelu.out", {B, T, 32}},
                                                           {"h.3.out", {B, T, 8}}};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(specs[i].name, want[i].first);
    EXPECT_EQ(specs[i].shape, want[i].second) << want[i].first;
    EXPECT_EQ(specs[i].bytes(), static_cast<size_t>(want[i].second.numel()) * 4);
  }
}

TEST(GptLayout, ActivationsAllocateEverySpecThroughTheGivenAllocator) {
  const GPTConfig c = two_layers();
  const int B = 2, T = 4;
  CountingAllocator counting;
  {
    const GPTActivations acts(c, B, T, counting);
    const auto specs = gpt_activation_specs(c, B, T);
    const auto named = acts.named();
    ASSERT_EQ(named.size(), specs.size());
    ASSERT_EQ(specs.size(), static_cast<size_t>(1 + 13 * c.n_layers + 4));
    size_t bytes = 0;
    std::set<std::string> names;
    for (size_t i = 0; i < specs.size(); ++i) {
      EXPECT_EQ(named[i].first, specs[i].name);
      EXPECT_EQ(named[i].second.shape(), specs[i].shape) << specs[i].name;
      bytes += specs[i].bytes();
      names.insert(specs[i].name);
    }
    EXPECT_EQ(names.size(), specs.size()) << "names are unique";
    EXPECT_TRUE(names.count("embed.out"));
    EXPECT_TRUE(names.count("h.1.attn.softmax"));
    EXPECT_TRUE(names.count("lm_head.losses"));
    EXPECT_EQ(counting.live_bytes(), bytes);
    EXPECT_EQ(acts.block_input(0), acts.embedding.ptr(EmbeddingAct::Out));
    EXPECT_EQ(acts.block_input(2), acts.blocks[1].ptr(BlockAct::Out));
  }
  EXPECT_EQ(counting.live_bytes(), 0u);
  {
    const Workspace ws(c, B, T, counting);
    size_t bytes = 0;
    for (const auto& s : Workspace::specs(c, B, T)) bytes += s.bytes();
    EXPECT_EQ(counting.live_bytes(), bytes);
  }
}

TEST(GptLayout, DropoutMaskIsCoreDropoutKeepAtEveryOffset) {
  for (int64_t offset : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{1} << 33}) {
    const Dropout d{0.37f, 0xfeedu, offset};
    std::vector<float> mask(531);  // spans several internal chunks, ends mid-block
    dropout_mask(mask.data(), static_cast<int64_t>(mask.size()), d);
    for (size_t i = 0; i < mask.size(); ++i) {
      const bool keep = dropout_keep(d.key, static_cast<uint64_t>(offset) + i, d.p);
      ASSERT_EQ(mask[i], keep ? d.scale() : 0.0f) << "offset " << offset << " element " << i;
    }
  }
}

TEST(GptLayout, DropoutKeepsAboutOneMinusP) {
  const Dropout d{0.1f, 3, 0};
  std::vector<float> mask(100000);
  dropout_mask(mask.data(), static_cast<int64_t>(mask.size()), d);
  int kept = 0;
  for (float m : mask) kept += m != 0.0f;
  EXPECT_NEAR(kept / 100000.0, 0.9, 0.005);  // 5 sigma of a binomial(1e5, 0.9)
}

TEST(GptLayout, DropoutKeysDifferBySeedStepLayerAndSite) {
  std::set<uint64_t> keys;
  for (uint64_t seed : {0u, 1u})
    for (uint64_t step : {0u, 1u, 1000000u})
      for (int layer : {-1, 0, 1, 47})
        for (DropoutSite site : {DropoutSite::Embedding, DropoutSite::Attention,
                                 DropoutSite::AttnResidual, DropoutSite::MlpResidual})
          keys.insert(dropout_key(seed, step, layer, site));
  EXPECT_EQ(keys.size(), 2u * 3u * 4u * 4u);
  // Not training, or p = 0: no dropout at all.
  GPTConfig c = two_layers();
  c.dropout = 0.1f;
  EXPECT_FALSE(site_dropout(c, {1, 2, 0, false}, 0, DropoutSite::MlpResidual, 5).active());
  EXPECT_TRUE(site_dropout(c, {1, 2, 0, true}, 0, DropoutSite::MlpResidual, 5).active());
  EXPECT_EQ(site_dropout(c, {1, 2, 3, true}, 0, DropoutSite::MlpResidual, 5).index_offset,
            3 * 5 * 8);
  c.dropout = 0.0f;
  EXPECT_FALSE(attention_dropout(c, {1, 2, 0, true}, 0).active());
}

}  // namespace
}  // namespace tandem::nn
