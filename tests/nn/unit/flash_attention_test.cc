// The fused, blocked attention (flash_attention_forward/backward) against the kernel that saves
// the softmax (attention_forward/backward) and against the double reference: over shapes, T not
// a multiple of the block, T = 1, grouped-query heads, dropout; its log-sum-exp against one
// computed in double; its gradient against finite differences; thread counts; its bf16 block
// products against its f32 ones (again under TANDEM_BF16=emulate: nn.unit.bf16_emulate).
//
// Tolerances: the two f32 kernels sum in different orders (online softmax, blocked products), so
// they agree to f32 rounding: rtol 2e-6 of max|out| for the output, 1e-5 of each part's
// max|grad| (and 1e-6 absolute) for dq, dk and dv (one more product and the softmax backward in
// the chain).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "nn/nn_test_util.h"
#include "tandem/core/blas.h"
#include "tandem/core/error.h"
#include "tandem/nn/layers.h"
#include "tandem/nn/reference.h"

namespace tandem::nn {
namespace flash_attention_test {

using namespace tandem::nn::testing;

struct Case {
  int B, T, NH, KVH, HS;
  FlashBlocks blocks;
  float p = 0.0f;  // dropout
  std::string str() const {
    return "B " + std::to_string(B) + " T " + std::to_string(T) + " NH " + std::to_string(NH) +
           " KVH " + std::to_string(KVH) + " HS " + std::to_string(HS) + " blocks " +
           std::to_string(blocks.rows) + "x" + std::to_string(blocks.cols) + " dropout " +
           std::to_string(p);
  }
};

AttentionDropout dropout_of(const Case& s) {
  AttentionDropout d;
  d.p = s.p;
  d.key = 777;
  d.sample_offset = 3;  // a batch shard and a head shard draw where the whole batch would
  d.head_offset = 1;
  d.n_heads_total = s.NH + 2;
  return d;
}

// The columns [first, first + width) of each of the N rows of a (N, W) buffer, in double.
template <typename V>
std::vector<double> columns(const V& v, int N, int W, int first, int width) {
  std::vector<double> r;
  for (int n = 0; n < N; ++n)
    for (int j = first; j < first + width; ++j)
      r.push_back(static_cast<double>(v[static_cast<size_t>(n) * W + j]));
  return r;
}

// Both kernels, forward and backward, on the same input: their outputs and dq, dk, dv agree.
void compare_with_saved_softmax(const Case& s) {
  SCOPED_TRACE(s.str());
  const int N = s.B * s.T, W = (s.NH + 2 * s.KVH) * s.HS, C = s.NH * s.HS;
  const AttentionDropout drop = dropout_of(s);
  const std::vector<float> qkv = to_f32(uniform(static_cast<size_t>(N) * W, 91, -2.0, 2.0));
  const std::vector<float> dout = to_f32(uniform(static_cast<size_t>(N) * C, 92));

  std::vector<float> out_ref(static_cast<size_t>(N) * C),
      att(static_cast<size_t>(s.B) * s.NH * s.T * s.T),
      scratch_ref(static_cast<size_t>(attention_scratch_floats(s.T)));
  attention_forward(out_ref.data(), att.data(), scratch_ref.data(), qkv.data(), s.B, s.T, s.NH,
                    s.KVH, s.HS, drop);
  std::vector<float> dqkv_ref(qkv.size());
  attention_backward(dqkv_ref.data(), scratch_ref.data(), dout.data(), qkv.data(), att.data(), s.B,
                     s.T, s.NH, s.KVH, s.HS, drop);

  std::vector<float> out(out_ref.size(), NAN), lse(static_cast<size_t>(s.B) * s.NH * s.T, NAN),
      scratch(static_cast<size_t>(flash_attention_scratch_floats(s.T, s.HS, s.blocks)));
  flash_attention_forward(out.data(), lse.data(), scratch.data(), qkv.data(), s.B, s.T, s.NH, s.KVH,
                          s.HS, drop, s.blocks);
  EXPECT_TRUE(all_close("out", out, out_ref, 2e-6));
  std::vector<float> dqkv(qkv.size());
  flash_attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), out.data(),
                           lse.data(), s.B, s.T, s.NH, s.KVH, s.HS, drop, s.blocks);
  // Per part, each against its own scale (dk and dv grow with the group), and 1e-6 absolute:
  // at T = 1 dq and dk are exactly zero in the saved-softmax kernel (p = 1, so p (dp - D) is
  // dp - dp) and a few 1e-8 here (D is dout . out, rounded otherwise).
  const int K = s.KVH * s.HS;
  const auto part = [&](const char* name, int first, int width) {
    return all_close(name, columns(dqkv, N, W, first, width), columns(dqkv_ref, N, W, first, width),
                     1e-5, 1e-6);
  };
  EXPECT_TRUE(part("dq", 0, C));
  EXPECT_TRUE(part("dk", C, K));
  EXPECT_TRUE(part("dv", C + K, K));

