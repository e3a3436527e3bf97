// Saved activations in bf16 (nn::act_dtype): the matmuls' inputs saved rounded give bitwise the
// results of saving them in f32, kernel by kernel and for the whole model's loss and gradients,
// and their bytes halve (the buffers, the specs and the chain layout the out-of-core planner
// places). No tolerance anywhere: every reader of those buffers rounds them to bf16 first, so
// rounding them once when saved changes no bit.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "nn/nn_test_util.h"
#include "tandem/core/allocator.h"
#include "tandem/core/bf16.h"
#include "tandem/core/error.h"
#include "tandem/core/rng.h"
#include "tandem/nn/activation_memory.h"
#include "tandem/nn/gpt.h"
#include "tandem/nn/layers.h"

namespace tandem::nn {
namespace {

using testing::Bf16Scratch;
using testing::to_f32;
using testing::uniform;

std::vector<bf16> bf16_rounded(const std::vector<float>& x) {
  std::vector<bf16> r(x.size());
  to_bf16(x.data(), r.data(), x.size());
  return r;
}

bool same_bf16_bits(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(bf16)) == 0;
}

TEST(Bf16Activations, LayerNormGeluAndStagedOutputsWriteTheRoundedValues) {
  const int N = 37, C = 45;  // C not a multiple of the lanes: the rows' tails too
  const std::vector<float> x = to_f32(uniform(N * C, 1, -3, 3)), w = to_f32(uniform(C, 2)),
                           b = to_f32(uniform(C, 3));
  std::vector<float> out(N * C), mean(N), rstd(N), mean_b(N), rstd_b(N);
  std::vector<bf16> out_b(N * C);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  layernorm_forward(out_b.data(), mean_b.data(), rstd_b.data(), x.data(), w.data(), b.data(), N, C);
  EXPECT_TRUE(same_bf16_bits(out_b, bf16_rounded(out)));
  EXPECT_EQ(mean_b, mean);
  EXPECT_EQ(rstd_b, rstd);
  const int64_t n = (int64_t{1} << 16) + 13;  // several threads' parts
  const std::vector<float> g = to_f32(uniform(static_cast<size_t>(n), 4, -6, 6));
  std::vector<float> h(static_cast<size_t>(n));
  std::vector<bf16> h_b(static_cast<size_t>(n));
  gelu_forward(h.data(), g.data(), n);
  gelu_forward(h_b.data(), g.data(), n);
  EXPECT_TRUE(same_bf16_bits(h_b, bf16_rounded(h)));
  std::vector<bf16> r(static_cast<size_t>(n));
  EXPECT_EQ(staged_output(r.data(), h.data()), h.data());
  store_staged(r.data(), g.data(), n);
  EXPECT_TRUE(same_bf16_bits(r, bf16_rounded(g)));
}

void saved_linear_case(int N, int IC, int OC) {
  SCOPED_TRACE(::testing::Message() << N << " x " << IC << " x " << OC);
  const std::vector<float> x = to_f32(uniform(N * IC, 11)), w = to_f32(uniform(IC * OC, 12)),
                           bias = to_f32(uniform(OC, 13)), dout = to_f32(uniform(N * OC, 14)),
                           dinp0 = to_f32(uniform(N * IC, 15)), dw0 = to_f32(uniform(IC * OC, 16));
  const std::vector<bf16> xb = bf16_rounded(x);
  const int64_t rows = static_cast<int64_t>(N) * std::max(IC, OC);
  Bf16Scratch f32_input(rows,
                        std::max(static_cast<int64_t>(IC) * OC, static_cast<int64_t>(N) * IC));
  // A bf16 input needs no `other` scratch for itself: the weight's is enough.
  Bf16Scratch bf16_input(rows, static_cast<int64_t>(IC) * OC);
  std::vector<float> want(static_cast<size_t>(N) * OC), got(want.size());
  linear_forward(want.data(), x.data(), w.data(), bias.data(), N, IC, OC, f32_input.bf16s());
  linear_forward(got.data(), xb.data(), w.data(), bias.data(), N, IC, OC, bf16_input.bf16s());
  EXPECT_EQ(got, want);
  std::vector<float> want_dinp = dinp0, want_dw = dw0, want_db(static_cast<size_t>(OC), 0.0f);
  std::vector<float> dinp = dinp0, dw = dw0, db = want_db;
  linear_backward(want_dinp.data(), want_dw.data(), want_db.data(), dout.data(), x.data(), w.data(),
                  N, IC, OC, f32_input.bf16s());
  linear_backward(dinp.data(), dw.data(), db.data(), dout.data(), xb.data(), w.data(), N, IC, OC,
                  bf16_input.bf16s());
  EXPECT_EQ(dinp, want_dinp);
  EXPECT_EQ(dw, want_dw);
  EXPECT_EQ(db, want_db);
  // Without dinp (the row-parallel shard's caller may not want it).
  std::vector<float> dw_only = dw0, want_dw_only = dw0;
  linear_backward(nullptr, want_dw_only.data(), nullptr, dout.data(), x.data(), w.data(), N, IC, OC,
                  f32_input.bf16s());
  linear_backward(nullptr, dw_only.data(), nullptr, dout.data(), xb.data(), w.data(), N, IC, OC,
                  bf16_input.bf16s());
  EXPECT_EQ(dw_only, want_dw_only);
}

TEST(Bf16Activations, LinearOnASavedBf16InputIsTheF32InputCallBitwise) {
  saved_linear_case(37, 48, 29);
  saved_linear_case(128, 192, 160);
}

TEST(Bf16Activations, LmHeadOnASavedBf16InputIsTheF32InputCallBitwise) {
  const int N = 23, C = 40, V = 67, chunk = 7;  // chunks that do not divide the rows
  const std::vector<float> x = to_f32(uniform(N * C, 21)), wte = to_f32(uniform(V * C, 22)),
                           dx0 = to_f32(uniform(N * C, 23)), dwte0 = to_f32(uniform(V * C, 24));
  const std::vector<bf16> xb = bf16_rounded(x);
  std::vector<int32_t> targets;
  for (int n = 0; n < N; ++n)
    targets.push_back(static_cast<int32_t>(random_bits(25, static_cast<uint64_t>(n)) % V));
  Bf16Scratch s(std::max<int64_t>(static_cast<int64_t>(chunk) * (C + V), N * C),
                static_cast<int64_t>(V) * C);
  std::vector<float> logits(static_cast<size_t>(chunk) * V);
  for (bool with_dx : {true, false}) {
    std::vector<float> losses(N), dx = dx0, dwte = dwte0;
    std::vector<float> want_losses(N), want_dx = dx0, want_dwte = dwte0;
    lm_head_loss_forward(want_losses.data(), logits.data(), x.data(), wte.data(), targets.data(), N,
                         C, V, chunk, s.bf16s());
    lm_head_loss_forward(losses.data(), logits.data(), xb.data(), wte.data(), targets.data(), N, C,
                         V, chunk, s.bf16s());
    EXPECT_EQ(losses, want_losses);
    lm_head_loss_backward(with_dx ? want_dx.data() : nullptr, want_dwte.data(), logits.data(),
                          x.data(), wte.data(), targets.data(), 0.25f, N, C, V, chunk, s.bf16s());
    lm_head_loss_backward(with_dx ? dx.data() : nullptr, dwte.data(), logits.data(), xb.data(),
                          wte.data(), targets.data(), 0.25f, N, C, V, chunk, s.bf16s());
    EXPECT_EQ(dx, want_dx) << with_dx;
    EXPECT_EQ(dwte, want_dwte) << with_dx;
  }
  std::vector<float> probs(static_cast<size_t>(N) * V), want_probs(probs.size());
  lm_head_forward(want_probs.data(), x.data(), wte.data(), N, C, V, s.bf16s());
  lm_head_forward(probs.data(), xb.data(), wte.data(), N, C, V, s.bf16s());
  EXPECT_EQ(probs, want_probs);
}

// bf16 values multiplied in f32 would be a silent change of precision: a caller's bug.
TEST(Bf16Activations, ABf16InputNeedsBf16Matmuls) {
  const int N = 4, IC = 8, OC = 8;
  std::vector<bf16> x(N * IC, bf16{0x3f80});
  std::vector<float> w(IC * OC, 1.0f), out(N * OC), dout(N * OC, 1.0f), dw(IC * OC);
  EXPECT_THROW(linear_forward(out.data(), x.data(), w.data(), nullptr, N, IC, OC, {}),
               InternalError);
  EXPECT_THROW(
      linear_backward(nullptr, dw.data(), nullptr, dout.data(), x.data(), w.data(), N, IC, OC, {}),
      InternalError);
  EXPECT_THROW(lm_head_forward(out.data(), x.data(), w.data(), N, IC, OC, {}), InternalError);
}

GPTConfig bf16_model() {
  GPTConfig c;
  c.vocab_size = 61;
  c.n_layers = 2;
  c.n_heads = 2;
  c.d_model = 24;
  c.seq_len = 9;
  c.max_positions = 9;
  c.dropout = 0.1f;
  c.matmul = DType::BF16;
  return c;
}

std::vector<int32_t> tokens_for(int n, uint64_t seed, int vocab) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i)
    t.push_back(static_cast<int32_t>(random_bits(seed, static_cast<uint64_t>(i)) %
                                     static_cast<uint32_t>(vocab)));
  return t;
}

