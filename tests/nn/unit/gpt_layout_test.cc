// The model's layout: parameter names and shapes as GPT-2's (and Llama's in the same twelve slots
// a block), parameter counts of known models, the config checks of the Llama fields, GPT-2's
// initialisation, the named activation buffers and workspace, and the dropout masks and keys.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "tandem/core/allocator.h"
#include "tandem/core/error.h"
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
                                                           {"h.3.attn.lse", {B, 4, T}},
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
    EXPECT_TRUE(names.count("h.1.attn.lse"));
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

// ---------------------------------------------------------------------------------------------
// Llama.

GPTConfig llama_two_layers() {
  GPTConfig c = two_layers();
  c.arch = Arch::Llama;
  c.n_heads = 4;   // heads of 2
  c.kv_heads = 2;  // qkv_width 8 + 2 * 2 * 2 = 16
  c.ffn = 12;
  return c;
}

// The message of the UserError that validate() throws, or a note that it threw none.
std::string validate_message(const GPTConfig& c) {
  try {
    c.validate();
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no UserError)";
}

// The documented layout (gpt.h): GPT-2's twelve slots a block, the ones Llama lacks empty, then
// the untied head last.
TEST(GptLayout, LlamaParameterNamesShapesAndEmptyTensors) {
  for (bool qkv_bias : {false, true})
    for (bool tied : {true, false}) {
      SCOPED_TRACE(std::string(qkv_bias ? "qkv_bias" : "no qkv_bias") +
                   (tied ? ", tied" : ", untied"));
      GPTConfig c = llama_two_layers();
      c.qkv_bias = qkv_bias;
      c.tie_embeddings = tied;
      const int64_t C = 8, QKV = 16, F = 12;
      std::vector<std::pair<std::string, Shape>> want = {{"wte.weight", {256, C}},
                                                         {"wpe.weight", {0, C}}};
      for (int i = 0; i < 2; ++i) {
        const std::string h = "h." + std::to_string(i) + ".";
        want.push_back({h + "ln_1.weight", {C}});
        want.push_back({h + "ln_1.bias", {0}});
        want.push_back({h + "attn.c_attn.weight", {C, QKV}});
        want.push_back({h + "attn.c_attn.bias", {qkv_bias ? QKV : 0}});
        want.push_back({h + "attn.c_proj.weight", {C, C}});
        want.push_back({h + "attn.c_proj.bias", {0}});
        want.push_back({h + "ln_2.weight", {C}});
        want.push_back({h + "ln_2.bias", {0}});
        want.push_back({h + "mlp.c_fc.weight", {C, 2 * F}});  // [gate | up]
        want.push_back({h + "mlp.c_fc.bias", {0}});
        want.push_back({h + "mlp.c_proj.weight", {F, C}});
        want.push_back({h + "mlp.c_proj.bias", {0}});
      }
      want.push_back({"ln_f.weight", {C}});
      want.push_back({"ln_f.bias", {0}});
      if (!tied) want.push_back({"lm_head.weight", {256, C}});

      const auto specs = gpt_parameter_specs(c);
      ASSERT_EQ(specs.size(), want.size());
      int64_t offset = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(specs[i].name, want[i].first);
        EXPECT_EQ(specs[i].shape, want[i].second) << want[i].first;
        EXPECT_EQ(specs[i].offset, offset) << want[i].first;  // packed, no gaps
        offset += want[i].second.numel();
      }
      EXPECT_EQ(gpt_num_parameters(c), offset);

      // The stage views: null for every empty tensor, the head wte or lm_head.weight.
      const ParameterSet p(c);
      EXPECT_EQ(p.size(), offset);
      EXPECT_EQ(p.embedding().wpe, nullptr);
      const BlockParams b = p.block(1);
      EXPECT_EQ(b.ln_1_w, p["h.1.ln_1.weight"].data());
      EXPECT_EQ(b.c_attn_w, p["h.1.attn.c_attn.weight"].data());
      EXPECT_EQ(b.c_attn_b, qkv_bias ? p["h.1.attn.c_attn.bias"].data() : nullptr);
      EXPECT_EQ(b.mlp_proj_w, p["h.1.mlp.c_proj.weight"].data());
      for (float* absent : {b.ln_1_b, b.attn_proj_b, b.ln_2_b, b.c_fc_b, b.mlp_proj_b})
        EXPECT_EQ(absent, nullptr);
      EXPECT_EQ(p.final_stage().ln_f_b, nullptr);
      EXPECT_EQ(p.final_stage().wte, tied ? p["wte.weight"].data() : p["lm_head.weight"].data());
      // A block is still one contiguous slice, now from ln_1.weight to mlp.c_proj.weight.
      const Tensor slice = p.block_flat(1);
      EXPECT_EQ(slice.data(), p["h.1.ln_1.weight"].data());
      EXPECT_EQ(slice.data_as<float>() + slice.numel(),
                p["h.1.mlp.c_proj.weight"].data_as<float>() + F * C);
    }
}