  // lse against log sum_j exp(q_i . k_j / sqrt(HS)), j <= i, in double.
  std::vector<double> lse_want;
  const int group = s.NH / s.KVH;
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int i = 0; i < s.T; ++i) {
        const float* q = qkv.data() + static_cast<size_t>(b * s.T + i) * W + h * s.HS;
        std::vector<double> sc;
        for (int j = 0; j <= i; ++j) {
          const float* k = qkv.data() + static_cast<size_t>(b * s.T + j) * W + C + h / group * s.HS;
          double d = 0.0;
          for (int e = 0; e < s.HS; ++e) d += static_cast<double>(q[e]) * k[e];
          sc.push_back(d / std::sqrt(static_cast<double>(s.HS)));
        }
        double m = sc[0], sum = 0.0;
        for (double x : sc) m = std::max(m, x);
        for (double x : sc) sum += std::exp(x - m);
        lse_want.push_back(m + std::log(sum));
      }
  EXPECT_TRUE(all_close("lse", to_f64(lse), lse_want, 1e-6, 1e-6));
}

TEST(FlashAttention, EqualsSavedSoftmaxKernelOverShapes) {
  const FlashBlocks tiny{8, 8};
  for (float p : {0.0f, 0.2f}) {
    compare_with_saved_softmax({2, 37, 2, 2, 8, tiny, p});       // T uneven: a partial last block
    compare_with_saved_softmax({1, 1, 3, 3, 4, tiny, p});        // T = 1
    compare_with_saved_softmax({1, 1, 3, 3, 4, {}, p});          // T = 1, the default blocks
    compare_with_saved_softmax({2, 16, 2, 2, 8, tiny, p});       // T a multiple of the block
    compare_with_saved_softmax({1, 45, 2, 2, 8, {16, 8}, p});    // rows > cols
    compare_with_saved_softmax({1, 45, 2, 2, 8, {8, 16}, p});    // rows < cols
    compare_with_saved_softmax({1, 45, 2, 2, 8, {5, 3}, p});     // odd blocks
    compare_with_saved_softmax({1, 150, 3, 3, 64, {}, p});       // the default blocks, uneven
    compare_with_saved_softmax({2, 37, 6, 2, 8, tiny, p});       // grouped-query: 3 a group
    compare_with_saved_softmax({2, 37, 6, 1, 8, tiny, p});       // multi-query
    compare_with_saved_softmax({1, 29, 4, 2, 16, {16, 16}, p});  // grouped, one partial block
  }
}

// MHA against the double reference (reference.h), through the same LayerCase-free path: the
// f32 kernel within f32 rounding of the exact values.
TEST(FlashAttention, EqualsDoubleReference) {
  const int B = 2, T = 21, NH = 2, HS = 5, C = NH * HS, N = B * T;
  for (float p : {0.0f, 0.3f}) {
    SCOPED_TRACE("dropout " + std::to_string(p));
    AttentionDropout drop;
    drop.p = p;
    drop.key = 99;
    const std::vector<double> qkv = uniform(static_cast<size_t>(N) * 3 * C, 93, -2.0, 2.0);
    const std::vector<double> g = uniform(static_cast<size_t>(N) * C, 94);
    std::vector<double> out_ref(static_cast<size_t>(N) * C),
        att(static_cast<size_t>(B) * NH * T * T), d_ref(qkv.size());
    ref::attention_forward(out_ref.data(), att.data(), qkv.data(), B, T, NH, HS, drop);
    ref::attention_backward(d_ref.data(), g.data(), qkv.data(), att.data(), B, T, NH, HS, drop);

    const std::vector<float> qkv32 = to_f32(qkv), g32 = to_f32(g);
    const FlashBlocks blocks{4, 8};
    std::vector<float> out(out_ref.size()), lse(static_cast<size_t>(B) * NH * T),
        scratch(static_cast<size_t>(flash_attention_scratch_floats(T, HS, blocks))), d(qkv.size());
    flash_attention_forward(out.data(), lse.data(), scratch.data(), qkv32.data(), B, T, NH, NH, HS,
                            drop, blocks);
    EXPECT_TRUE(all_close("out", out, out_ref, 2e-6));
    flash_attention_backward(d.data(), scratch.data(), g32.data(), qkv32.data(), out.data(),
                             lse.data(), B, T, NH, NH, HS, drop, blocks);
    EXPECT_TRUE(all_close("dqkv", d, d_ref, 1e-5));
    // Gradients accumulate: a second call doubles them.
    std::vector<float> twice = d;
    flash_attention_backward(twice.data(), scratch.data(), g32.data(), qkv32.data(), out.data(),
                             lse.data(), B, T, NH, NH, HS, drop, blocks);
    for (float& x : d) x *= 2.0f;
    EXPECT_TRUE(all_close("twice", twice, d, 1e-6));
  }
}