// The buffers act_dtype saves in bf16: attn.y only for the unfused attention kernel, whose
// backward does not read it.
bool saved_in_bf16(const GPTConfig& c, BlockAct k) {
  return k == BlockAct::Ln1Out ||
         (k == BlockAct::AttY && c.attention == AttentionKernel::Unfused) ||
         k == BlockAct::Ln2Out || k == BlockAct::GeluOut;
}

// Every buffer of `acts` replaced by an f32 one: the path that keeps the matmuls' inputs
// unrounded, which Buffers accepts.
void rebind_all_f32(GPTActivations& acts) {
  auto f32 = [](Tensor& t) { t = Tensor::zeros(DType::F32, t.shape()); };
  for (BlockActivations& b : acts.blocks)
    for (Tensor& t : b.buf) f32(t);
  for (Tensor& t : acts.head.buf) f32(t);
}

bool same_tensor_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// The whole model in bf16, its matmul inputs saved in bf16 against saved in f32: the loss, every
// gradient and the next-token distributions bit for bit, with dropout, over two micro-batches of
// accumulated gradients; each bf16 buffer holds the f32 one's values rounded, the others the
// same bits.
TEST(Bf16Activations, ModelLossAndGradientsBitwiseAsSavedInF32) {
  const GPTConfig c = bf16_model();
  const int B = 3, T = 9;
  ParameterSet params(c), grads_b(c), grads_f(c);
  gpt_init(params, 5);
  float* w = params.flat().data_as<float>();
  const std::vector<double> noise = uniform(static_cast<size_t>(params.size()), 6, -0.2, 0.2);
  for (int64_t i = 0; i < params.size(); ++i)
    w[i] += static_cast<float>(noise[static_cast<size_t>(i)]);
  GPTActivations saved_b(c, B, T), saved_f(c, B, T);
  rebind_all_f32(saved_f);
  EXPECT_EQ(saved_b.blocks[0][BlockAct::GeluOut].dtype(), DType::BF16);
  EXPECT_EQ(saved_f.blocks[0][BlockAct::GeluOut].dtype(), DType::F32);
  Workspace ws(c, B, T);
  for (int micro = 0; micro < 2; ++micro) {
    SCOPED_TRACE(micro);
    const std::vector<int32_t> tokens = tokens_for(B * T, 7 + micro, c.vocab_size),
                               targets = tokens_for(B * T, 9 + micro, c.vocab_size);
    const Batch batch{tokens.data(), targets.data(), B, T};
    const StepRng rng{11, 2, micro * B, true};
    const float loss_b = gpt_forward(params, saved_b, ws, batch, rng);
    const float loss_f = gpt_forward(params, saved_f, ws, batch, rng);
    EXPECT_EQ(std::memcmp(&loss_b, &loss_f, sizeof(float)), 0) << loss_b << " " << loss_f;
    for (int l = 0; l < c.n_layers; ++l)
      for (int i = 0; i < kNumActs<BlockAct>; ++i) {
        const auto k = static_cast<BlockAct>(i);
        const Tensor& b = saved_b.blocks[static_cast<size_t>(l)][k];
        const Tensor& f = saved_f.blocks[static_cast<size_t>(l)][k];
        EXPECT_TRUE(same_tensor_bits(b, saved_in_bf16(c, k) ? f.to(DType::BF16) : f))
            << "h." << l << "." << act_suffix(c, k);
      }
    EXPECT_TRUE(same_tensor_bits(saved_b.head[FinalAct::LnfOut],
                                 saved_f.head[FinalAct::LnfOut].to(DType::BF16)));
    gpt_backward(params, grads_b, saved_b, ws, batch, rng, 0.5f);
    gpt_backward(params, grads_f, saved_f, ws, batch, rng, 0.5f);
    EXPECT_TRUE(same_tensor_bits(grads_b.flat(), grads_f.flat()));
  }
  std::vector<float> probs_b(static_cast<size_t>(2) * c.vocab_size), probs_f(probs_b.size());
  final_probabilities(c, params.final_stage(), saved_b.head, ws, B, T, 4, 2, probs_b.data());
  final_probabilities(c, params.final_stage(), saved_f.head, ws, B, T, 4, 2, probs_f.data());
  EXPECT_EQ(probs_b, probs_f);
}