// Llama's initialisation: RMSNorm weights 1, the projections and the untied head N(0, 0.02) (the
// residual projections scaled), q/k/v biases 0.
TEST(GptLayout, LlamaInitialisation) {
  GPTConfig c = llama_two_layers();
  c.d_model = 64;
  c.n_heads = 4;
  c.ffn = 96;
  c.qkv_bias = true;
  c.tie_embeddings = false;
  const ParameterSet p(c);
  gpt_init(p, 11);
  for (const char* name : {"h.0.ln_1.weight", "h.1.ln_2.weight", "ln_f.weight"})
    for (int64_t i = 0; i < 64; ++i) ASSERT_EQ(p[name].get(i), 1.0f) << name;
  const Tensor bias = p["h.1.attn.c_attn.bias"];
  for (int64_t i = 0; i < bias.numel(); ++i) ASSERT_EQ(bias.get(i), 0.0f);
  const auto rms = [](const Tensor& t) {
    double s2 = 0.0;
    for (int64_t i = 0; i < t.numel(); ++i) s2 += static_cast<double>(t.get(i)) * t.get(i);
    return std::sqrt(s2 / static_cast<double>(t.numel()));
  };
  EXPECT_NEAR(rms(p["lm_head.weight"]), 0.02, 0.0005);  // 16384 samples
  EXPECT_NEAR(rms(p["h.0.mlp.c_fc.weight"]), 0.02, 0.0005);
  EXPECT_NEAR(rms(p["h.0.mlp.c_proj.weight"]), 0.01, 0.0003);  // 0.02 / sqrt(2 * 2)
}

// HF SmolLM-135M (LlamaForCausalLM): vocabulary 49152, 30 layers, d_model 576, 9 heads of 64,
// 3 key/value heads, intermediate 1536, tied. Per block 576 (input_layernorm) + 576 x 960 (q, k,
// v) + 576 x 576 (o) + 576 (post_attention_layernorm) + 576 x 3072 (gate, up) + 1536 x 576 (down)
// = 3,540,096; 30 of them, embed_tokens 49152 x 576 = 28,311,552 and the final norm's 576:
// 134,515,008, the sum of numel over its state dict.
TEST(GptLayout, SmolLm135mHasItsParameterCount) {
  GPTConfig c;
  c.arch = Arch::Llama;
  c.vocab_size = 49152;
  c.n_layers = 30;
  c.d_model = 576;
  c.n_heads = 9;
  c.kv_heads = 3;
  c.ffn = 1536;
  c.seq_len = c.max_positions = 2048;
  c.rope_theta = 10000.0;
  EXPECT_EQ(c.qkv_width(), 960);
  EXPECT_EQ(gpt_num_parameters(c), 134515008);
  c.tie_embeddings = false;  // plus lm_head.weight
  EXPECT_EQ(gpt_num_parameters(c), 134515008 + 28311552);
}

TEST(GptLayout, ValidateRefusesBadLlamaShapes) {
  using ::testing::HasSubstr;
  GPTConfig c = llama_two_layers();
  EXPECT_EQ(validate_message(c), "(no UserError)");
  c.kv_heads = 3;
  EXPECT_THAT(validate_message(c), HasSubstr("kv_heads (3) must divide n_heads (4)"));
  c.kv_heads = 8;  // more key/value heads than query heads
  EXPECT_THAT(validate_message(c), HasSubstr("kv_heads (8) must divide n_heads (4)"));
  c.kv_heads = -1;
  EXPECT_THAT(validate_message(c), HasSubstr("kv_heads (-1) must divide n_heads (4)"));
  c = llama_two_layers();
  c.d_model = 12;  // 4 heads of 3
  EXPECT_THAT(validate_message(c), HasSubstr("head size (d_model / n_heads = 3) must be even"));
  EXPECT_THROW(ParameterSet{c}, UserError);
  c = llama_two_layers();
  c.norm_eps = 0.0f;
  EXPECT_THAT(validate_message(c), HasSubstr("norm_eps is 0"));
  c = llama_two_layers();
  c.ffn = -4;
  EXPECT_THAT(validate_message(c), HasSubstr("ffn is -4"));
  c = llama_two_layers();
  c.rope_theta = -1.0;
  EXPECT_THAT(validate_message(c), HasSubstr("theta is -1"));
}

// The Llama-only fields on a GPT-2 config are refused, each by name, rather than half-read.
TEST(GptLayout, ValidateRefusesLlamaFieldsOnGpt2) {
  using ::testing::HasSubstr;
  GPTConfig c = two_layers();
  c.kv_heads = 1;
  EXPECT_THAT(validate_message(c), HasSubstr("kv_heads is 1"));
  c.kv_heads = c.n_heads;  // the same as the default: allowed
  EXPECT_EQ(validate_message(c), "(no UserError)");
  c = two_layers();
  c.ffn = 12;
  EXPECT_THAT(validate_message(c), HasSubstr("ffn is 12"));
  c.ffn = 4 * c.d_model;  // GPT-2's own width, spelled out: allowed
  EXPECT_EQ(validate_message(c), "(no UserError)");
  c = two_layers();
  c.qkv_bias = true;
  EXPECT_THAT(validate_message(c), HasSubstr("qkv_bias"));
  c = two_layers();
  c.tie_embeddings = false;
  EXPECT_THAT(validate_message(c), HasSubstr("tie_embeddings"));
  EXPECT_THAT(validate_message(c), HasSubstr("arch llama"));
}

}  // namespace
}  // namespace tandem::nn