// The f32 kernel's own gradient against central differences of its own forward (loss
// sum(out * g), summed in double), on a tiny grouped case spanning several blocks. In f32 the
// difference quotient carries rounding of about eps / h = 6e-5 of the loss.
TEST(FlashAttention, GradientMatchesFiniteDifferences) {
  const int B = 1, T = 7, NH = 2, KVH = 1, HS = 3, N = B * T, W = (NH + 2 * KVH) * HS;
  const int C = NH * HS;
  const FlashBlocks blocks{3, 2};
  for (float p : {0.0f, 0.25f}) {
    SCOPED_TRACE("dropout " + std::to_string(p));
    AttentionDropout drop;
    drop.p = p;
    drop.key = 5;
    const std::vector<double> x = uniform(static_cast<size_t>(N) * W, 95, -1.5, 1.5);
    const std::vector<double> g = uniform(static_cast<size_t>(N) * C, 96);
    std::vector<float> scratch(static_cast<size_t>(flash_attention_scratch_floats(T, HS, blocks)));
    const auto loss = [&](const std::vector<double>& in) {
      const std::vector<float> in32 = to_f32(in);
      std::vector<float> out(static_cast<size_t>(N) * C), lse(static_cast<size_t>(B) * NH * T);
      flash_attention_forward(out.data(), lse.data(), scratch.data(), in32.data(), B, T, NH, KVH,
                              HS, drop, blocks);
      double s = 0.0;
      for (size_t i = 0; i < out.size(); ++i) s += static_cast<double>(out[i]) * g[i];
      return s;
    };
    const std::vector<size_t> all = spread(x.size(), x.size());
    const std::vector<double> fd = finite_difference(loss, x, all, 1e-2);

    const std::vector<float> x32 = to_f32(x), g32 = to_f32(g);
    std::vector<float> out(static_cast<size_t>(N) * C), lse(static_cast<size_t>(B) * NH * T),
        d(x.size());
    flash_attention_forward(out.data(), lse.data(), scratch.data(), x32.data(), B, T, NH, KVH, HS,
                            drop, blocks);
    flash_attention_backward(d.data(), scratch.data(), g32.data(), x32.data(), out.data(),
                             lse.data(), B, T, NH, KVH, HS, drop, blocks);
    EXPECT_TRUE(all_close("d(qkv) vs finite differences", d, fd, 0.0, 2e-3));
  }
}

// Bitwise the same at one thread and at several: every task writes its own memory.
TEST(FlashAttention, ThreadCountIndependent) {
  const int B = 2, T = 77, NH = 4, KVH = 2, HS = 16, N = B * T, W = (NH + 2 * KVH) * HS;
  AttentionDropout drop;
  drop.p = 0.1f;
  drop.key = 3;
  const FlashBlocks blocks{16, 16};
  const std::vector<float> qkv = to_f32(uniform(static_cast<size_t>(N) * W, 97, -2.0, 2.0));
  const std::vector<float> dout = to_f32(uniform(static_cast<size_t>(N) * NH * HS, 98));
  std::vector<float> scratch(static_cast<size_t>(flash_attention_scratch_floats(T, HS, blocks)));
  const int width = blas::num_threads();
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2, 3}) {
    blas::set_num_threads(threads);
    std::vector<float> out(static_cast<size_t>(N) * NH * HS), lse(static_cast<size_t>(B) * NH * T),
        d(qkv.size());
    flash_attention_forward(out.data(), lse.data(), scratch.data(), qkv.data(), B, T, NH, KVH, HS,
                            drop, blocks);
    flash_attention_backward(d.data(), scratch.data(), dout.data(), qkv.data(), out.data(),
                             lse.data(), B, T, NH, KVH, HS, drop, blocks);
    out.insert(out.end(), lse.begin(), lse.end());
    out.insert(out.end(), d.begin(), d.end());
    results.push_back(out);
  }
  blas::set_num_threads(width);
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
}