// fp32 training saves everything in f32, as before.
TEST(Bf16Activations, F32MatmulsSaveEverythingInF32) {
  GPTConfig c = bf16_model();
  c.matmul = DType::F32;
  for (int i = 0; i < kNumActs<BlockAct>; ++i)
    EXPECT_EQ(act_dtype(c, static_cast<BlockAct>(i)), DType::F32) << i;
  for (int i = 0; i < kNumActs<FinalAct>; ++i)
    EXPECT_EQ(act_dtype(c, static_cast<FinalAct>(i)), DType::F32) << i;
  EXPECT_EQ(act_dtype(c, EmbeddingAct::Out), DType::F32);
}

// The four matmul inputs of a block (three with the fused attention kernel, whose backward reads
// attn.y) and ln_f's output take 2 bytes an element, everything else 4: in the specs, in what
// GPTActivations allocates and in the chain layout's buffers.
TEST(Bf16Activations, TheMatmulInputsBytesHalve) {
  for (AttentionKernel kernel : {AttentionKernel::Fused, AttentionKernel::Unfused}) {
    SCOPED_TRACE(kernel == AttentionKernel::Fused ? "fused attention" : "unfused attention");
    GPTConfig b16 = bf16_model();
    b16.attention = kernel;
    GPTConfig f32 = b16;
    f32.matmul = DType::F32;
    const int B = 3, T = 9;
    const int64_t N = B * T, C = b16.d_model;
    const int64_t y = kernel == AttentionKernel::Unfused ? C : 0;  // attn.y in bf16
    for (int i = 0; i < kNumActs<BlockAct>; ++i) {
      const auto k = static_cast<BlockAct>(i);
      EXPECT_EQ(act_dtype(b16, k), saved_in_bf16(b16, k) ? DType::BF16 : DType::F32)
          << act_suffix(b16, k);
    }
    EXPECT_EQ(act_dtype(b16, FinalAct::LnfOut), DType::BF16);
    EXPECT_EQ(act_dtype(b16, FinalAct::Losses), DType::F32);
    // Per block (C + y + C + 4C) elements of a token at 2 bytes instead of 4; ln_f's C too.
    const size_t saved_per_block = static_cast<size_t>((6 * C + y) * N * 2), saved_head = C * N * 2;
    auto total = [](const std::vector<ActivationSpec>& specs) {
      size_t s = 0;
      for (const ActivationSpec& a : specs) s += a.bytes();
      return s;
    };
    EXPECT_EQ(total(block_activation_specs(b16, 0, B, T)) + saved_per_block,
              total(block_activation_specs(f32, 0, B, T)));
    const size_t want = total(gpt_activation_specs(f32, B, T)) -
                        saved_per_block * static_cast<size_t>(b16.n_layers) - saved_head;
    EXPECT_EQ(total(gpt_activation_specs(b16, B, T)), want);
    CountingAllocator counting;
    {
      const GPTActivations acts(b16, B, T, counting);
      EXPECT_EQ(counting.live_bytes(), want);
    }
    // The chain layout: the attention half saves ln_1.out (and attn.y) in bf16, the MLP half
    // ln_2.out and mlp.gelu.out, the head ln_f.out; the planner and the memory estimate place
    // these bytes.
    auto bytes = [](const std::vector<ChainLayout::Buffer>& buffers) {
      uint64_t s = 0;
      for (const auto& b : buffers) s += b.bytes();
      return s;
    };
    const ChainLayout lb = gpt_chain_layout(b16, B, T, 0, 2, true, {{true, 0}, {false, 0}});
    const ChainLayout lf = gpt_chain_layout(f32, B, T, 0, 2, true, {{true, 0}, {false, 0}});
    EXPECT_EQ(bytes(lb.kinds[0].buffers) + static_cast<uint64_t>((C + y) * N * 2),
              bytes(lf.kinds[0].buffers));
    EXPECT_EQ(bytes(lb.kinds[1].buffers) + static_cast<uint64_t>(5 * C * N * 2),
              bytes(lf.kinds[1].buffers));
    EXPECT_EQ(bytes(lb.head) + static_cast<uint64_t>(C * N * 2), bytes(lf.head));
    EXPECT_EQ(lb.kinds[1].buffers[4].dtype, DType::BF16);  // mlp.gelu.out
    EXPECT_EQ(lb.kinds[1].buffers[3].dtype, DType::F32);   // mlp.c_fc.out: GELU's f32 input
  }
}

// A bf16 slot takes a bf16 or an f32 buffer; a slot saved in f32 takes only f32.
TEST(Bf16Activations, ABufferOfAnotherTypeIsRefused) {
  const GPTConfig c = bf16_model();
  const int B = 1, T = 4;
  ParameterSet params(c);
  GPTActivations acts(c, B, T);
  Workspace ws(c, B, T);
  acts.blocks[1][BlockAct::FcOut] = Tensor::zeros(DType::BF16, {B, T, 4 * c.d_model});
  const std::vector<int32_t> tokens(B * T, 1);
  try {
    gpt_forward(params, acts, ws, Batch{tokens.data(), tokens.data(), B, T}, StepRng{});
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "activation buffer h.1.mlp.c_fc.out is bf16[1, 4, 96]; the stage needs "
                  "f32[1, 4, 96]"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tandem::nn
