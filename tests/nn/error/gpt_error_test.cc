// The messages a user reads when a GPT configuration, a batch, a parameter name or a buffer
// binding is wrong.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/nn/gpt.h"

namespace tandem::nn {
namespace {

using ::testing::HasSubstr;

std::string user_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no UserError)";
}

GPTConfig small() {
  GPTConfig c;
  c.n_layers = 1;
  c.n_heads = 2;
  c.d_model = 8;
  c.seq_len = 4;
  c.max_positions = 4;
  return c;
}

TEST(GptErrors, ConfigNamesTheBadField) {
  GPTConfig c = small();
  c.d_model = 10;
  c.n_heads = 3;
  EXPECT_THAT(user_error_of([&] { c.validate(); }),
              HasSubstr("d_model (10) must be divisible by n_heads (3)"));
  c = small();
  c.max_positions = 2;
  EXPECT_THAT(user_error_of([&] { c.validate(); }),
              HasSubstr("max_positions (2) must be at least seq_len (4)"));
  c = small();
  c.dropout = 1.0f;
  EXPECT_THAT(user_error_of([&] { ParameterSet p(c); }),
              HasSubstr("dropout is 1; it must be in [0, 1)"));
  c = small();
  c.vocab_size = 0;
  EXPECT_THAT(user_error_of([&] { c.validate(); }), HasSubstr("vocab_size is 0"));
}

TEST(GptErrors, UnknownParameterNameListsGpt2Names) {
  const ParameterSet p(small());
  const std::string msg = user_error_of([&] { (void)p["h.0.attn.c_attn.w"]; });
  EXPECT_THAT(msg, HasSubstr("no parameter called 'h.0.attn.c_attn.w'"));
  EXPECT_THAT(msg, HasSubstr("h.0.attn.c_attn.weight"));
  EXPECT_THAT(user_error_of([&] { (void)p.block(1); }), HasSubstr("block 1 does not exist"));
}

TEST(GptErrors, BatchTokensOutsideTheVocabulary) {
  const GPTConfig c = small();
  ParameterSet p(c);
  GPTActivations acts(c, 1, 4);
  Workspace ws(c, 1, 4);
  const std::vector<int32_t> tokens = {1, 2, 256, 3};
  const std::vector<int32_t> good = {1, 2, 3, 4}, bad_targets = {0, -1, 0, 0};
  EXPECT_THAT(user_error_of([&] {
                gpt_forward(p, acts, ws, {tokens.data(), good.data(), 1, 4}, {});
              }),
              HasSubstr("token 256 at position 2 is outside the vocabulary [0, 256)"));
  EXPECT_THAT(user_error_of([&] {
                gpt_forward(p, acts, ws, {good.data(), bad_targets.data(), 1, 4}, {});
              }),
              HasSubstr("target -1 at position 1"));
  ParameterSet g(c);
  EXPECT_THAT(user_error_of([&] {
                gpt_backward(p, g, acts, ws, {good.data(), nullptr, 1, 4}, {});
              }),
              HasSubstr("backward needs the batch's targets"));
}

TEST(GptErrors, BatchShapeMustMatchTheBuffers) {
  const GPTConfig c = small();
  ParameterSet p(c);
  GPTActivations acts(c, 2, 4);
  Workspace ws(c, 2, 4);
  const std::vector<int32_t> tokens(12, 1);
  EXPECT_THAT(user_error_of([&] {
                gpt_forward(p, acts, ws, {tokens.data(), tokens.data(), 3, 4}, {});
              }),
              HasSubstr("batch is 3 x 4 but the activations are for 2 x 4"));
  EXPECT_THAT(user_error_of([&] { GPTActivations a(c, 1, 5); }),
              HasSubstr("1 <= sequence <= max_positions (4)"));
  Workspace small_ws(c, 1, 4);
  EXPECT_THAT(user_error_of([&] {
                gpt_forward(p, acts, small_ws, {tokens.data(), tokens.data(), 2, 4}, {});
              }),
              HasSubstr("workspace holds batches up to 1 x 4; this one is 2 x 4"));
}

TEST(GptErrors, UnboundActivationBufferIsNamed) {
  const GPTConfig c = small();
  ParameterSet p(c);
  GPTActivations acts(c, 1, 4);
  Workspace ws(c, 1, 4);
  acts.blocks[0][BlockAct::AttSaved] = Tensor();
  const std::vector<int32_t> tokens = {1, 2, 3, 4};
  EXPECT_THAT(user_error_of([&] {
                gpt_forward(p, acts, ws, {tokens.data(), tokens.data(), 1, 4}, {});
              }),
              HasSubstr("activation buffer h.0.attn.lse is f32[] (unbound); the stage needs "
                        "f32[1, 2, 4]"));
}

}  // namespace
}  // namespace tandem::nn