// bf16 block products (products = BF16) against the f32 kernel on the same input: the operands
// of every product rounded to bf16 (relative error at most 2^-9), the softmax and the sums in f32.
// With the inputs in [-1, 1] the differences measured, relative to each result's largest value,
// are about 2e-3 for the output and 2e-4 for the log-sum-exp, and 2.5e-3 for d(qkv); the
// tolerances are about 3x (each gradient part against its own scale: 1.5e-2; the log-sum-exp
// also 2e-3 absolute: at T = 1 it is one score, moved by about 1e-3 by q's and k's rounding). Where
// a gradient is zero in exact arithmetic (T = 1: p = 1, so p (dp - D) cancels) the bf16 dp no
// longer cancels f32's D exactly: a residue of a few 1e-4 of the gradients' scale, allowed
// absolutely. Not bitwise: the f32 kernel is not what bf16 computes, and the test checks that the
// bf16 path ran (the results differ). The scratch is the size flash_attention_scratch_floats gives:
// a guard past its end stays untouched.
void compare_bf16_with_f32(const Case& s) {
  SCOPED_TRACE(s.str());
  const int N = s.B * s.T, W = (s.NH + 2 * s.KVH) * s.HS, C = s.NH * s.HS;
  const AttentionDropout drop = dropout_of(s);
  const std::vector<float> qkv = to_f32(uniform(static_cast<size_t>(N) * W, 191, -1.0, 1.0));
  const std::vector<float> dout = to_f32(uniform(static_cast<size_t>(N) * C, 192));
  struct Result {
    std::vector<float> out, lse, dqkv;
  };
  const auto run = [&](DType products) {
    const size_t floats =
        static_cast<size_t>(flash_attention_scratch_floats(s.T, s.HS, s.blocks, products));
    const size_t guard = 64;
    std::vector<float> scratch(floats + guard, -7.0f);
    Result r{std::vector<float>(static_cast<size_t>(N) * C, NAN),
             std::vector<float>(static_cast<size_t>(s.B) * s.NH * s.T, NAN),
             std::vector<float>(qkv.size())};
    flash_attention_forward(r.out.data(), r.lse.data(), scratch.data(), qkv.data(), s.B, s.T, s.NH,
                            s.KVH, s.HS, drop, s.blocks, products);
    flash_attention_backward(r.dqkv.data(), scratch.data(), dout.data(), qkv.data(), r.out.data(),
                             r.lse.data(), s.B, s.T, s.NH, s.KVH, s.HS, drop, s.blocks, products);
    for (size_t i = floats; i < floats + guard; ++i)
      EXPECT_EQ(scratch[i], -7.0f) << "scratch written past its size at " << i - floats;
    return r;
  };
  const Result f32 = run(DType::F32), half = run(DType::BF16);
  EXPECT_TRUE(all_close("out", half.out, f32.out, 6e-3));
  EXPECT_TRUE(all_close("lse", half.lse, f32.lse, 1e-3, 2e-3));
  const int K = s.KVH * s.HS;
  double grads = 0.0;
  for (float g : f32.dqkv) grads = std::max(grads, static_cast<double>(std::fabs(g)));
  const auto part = [&](const char* name, int first, int width) {
    return all_close(name, columns(half.dqkv, N, W, first, width),
                     columns(f32.dqkv, N, W, first, width), 1.5e-2, 1e-3 * grads);
  };
  EXPECT_TRUE(part("dq", 0, C));
  EXPECT_TRUE(part("dk", C, K));
  EXPECT_TRUE(part("dv", C + K, K));
  if (s.T > 1) {
    EXPECT_NE(half.out, f32.out) << "the bf16 products were not taken";
  }
}

TEST(FlashAttention, Bf16ProductsWithinBf16RoundingOfF32) {
  const FlashBlocks tiny{8, 8};
  for (float p : {0.0f, 0.2f}) {
    compare_bf16_with_f32({2, 37, 2, 2, 8, tiny, p});     // a partial last block
    compare_bf16_with_f32({1, 1, 3, 3, 4, tiny, p});      // T = 1
    compare_bf16_with_f32({1, 45, 2, 2, 8, {16, 8}, p});  // rows > cols
    compare_bf16_with_f32({1, 45, 2, 2, 8, {5, 3}, p});   // odd blocks
    compare_bf16_with_f32({2, 37, 6, 2, 8, tiny, p});     // grouped-query
    compare_bf16_with_f32({1, 150, 2, 2, 64, {}, p});     // the default blocks, uneven
  }
}

// bf16 products are bitwise the same at one thread and at several, as f32's are.
TEST(FlashAttention, Bf16ProductsThreadCountIndependent) {
  const int B = 2, T = 77, NH = 4, KVH = 2, HS = 16, N = B * T, W = (NH + 2 * KVH) * HS;
  AttentionDropout drop;
  drop.p = 0.1f;
  drop.key = 3;
  const FlashBlocks blocks{16, 16};
  const std::vector<float> qkv = to_f32(uniform(static_cast<size_t>(N) * W, 197, -1.0, 1.0));
  const std::vector<float> dout = to_f32(uniform(static_cast<size_t>(N) * NH * HS, 198));
  std::vector<float> scratch(
      static_cast<size_t>(flash_attention_scratch_floats(T, HS, blocks, DType::BF16)));
  const int width = blas::num_threads();
  std::vector<std::vector<float>> results;
  for (int threads : {1, 3}) {
    blas::set_num_threads(threads);
    std::vector<float> out(static_cast<size_t>(N) * NH * HS), lse(static_cast<size_t>(B) * NH * T),
        d(qkv.size());
    flash_attention_forward(out.data(), lse.data(), scratch.data(), qkv.data(), B, T, NH, KVH, HS,
                            drop, blocks, DType::BF16);
    flash_attention_backward(d.data(), scratch.data(), dout.data(), qkv.data(), out.data(),
                             lse.data(), B, T, NH, KVH, HS, drop, blocks, DType::BF16);
    out.insert(out.end(), lse.begin(), lse.end());
    out.insert(out.end(), d.begin(), d.end());
    results.push_back(out);
  }
  blas::set_num_threads(width);
  EXPECT_EQ(results[0], results[1]);
}

