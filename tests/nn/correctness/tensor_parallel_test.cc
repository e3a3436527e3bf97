// Tensor-parallel readiness: attention on a subset of heads, a column-parallel linear and a
// row-parallel linear (bias skipped, added after the sum) compute the matching part of the
// unsharded layer, given only other sizes and pointers.
#include <gtest/gtest.h>

#include <vector>

#include "nn/nn_test_util.h"
#include "tandem/nn/layers.h"

namespace tandem::nn {
namespace {

using namespace tandem::nn::testing;

// Megatron's c_attn column shard for heads [h0, h0 + nh): the q, k and v columns of those heads,
// kept in [q | k | v] order.
std::vector<float> qkv_head_shard(const std::vector<float>& qkv, int N, int NH, int HS, int h0,
                                  int nh) {
  const int C = NH * HS, c = nh * HS;
  std::vector<float> out(static_cast<size_t>(N) * 3 * c);
  for (int n = 0; n < N; ++n)
    for (int part = 0; part < 3; ++part)
      for (int j = 0; j < c; ++j)
        out[static_cast<size_t>(n * 3 * c + part * c + j)] =
            qkv[static_cast<size_t>(n * 3 * C + part * C + h0 * HS + j)];
  return out;
}

std::vector<float> columns(const std::vector<float>& m, int rows, int cols, int c0, int nc) {
  std::vector<float> out(static_cast<size_t>(rows) * nc);
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < nc; ++j)
      out[static_cast<size_t>(r * nc + j)] = m[static_cast<size_t>(r * cols + c0 + j)];
  return out;
}

TEST(TensorParallel, AttentionOnAHeadShardMatchesThoseHeadsOfTheFullLayer) {
  const int B = 3, T = 35, NH = 4, HS = 5, C = NH * HS, N = B * T;
  const std::vector<float> qkv = to_f32(uniform(static_cast<size_t>(N) * 3 * C, 21, -2.0, 2.0));
  const std::vector<float> dout = to_f32(uniform(static_cast<size_t>(N) * C, 22));
  AttentionDropout full_drop;
  full_drop.p = 0.2f;
  full_drop.key = 99;
  full_drop.sample_offset = 5;  // and a batch shard too
  std::vector<float> out(static_cast<size_t>(N) * C), att(static_cast<size_t>(B) * NH * T * T);
  std::vector<float> scratch(static_cast<size_t>(attention_scratch_floats(T)));
  std::vector<float> dqkv(qkv.size(), 0.0f);
  attention_forward(out.data(), att.data(), scratch.data(), qkv.data(), B, T, NH, NH, HS,
                    full_drop);
  attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T, NH, NH,
                     HS, full_drop);

  for (int h0 : {0, 2}) {  // tp = 2: two heads per rank
    const int nh = 2;
    AttentionDropout drop = full_drop;
    drop.head_offset = h0;
    drop.n_heads_total = NH;
    const std::vector<float> q = qkv_head_shard(qkv, N, NH, HS, h0, nh);
    const std::vector<float> g = columns(dout, N, C, h0 * HS, nh * HS);
    std::vector<float> o(static_cast<size_t>(N) * nh * HS), a(static_cast<size_t>(B) * nh * T * T);
    std::vector<float> dq(q.size(), 0.0f);
    attention_forward(o.data(), a.data(), scratch.data(), q.data(), B, T, nh, nh, HS, drop);
    attention_backward(dq.data(), scratch.data(), g.data(), q.data(), a.data(), B, T, nh, nh, HS,
                       drop);
    // The same per-head arithmetic with other strides: equal to rounding (a wrong mask or head
    // offset would be off by O(1)).
    const std::string rank = "heads from " + std::to_string(h0);
    EXPECT_TRUE(all_close(rank + " out", o, columns(out, N, C, h0 * HS, nh * HS), 1e-6));
    EXPECT_TRUE(all_close(rank + " dqkv", dq, qkv_head_shard(dqkv, N, NH, HS, h0, nh), 1e-6));
  }
}

TEST(TensorParallel, ColumnAndRowParallelLinearsComposeToTheFullLayer) {
  const int N = 7, IC = 12, OC = 10, tp = 2;
  const std::vector<float> x = to_f32(uniform(static_cast<size_t>(N) * IC, 23));
  const std::vector<float> w = to_f32(uniform(static_cast<size_t>(IC) * OC, 24));
  const std::vector<float> bias = to_f32(uniform(OC, 25));
  std::vector<float> full(static_cast<size_t>(N) * OC);
  linear_forward(full.data(), x.data(), w.data(), bias.data(), N, IC, OC);

  // Column-parallel: rank r owns output columns [r * OC/tp, (r+1) * OC/tp) and their bias.
  for (int r = 0; r < tp; ++r) {
    const int oc = OC / tp;
    const std::vector<float> wr = columns(w, IC, OC, r * oc, oc);
    const std::vector<float> br(bias.begin() + r * oc, bias.begin() + (r + 1) * oc);
    std::vector<float> out(static_cast<size_t>(N) * oc);
    linear_forward(out.data(), x.data(), wr.data(), br.data(), N, IC, oc);
    EXPECT_TRUE(all_close("column shard " + std::to_string(r), out,
                          columns(full, N, OC, r * oc, oc), 1e-6));
  }

  // Row-parallel: rank r owns input rows [r * IC/tp, ...) of the weight (a contiguous slice in
  // the (in, out) layout) and the matching input columns; no bias until after the sum.
  const int ic = IC / tp;
  std::vector<float> sum(static_cast<size_t>(N) * OC, 0.0f);
  for (int r = 0; r < tp; ++r) {
    const std::vector<float> xr = columns(x, N, IC, r * ic, ic);
    std::vector<float> part(static_cast<size_t>(N) * OC);
    linear_forward(part.data(), xr.data(), w.data() + static_cast<size_t>(r) * ic * OC, nullptr, N,
                   ic, OC);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];  // the AllReduce
  }
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o)
      sum[static_cast<size_t>(n * OC + o)] += bias[static_cast<size_t>(o)];
  EXPECT_TRUE(all_close("row-parallel sum + bias", sum, full, 1e-6));
}

}  // namespace
}  // namespace tandem::nn