// The rows form (context parallelism's): the sequence's query rows cut into parts, each part's
// rows at their positions against the whole sequence's keys and values, give the whole call's
// output and log-sum-exp rows and its dq rows, and the parts' dk and dv summed give the whole
// call's (f32 rounding: the blocks cut the rows elsewhere; the tolerances of
// compare_with_saved_softmax). With every row in one part the call is the whole one bit for bit.
// The parts: context parallelism's balanced cut (2P chunks, part i holding chunks i and 2P-1-i),
// and an irregular one (every third row, and the rest).
std::vector<std::vector<int>> balanced_parts(int T, int P) {
  const int chunk = T / (2 * P);
  std::vector<std::vector<int>> parts(static_cast<size_t>(P));
  for (int i = 0; i < P; ++i)
    for (int c : {i, 2 * P - 1 - i})
      for (int t = c * chunk; t < (c + 1) * chunk; ++t) parts[static_cast<size_t>(i)].push_back(t);
  return parts;
}

void compare_rows_with_whole(const Case& s, const std::vector<std::vector<int>>& parts,
                             bool bitwise = false) {
  SCOPED_TRACE(s.str() + " in " + std::to_string(parts.size()) + " parts");
  const int N = s.B * s.T, W = (s.NH + 2 * s.KVH) * s.HS, C = s.NH * s.HS, K = s.KVH * s.HS;
  const AttentionDropout drop = dropout_of(s);
  const std::vector<float> qkv = to_f32(uniform(static_cast<size_t>(N) * W, 291, -2.0, 2.0));
  const std::vector<float> dout = to_f32(uniform(static_cast<size_t>(N) * C, 292));
  std::vector<float> out(static_cast<size_t>(N) * C), lse(static_cast<size_t>(s.B) * s.NH * s.T),
      dqkv(qkv.size()),
      scratch(static_cast<size_t>(flash_attention_scratch_floats(s.T, s.HS, s.blocks)));
  flash_attention_forward(out.data(), lse.data(), scratch.data(), qkv.data(), s.B, s.T, s.NH, s.KVH,
                          s.HS, drop, s.blocks);
  flash_attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), out.data(),
                           lse.data(), s.B, s.T, s.NH, s.KVH, s.HS, drop, s.blocks);
  // kv (B, T, 2K): the k and v columns of every row.
  std::vector<float> kv(static_cast<size_t>(N) * 2 * K);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < 2 * K; ++c)
      kv[static_cast<size_t>(n) * 2 * K + c] = qkv[static_cast<size_t>(n) * W + C + c];
  // Each part's results scattered back to the rows they belong to; dkv summed over the parts.
  std::vector<float> out_rows(out.size(), NAN), lse_rows(lse.size(), NAN),
      dq_rows(qkv.size(), 0.0f), dkv(kv.size(), 0.0f);
  for (const std::vector<int>& pos : parts) {
    const int Tq = static_cast<int>(pos.size());
    const AttentionRows rows{Tq, s.T, pos.data()};
    std::vector<float> q(static_cast<size_t>(s.B) * Tq * W), o(static_cast<size_t>(s.B) * Tq * C),
        l(static_cast<size_t>(s.B) * s.NH * Tq), dy(o.size()), dq(q.size(), 0.0f),
        sc(static_cast<size_t>(flash_attention_scratch_floats(rows, s.HS, s.blocks)));
    for (int b = 0; b < s.B; ++b)
      for (int r = 0; r < Tq; ++r) {
        const size_t from = static_cast<size_t>(b) * s.T + pos[r],
                     to = static_cast<size_t>(b) * Tq + r;
        std::copy_n(qkv.begin() + from * W, W, q.begin() + to * W);
        std::copy_n(dout.begin() + from * C, C, dy.begin() + to * C);
      }
    flash_attention_forward(o.data(), l.data(), sc.data(), q.data(), kv.data(), rows, s.B, s.NH,
                            s.KVH, s.HS, drop, s.blocks);
    flash_attention_backward(dq.data(), dkv.data(), sc.data(), dy.data(), q.data(), kv.data(),
                             o.data(), l.data(), rows, s.B, s.NH, s.KVH, s.HS, drop, s.blocks);
    for (int b = 0; b < s.B; ++b)
      for (int r = 0; r < Tq; ++r) {
        const size_t from = static_cast<size_t>(b) * Tq + r,
                     to = static_cast<size_t>(b) * s.T + pos[r];
        std::copy_n(o.begin() + from * C, C, out_rows.begin() + to * C);
        std::copy_n(dq.begin() + from * W, C, dq_rows.begin() + to * W);
        for (int h = 0; h < s.NH; ++h)
          lse_rows[(static_cast<size_t>(b) * s.NH + h) * s.T + pos[r]] =
              l[(static_cast<size_t>(b) * s.NH + h) * Tq + r];
      }
  }
  const std::vector<double> dq_want = columns(dqkv, N, W, 0, C),
                            dq_got = columns(dq_rows, N, W, 0, C);
  const std::vector<double> dk_want = columns(dqkv, N, W, C, 2 * K),
                            dk_got = columns(dkv, N, 2 * K, 0, 2 * K);
  if (bitwise) {
    EXPECT_EQ(out_rows, out);
    EXPECT_EQ(lse_rows, lse);
    EXPECT_EQ(dq_got, dq_want);
    EXPECT_EQ(dk_got, dk_want);
    return;
  }
  EXPECT_TRUE(all_close("out", out_rows, out, 2e-6));
  EXPECT_TRUE(all_close("lse", to_f64(lse_rows), to_f64(lse), 1e-6, 1e-6));
  EXPECT_TRUE(all_close("dq", dq_got, dq_want, 1e-5, 1e-6));
  EXPECT_TRUE(all_close("dk, dv", dk_got, dk_want, 1e-5, 1e-6));
}

TEST(FlashAttention, RowsAtTheirPositionsEqualTheWholeSequence) {
  const FlashBlocks tiny{8, 8};
  for (float p : {0.0f, 0.2f}) {
    for (int P : {1, 2, 3, 4}) {
      compare_rows_with_whole({2, 48, 2, 2, 8, tiny, p}, balanced_parts(48, P));
      compare_rows_with_whole({1, 48, 6, 2, 8, {5, 3}, p}, balanced_parts(48, P));    // GQA
      compare_rows_with_whole({1, 24, 3, 1, 4, {16, 16}, p}, balanced_parts(24, P));  // MQA
    }
    std::vector<std::vector<int>> irregular(2);
    for (int t = 0; t < 37; ++t) irregular[t % 3 == 0 ? 0 : 1].push_back(t);
    compare_rows_with_whole({2, 37, 4, 2, 8, tiny, p}, irregular);
    std::vector<std::vector<int>> whole(1);
    for (int t = 0; t < 37; ++t) whole[0].push_back(t);
    compare_rows_with_whole({2, 37, 4, 2, 8, tiny, p}, whole, true);
  }
}

// Key ranges (context parallelism's overlap: a rank's own keys first, the others' as they come):
// the calls over ranges cut at `cuts` (ascending, inside (0, T)), their forwards merged by
// flash_attention_merge in the order given by `order` (a permutation of the ranges) and their
// backwards (each with the whole call's out and lse) summed, give the one call over every key, to
// f32 rounding (the tolerances above). A range above every row gives out 0 and lse -inf.
void compare_key_ranges(const Case& s, const std::vector<int>& pos, const std::vector<int>& cuts,
                        const std::vector<int>& order) {
  SCOPED_TRACE(s.str() + " in " + std::to_string(cuts.size() + 1) + " key ranges");
  const int Tq = static_cast<int>(pos.size()), W = (s.NH + 2 * s.KVH) * s.HS, C = s.NH * s.HS,
            K = s.KVH * s.HS;
  const AttentionDropout drop = dropout_of(s);
  const std::vector<float> q = to_f32(uniform(static_cast<size_t>(s.B) * Tq * W, 391, -2.0, 2.0));
  const std::vector<float> kv =
      to_f32(uniform(static_cast<size_t>(s.B) * s.T * 2 * K, 392, -2.0, 2.0));
  const std::vector<float> dy = to_f32(uniform(static_cast<size_t>(s.B) * Tq * C, 393));
  const AttentionRows all{Tq, s.T, pos.data()};
  std::vector<float> out(dy.size()), lse(static_cast<size_t>(s.B) * s.NH * Tq), dq(q.size(), 0.0f),
      dkv(kv.size(), 0.0f),
      sc(static_cast<size_t>(flash_attention_scratch_floats(all, s.HS, s.blocks)));
  flash_attention_forward(out.data(), lse.data(), sc.data(), q.data(), kv.data(), all, s.B, s.NH,
                          s.KVH, s.HS, drop, s.blocks);
  flash_attention_backward(dq.data(), dkv.data(), sc.data(), dy.data(), q.data(), kv.data(),
                           out.data(), lse.data(), all, s.B, s.NH, s.KVH, s.HS, drop, s.blocks);

  std::vector<int> edges = {0};
  edges.insert(edges.end(), cuts.begin(), cuts.end());
  edges.push_back(s.T);
  std::vector<float> got_out(out.size(), NAN), got_lse(lse.size(), NAN), part_out(out.size()),
      part_lse(lse.size()), got_dq(q.size(), 0.0f), got_dkv(kv.size(), 0.0f);
  for (size_t n = 0; n < order.size(); ++n) {
    const size_t k = static_cast<size_t>(order[n]);
    const AttentionRows range{Tq, s.T, pos.data(), edges[k], edges[k + 1] - edges[k]};
    float* o = n == 0 ? got_out.data() : part_out.data();
    float* l = n == 0 ? got_lse.data() : part_lse.data();
    flash_attention_forward(o, l, sc.data(), q.data(), kv.data(), range, s.B, s.NH, s.KVH, s.HS,
                            drop, s.blocks);
    if (edges[k] > pos.back()) {  // no row sees these keys
      EXPECT_EQ(std::vector<float>(l, l + lse.size()),
                std::vector<float>(lse.size(), -std::numeric_limits<float>::infinity()));
      EXPECT_EQ(std::vector<float>(o, o + out.size()), std::vector<float>(out.size(), 0.0f));
    }
    if (n > 0)
      flash_attention_merge(got_out.data(), got_lse.data(), part_out.data(), part_lse.data(), s.B,
                            Tq, s.NH, s.HS);
    flash_attention_backward(got_dq.data(), got_dkv.data(), sc.data(), dy.data(), q.data(),
                             kv.data(), out.data(), lse.data(), range, s.B, s.NH, s.KVH, s.HS, drop,
                             s.blocks);
  }
  EXPECT_TRUE(all_close("out", got_out, out, 2e-6));
  EXPECT_TRUE(all_close("lse", to_f64(got_lse), to_f64(lse), 1e-6, 1e-6));
  EXPECT_TRUE(all_close("dq", columns(got_dq, s.B * Tq, W, 0, C), columns(dq, s.B * Tq, W, 0, C),
                        1e-5, 1e-6));
  EXPECT_TRUE(all_close("dk, dv", got_dkv, dkv, 1e-5, 1e-6));
}

TEST(FlashAttention, KeyRangesMergeToEveryKey) {
  const FlashBlocks tiny{8, 8};
  for (float p : {0.0f, 0.2f}) {
    // Rank 0 of 2's rows (chunks 0 and 3 of 4): its own chunks' keys first, then the others'.
    std::vector<int> rank0;
    for (int c : {0, 3})
      for (int t = c * 12; t < (c + 1) * 12; ++t) rank0.push_back(t);
    compare_key_ranges({2, 48, 2, 2, 8, tiny, p}, rank0, {12, 36}, {0, 2, 1});
    compare_key_ranges({1, 48, 6, 2, 8, {5, 3}, p}, rank0, {12, 36}, {2, 0, 1});  // GQA
    compare_key_ranges({1, 48, 3, 1, 4, {16, 16}, p}, rank0, {7, 12, 29, 36}, {4, 0, 3, 1, 2});
    // Rows that stop early: the last range is above every one of them.
    const std::vector<int> early = {1, 2, 5, 9, 10, 11, 17};
    compare_key_ranges({2, 37, 4, 2, 8, tiny, p}, early, {3, 18}, {1, 0, 2});
  }
}

// Keys read from a buffer of their own (context parallelism's ring: one chunk of a rank's piece,
// kv_rows rows a sample from position kv_first) give what the same range of the whole sequence's
// buffer gives, bit for bit (the same arithmetic on the same values), and their gradient lands in
// the same rows of a dkv laid out as that buffer.
void compare_own_buffer(const Case& s, const std::vector<int>& pos, int first, int count,
                        int margin) {
  SCOPED_TRACE(s.str() + " keys " + std::to_string(first) + " + " + std::to_string(count));
  const int Tq = static_cast<int>(pos.size()), W = (s.NH + 2 * s.KVH) * s.HS, C = s.NH * s.HS,
            K = s.KVH * s.HS;
  const AttentionDropout drop = dropout_of(s);
  const std::vector<float> q = to_f32(uniform(static_cast<size_t>(s.B) * Tq * W, 491, -2.0, 2.0));
  const std::vector<float> kv =
      to_f32(uniform(static_cast<size_t>(s.B) * s.T * 2 * K, 492, -2.0, 2.0));
  const std::vector<float> dy = to_f32(uniform(static_cast<size_t>(s.B) * Tq * C, 493));
  const AttentionRows whole{Tq, s.T, pos.data(), first, count};
  std::vector<float> out(dy.size()), lse(static_cast<size_t>(s.B) * s.NH * Tq), dq(q.size(), 0.0f),
      dkv(kv.size(), 0.0f),
      sc(static_cast<size_t>(flash_attention_scratch_floats(whole, s.HS, s.blocks)));
  flash_attention_forward(out.data(), lse.data(), sc.data(), q.data(), kv.data(), whole, s.B, s.NH,
                          s.KVH, s.HS, drop, s.blocks);
  flash_attention_backward(dq.data(), dkv.data(), sc.data(), dy.data(), q.data(), kv.data(),
                           out.data(), lse.data(), whole, s.B, s.NH, s.KVH, s.HS, drop, s.blocks);
  // The buffer: rows [first - margin, first + count + margin) of each sample, clipped.
  const int lo = std::max(0, first - margin), hi = std::min(s.T, first + count + margin);
  const int R = hi - lo;
  std::vector<float> mine(static_cast<size_t>(s.B) * R * 2 * K);
  for (int b = 0; b < s.B; ++b)
    std::copy_n(kv.begin() + (static_cast<size_t>(b) * s.T + lo) * 2 * K, R * 2 * K,
                mine.begin() + static_cast<size_t>(b) * R * 2 * K);
  AttentionRows own = whole;
  own.kv_rows = R;
  own.kv_first = lo;
  std::vector<float> o2(out.size()), l2(lse.size()), dq2(q.size(), 0.0f), dkv2(mine.size(), 0.0f);
  flash_attention_forward(o2.data(), l2.data(), sc.data(), q.data(), mine.data(), own, s.B, s.NH,
                          s.KVH, s.HS, drop, s.blocks);
  flash_attention_backward(dq2.data(), dkv2.data(), sc.data(), dy.data(), q.data(), mine.data(),
                           out.data(), lse.data(), own, s.B, s.NH, s.KVH, s.HS, drop, s.blocks);
  EXPECT_EQ(o2, out);
  EXPECT_EQ(l2, lse);
  EXPECT_EQ(dq2, dq);
  std::vector<float> dkv_rows;
  for (int b = 0; b < s.B; ++b)
    dkv_rows.insert(dkv_rows.end(), dkv.begin() + (static_cast<size_t>(b) * s.T + lo) * 2 * K,
                    dkv.begin() + (static_cast<size_t>(b) * s.T + hi) * 2 * K);
  EXPECT_EQ(dkv2, dkv_rows);
}

TEST(FlashAttention, KeysFromABufferOfTheirOwnEqualTheWholeBuffer) {
  const FlashBlocks tiny{8, 8};
  std::vector<int> rank0;  // rank 0 of 2's rows: chunks 0 and 3 of 4
  for (int c : {0, 3})
    for (int t = c * 12; t < (c + 1) * 12; ++t) rank0.push_back(t);
  for (float p : {0.0f, 0.2f}) {
    compare_own_buffer({2, 48, 2, 2, 8, tiny, p}, rank0, 12, 12, 0);     // another rank's chunk
    compare_own_buffer({1, 48, 6, 2, 8, {5, 3}, p}, rank0, 36, 12, 0);   // GQA, its own late one
    compare_own_buffer({2, 48, 3, 1, 4, {16, 16}, p}, rank0, 20, 9, 3);  // rows around the keys
  }
}

// Rows out of order, or past the keys, are a caller's bug.
TEST(FlashAttention, RowsOutOfOrderAreInternalErrors) {
  const int B = 1, T = 4, NH = 2, KVH = 2, HS = 2;
  std::vector<float> qkv(static_cast<size_t>(B) * 2 * (NH + 2 * KVH) * HS),
      kv(static_cast<size_t>(B) * T * 2 * KVH * HS), out(static_cast<size_t>(B) * 2 * NH * HS),
      lse(static_cast<size_t>(B) * NH * 2), scratch(1 << 12);
  for (std::vector<int> pos :
       {std::vector<int>{2, 1}, std::vector<int>{1, 4}, std::vector<int>{1, 1}}) {
    const AttentionRows rows{2, T, pos.data()};
    EXPECT_THROW(flash_attention_forward(out.data(), lse.data(), scratch.data(), qkv.data(),
                                         kv.data(), rows, B, NH, KVH, HS, {}),
                 InternalError);
  }
  // A key range outside the keys, or empty.
  const std::vector<int> pos = {1, 2};
  for (const auto& [first, count] : {std::pair{-1, 2}, std::pair{3, 2}, std::pair{1, 0}}) {
    const AttentionRows rows{2, T, pos.data(), first, count};
    EXPECT_THROW(flash_attention_forward(out.data(), lse.data(), scratch.data(), qkv.data(),
                                         kv.data(), rows, B, NH, KVH, HS, {}),
                 InternalError);
  }
  // A key buffer that does not hold the range read.
  for (const auto& [rows_held, at] : {std::pair{2, 2}, std::pair{1, 1}, std::pair{2, -1}}) {
    const AttentionRows rows{2, T, pos.data(), 1, 2, rows_held, at};
    EXPECT_THROW(flash_attention_forward(out.data(), lse.data(), scratch.data(), qkv.data(),
                                         kv.data(), rows, B, NH, KVH, HS, {}),
                 InternalError);
  }
}

// A query-head count the key/value heads do not divide, or an empty block, is a caller's bug.
TEST(FlashAttention, BadHeadsOrBlocksAreInternalErrors) {
  const int B = 1, T = 3, NH = 4, KVH = 3, HS = 2;
  std::vector<float> qkv(static_cast<size_t>(B) * T * (NH + 2 * KVH) * HS), out(B * T * NH * HS),
      lse(B * NH * T), scratch(static_cast<size_t>(flash_attention_scratch_floats(T, HS)));
  EXPECT_THROW(flash_attention_forward(out.data(), lse.data(), scratch.data(), qkv.data(), B, T, NH,
                                       KVH, HS, {}),
               InternalError);
  EXPECT_THROW(flash_attention_backward(qkv.data(), scratch.data(), out.data(), qkv.data(),
                                        out.data(), lse.data(), B, T, NH, KVH, HS, {}),
               InternalError);
  EXPECT_THROW(flash_attention_forward(out.data(), lse.data(), scratch.data(), qkv.data(), B, T, 4,
                                       2, HS, {}, FlashBlocks{0, 4}),
               InternalError);
  EXPECT_THROW(flash_attention_forward(out.data(), lse.data(), scratch.data(), qkv.data(), B, T, 4,
                                       2, HS, {}, {}, DType::F16),
               InternalError);
}

}  // namespace flash_attention_test
}  // namespace tandem::nn
