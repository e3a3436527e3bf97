// A block (GPT-2 or Llama) on one tensor-parallel rank: column-parallel projections, local heads
// (Llama: local query and key/value heads, rotated), and row-parallel projections finished by the
// caller's epilogue (the Megatron DSL program).
#include "tandem/parallel/tensor_parallel.h"

#include <cstring>

#include "tandem/core/bf16.h"
#include "tandem/core/error.h"
#include "tandem/core/formulas.h"
#include "tandem/core/parallel.h"
#include "tandem/core/rng.h"
#include "tandem/dsl/elementwise.h"
#include "tandem/nn/layers.h"

namespace tandem::parallel {
namespace {

void zero(float* p, int64_t n) { std::memset(p, 0, static_cast<size_t>(n) * sizeof(float)); }

// d(x) for out = dropout(x) as the DSL draws it: dout * (keep ? 1 / (1 - p) : 0), keyed by the
// element's flat index in the (N, H) tensor.
void dsl_dropout_backward(float* dx, const float* dout, int64_t n, double p, uint64_t seed) {
  const float scale = dsl::dropout_scale(p);
  for (int64_t i = 0; i < n; ++i)
    dx[i] = dropout_keep(seed, static_cast<uint64_t>(i), static_cast<float>(p)) ? dout[i] * scale
                                                                                : 0.0f;
}

// dst (n) = src (n) rounded to bf16 values (kept in f32), split over threads.
void round_to_bf16(const float* src, float* dst, int64_t n) {
  parallel_for(n, int64_t{1} << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dst[i] = fx::rt_bf16(src[i]);
  });
}

// In bf16, the epilogue's projection multiplies bf16 values. With a bf16 wire the program takes
// them as they are: x as saved (bf16 by nn::act_dtype; a slot bound to f32 rounded into the
// workspace's bf16 rows), w as a bf16 copy in the workspace's bf16 `other` (free between nn's
// kernels), the values nn's own linear layers multiply. With an f32 wire, x and w rounded to bf16
// values in f32 scratch (x, saved in bf16, widened; one saved in f32, rounded: the same values):
// the program's f32 matmul then computes what a bf16 GEMM with f32 accumulation does (a product
// of two bf16 values is exact in f32; only the order of the additions may differ), with f32
// bias, dropout and residual.
void epilogue_operands(EpilogueArgs& e, const Tensor& x_saved, nn::Workspace& ws, int tp,
                       DType wire) {
  const nn::MatmulPrecision mm = ws.matmul();
  if (mm.type != DType::BF16) {
    TANDEM_CHECK(wire == DType::F32, "a {} tensor-parallel wire with f32 matmuls",
                 dtype_name(wire));
    e.x = x_saved.data();
    return;
  }
  const int64_t k = e.K / tp;
  if (wire == DType::BF16) {
    TANDEM_CHECK(mm.other_size >= k * e.H && mm.rows_size >= e.N * k,
                 "the workspace's bf16 scratch is too small for the epilogue's operands");
    if (x_saved.dtype() == DType::BF16) {
      e.x = x_saved.data();
    } else {
      to_bf16_parallel(x_saved.data_as<float>(), mm.rows, e.N * k);
      e.x = mm.rows;
    }
    to_bf16_parallel(static_cast<const float*>(e.w), mm.other, k * e.H);
    e.w = mm.other;
    e.operands = DType::BF16;
    return;
  }
  float* x = ws.wide();            // (N, K/tp): free in a forward
  float* w = ws.rounded_weight();  // (K/tp, H), at most 4C x C
  if (x_saved.dtype() == DType::BF16)
    to_f32_parallel(x_saved.data_as<bf16>(), x, e.N * k);
  else
    round_to_bf16(x_saved.data_as<float>(), x, e.N * k);
  round_to_bf16(static_cast<const float*>(e.w), w, k * e.H);
  e.x = x;
  e.w = w;
}

// The column-parallel input gradient summed over the tp ranks, in place (ShardBlock).
void all_reduce(const ShardBlock& sb, float* buf, int64_t n) {
  if (sb.tp == 1) return;
  TANDEM_CHECK(sb.sum_over_tp != nullptr, "the tp group's gradient sum is missing");
  sb.sum_over_tp(buf, n);
}

// The block's normalisation (GPT-2's LayerNorm, Llama's RMSNorm) of x (N, C) into out.
template <typename Out>
void norm_forward(const nn::GPTConfig& c, Out* out, const nn::BlockActivations& a,
                  nn::BlockAct mean, nn::BlockAct rstd, const float* x, const float* w,
                  const float* b, int N) {
  if (c.llama())
    nn::rmsnorm_forward(out, a.ptr(rstd), x, w, N, c.d_model, c.norm_eps);
  else
    nn::layernorm_forward(out, a.ptr(mean), a.ptr(rstd), x, w, b, N, c.d_model);
}

void norm_backward(const nn::GPTConfig& c, float* dx, float* dw, float* db, const float* dout,
                   const float* x, const float* w, const nn::BlockActivations& a, nn::BlockAct mean,
                   nn::BlockAct rstd, int N) {
  if (c.llama())
    nn::rmsnorm_backward(dx, dw, dout, x, w, a.ptr(rstd), N, c.d_model);
  else
    nn::layernorm_backward(dx, dw, db, dout, x, w, a.ptr(mean), a.ptr(rstd), N, c.d_model);
}

// A rank's widths: its query heads, key/value heads, [q | k | v] columns, MLP hidden columns
// and c_fc output columns (Llama's [gate | up]).
struct LocalWidths {
  int heads, kv_heads, qkv, mlp, fc;
};
LocalWidths local_widths(const nn::GPTConfig& c, int tp) {
  return {c.n_heads / tp, c.n_kv_heads() / tp, static_cast<int>(c.qkv_width() / tp),
          static_cast<int>(c.mlp_width() / tp), static_cast<int>(c.fc_width() / tp)};
}

// q's NH and k's KVH heads of qkv (B, T, stride) rotated (or, backward, their gradients rotated
// back) in place at their positions: 0 .. T - 1, or with context parallelism each of the rank's
// two chunks at its place in the sequence.
void rotate(const ShardBlock& sb, bool forward, float* qkv, const nn::RopeTable& rope, int B, int T,
            int NH, int KVH, int HS, int64_t stride, int64_t k_offset) {
  const auto run = [&](float* x, const nn::RopeTable& table, int b, int rows, int heads, int pos0) {
    if (forward)
      nn::rope_forward(x, table, b, rows, heads, HS, stride, pos0);
    else
      nn::rope_backward(x, table, b, rows, heads, HS, stride, pos0);
  };
  if (sb.context == nullptr) {
    run(qkv, rope, B, T, NH, 0);
    run(qkv + k_offset, rope, B, T, KVH, 0);
    return;
  }
  const ContextSplit& s = sb.context->split();
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < 2; ++c) {
      float* rows = qkv + (static_cast<int64_t>(b) * T + c * s.chunk()) * stride;
      run(rows, *sb.context_rope, 1, s.chunk(), NH, s.chunk_start(c));
      run(rows + k_offset, *sb.context_rope, 1, s.chunk(), KVH, s.chunk_start(c));
    }
}

}  // namespace

dsl::workloads::Bias epilogue_bias(const nn::GPTConfig& config) {
  return config.llama() ? dsl::workloads::Bias::Without : dsl::workloads::Bias::With;
}

uint64_t epilogue_seed(const nn::StepRng& rng, int layer, nn::DropoutSite site) {
  const uint64_t key = nn::dropout_key(rng.seed, rng.step, layer, site);
  constexpr uint32_t kEpilogueTag = 0x4d454741u;  // "MEGA"
  const auto r =
      philox4x32(key, {static_cast<uint32_t>(rng.sample_offset),
                       static_cast<uint32_t>(static_cast<uint64_t>(rng.sample_offset) >> 32),
                       kEpilogueTag, 0u});
  return (static_cast<uint64_t>(r[0]) | (static_cast<uint64_t>(r[1]) << 32)) &
         ((uint64_t{1} << 53) - 1);
}

std::vector<Shape> shard_block_shapes(const nn::GPTConfig& c, int tp, int B, int T) {
  const int64_t C = c.d_model, lc = C / tp;
  std::vector<Shape> shapes;
  for (int i = 0; i < nn::kNumActs<nn::BlockAct>; ++i) {
    const auto k = static_cast<nn::BlockAct>(i);
    Shape s = nn::act_shape(c, k, B, T);
    switch (k) {
      case nn::BlockAct::Qkv:  // a rank's [q | k | v] columns
        s = Shape{B, T, c.qkv_width() / tp};
        break;
      case nn::BlockAct::AttSaved:  // the rank's heads' lse, or their softmax
        s = c.attention == nn::AttentionKernel::Unfused ? Shape{B, c.n_heads / tp, T, T}
                                                        : Shape{B, c.n_heads / tp, T};
        break;
      case nn::BlockAct::AttY:
        s = Shape{B, T, lc};
        break;
      case nn::BlockAct::FcOut:
        s = Shape{B, T, c.fc_width() / tp};
        break;
      case nn::BlockAct::GeluOut:
        s = Shape{B, T, c.mlp_width() / tp};
        break;
      default:
        break;
    }
    shapes.push_back(s);
  }
  return shapes;
}

nn::BlockActivations allocate_shard_block_activations(const nn::GPTConfig& c, int tp, int B, int T,
                                                      Allocator& alloc) {
  const std::vector<Shape> shapes = shard_block_shapes(c, tp, B, T);
  nn::BlockActivations a;
  for (int i = 0; i < nn::kNumActs<nn::BlockAct>; ++i)
    a[static_cast<nn::BlockAct>(i)] = Tensor::empty(nn::act_dtype(c, static_cast<nn::BlockAct>(i)),
                                                    shapes[static_cast<size_t>(i)], alloc);
  return a;
}

void shard_half_forward(const ShardBlock& sb, int layer, nn::BlockHalf half,
                        const nn::BlockParams& w, const nn::BlockActivations& a, const float* x,
                        nn::Workspace& ws, int B, int T, const nn::StepRng& rng,
                        const Epilogue& epilogue) {
  const nn::GPTConfig& c = sb.config;
  const int C = c.d_model, lc = C / sb.tp, HS = c.head_size(), N = B * T;
  const LocalWidths lw = local_widths(c, sb.tp);
  const int NH = lw.heads;
  using K = nn::BlockAct;
  const nn::MatmulPrecision mm = ws.matmul();
  EpilogueArgs e;
  Tensor x_saved;  // the projection's input, as saved
  e.N = N;
  e.H = C;
  e.layer = layer;
  if (half == nn::BlockHalf::Attention) {
    // resid_1 = x + dropout(attn.c_proj(attention(attn.c_attn(ln_1(x)))))
    nn::AttentionDropout attn_drop = nn::attention_dropout(c, rng, layer);
    attn_drop.head_offset = sb.tp_rank * NH;  // this rank's heads among all of them
    a.visit(K::Ln1Out, [&](auto* ln1) {
      norm_forward(c, ln1, a, K::Ln1Mean, K::Ln1Rstd, x, w.ln_1_w, w.ln_1_b, N);  // (B, T, C)
      nn::linear_forward(a.ptr(K::Qkv), ln1, w.c_attn_w, w.c_attn_b, N, C, lw.qkv,
                         mm);  // (B, T, qkv/tp)
    });
    if (c.llama())  // this rank's query and key heads rotated in place
      rotate(sb, true, a.ptr(K::Qkv), ws.rope(), B, T, NH, lw.kv_heads, HS, lw.qkv, lc);
    a.visit(K::AttY, [&](auto* y) {
      if (sb.context != nullptr)  // this rank's queries against the group's keys
        sb.context->forward(nn::staged_output(y, ws.btc(1)), a.ptr(K::AttSaved), a.ptr(K::Qkv),
                            attn_drop);
      else
        nn::attention_core_forward(c, nn::staged_output(y, ws.btc(1)), ws.attention(), a, B, T, NH,
                                   lw.kv_heads, HS, attn_drop);  // (B, T, c)
      nn::store_staged(y, ws.btc(1), static_cast<int64_t>(N) * lc);
    });
    x_saved = a[K::AttY];
    e.w = w.attn_proj_w;  // (c, C)
    e.bias = w.attn_proj_b;
    e.residual = x;
    e.out = a.ptr(K::Resid1);  // (B, T, C)
    e.K = C;
    e.seed = epilogue_seed(rng, layer, nn::DropoutSite::AttnResidual);
    e.mlp = false;
  } else {
    // out = resid_1 + dropout(mlp.c_proj(gelu(mlp.c_fc(ln_2(resid_1)))))
    a.visit(K::Ln2Out, [&](auto* ln2) {
      norm_forward(c, ln2, a, K::Ln2Mean, K::Ln2Rstd, a.ptr(K::Resid1), w.ln_2_w, w.ln_2_b,
                   N);  // (B, T, C)
      nn::linear_forward(a.ptr(K::FcOut), ln2, w.c_fc_w, w.c_fc_b, N, C, lw.fc,
                         mm);  // (B, T, fc/tp)
    });
    a.visit(K::GeluOut, [&](auto* h) {
      if (c.llama())
        nn::swiglu_rows_forward(h, a.ptr(K::FcOut), N, lw.mlp);  // (B, T, F/tp)
      else
        nn::gelu_forward(h, a.ptr(K::FcOut), static_cast<int64_t>(N) * lw.mlp);  // (B, T, 4c)
    });
    x_saved = a[K::GeluOut];
    e.w = w.mlp_proj_w;  // (4c, C)
    e.bias = w.mlp_proj_b;
    e.residual = a.ptr(K::Resid1);
    e.out = a.ptr(K::Out);  // (B, T, C)
    e.K = c.mlp_width();
    e.seed = epilogue_seed(rng, layer, nn::DropoutSite::MlpResidual);
    e.mlp = true;
  }
  epilogue_operands(e, x_saved, ws, sb.tp, sb.wire);
  epilogue(e);
}

void shard_half_backward(const ShardBlock& sb, int layer, nn::BlockHalf half,
                         const nn::BlockParams& w, const nn::BlockParams& dw,
                         const nn::BlockActivations& a, const float* x, float* dres,
                         nn::Workspace& ws, int B, int T, const nn::StepRng& rng) {
  const nn::GPTConfig& c = sb.config;
  const int C = c.d_model, lc = C / sb.tp, HS = c.head_size(), N = B * T;
  const LocalWidths lw = local_widths(c, sb.tp);
  const int NH = lw.heads;
  const int64_t n = static_cast<int64_t>(N) * C;
  float* dc = ws.btc(1);  // (B, T, C) d(ln_*.out) (a partial sum until AllReduced)
  const bool drop = rng.training && c.dropout > 0.0f;
  const nn::MatmulPrecision mm = ws.matmul();
  using K = nn::BlockAct;

  // What reaches the projection: the epilogue's dropout backward of dres (the residual's
  // identity path keeps dres itself, and the LayerNorm's input gradient is accumulated onto it).
  auto projection_grad = [&](nn::DropoutSite site) -> const float* {
    if (!drop) return dres;
    float* d = ws.btc(0);
    dsl_dropout_backward(d, dres, n, c.dropout, epilogue_seed(rng, layer, site));
    return d;
  };

  if (half == nn::BlockHalf::Mlp) {
    // GPT-2: (B, T, 4c) d(gelu.out), then in place d(c_fc.out). Llama: dh (B, T, F/tp)
    // d(swiglu.out), then dfc (B, T, 2F/tp) beside it.
    const int64_t nh = static_cast<int64_t>(N) * lw.mlp;
    float* dh = ws.wide();
    float* dfc = c.llama() ? dh + nh : dh;
    const float* dmlp = projection_grad(nn::DropoutSite::MlpResidual);  // (B, T, C)
    zero(dh, nh);
    a.visit(K::GeluOut, [&](const auto* h) {
      nn::linear_backward(dh, dw.mlp_proj_w, dw.mlp_proj_b, dmlp, h, w.mlp_proj_w, N, lw.mlp, C,
                          mm);
    });
    if (c.llama()) {
      zero(dfc, static_cast<int64_t>(N) * lw.fc);
      nn::swiglu_rows_backward(dfc, dh, a.ptr(K::FcOut), N, lw.mlp);
    } else {
      nn::gelu_backward_inplace(dfc, a.ptr(K::FcOut), nh);
    }
    zero(dc, n);
    a.visit(K::Ln2Out, [&](const auto* ln2) {
      nn::linear_backward(dc, dw.c_fc_w, dw.c_fc_b, dfc, ln2, w.c_fc_w, N, C, lw.fc, mm);
    });
    all_reduce(sb, dc, n);  // the column-parallel input gradient: summed over the heads' ranks
    norm_backward(c, dres, dw.ln_2_w, dw.ln_2_b, dc, a.ptr(K::Resid1), w.ln_2_w, a, K::Ln2Mean,
                  K::Ln2Rstd, N);  // dres: d(resid_1)
    return;
  }
  nn::AttentionDropout attn_drop = nn::attention_dropout(c, rng, layer);
  attn_drop.head_offset = sb.tp_rank * NH;
  float* dy = ws.btc(1);    // (B, T, c) d(attn.y), before dc is needed again
  float* dqkv = ws.wide();  // (B, T, qkv/tp)
  const float* dattn = projection_grad(nn::DropoutSite::AttnResidual);  // (B, T, C)
  zero(dy, static_cast<int64_t>(N) * lc);
  a.visit(K::AttY, [&](const auto* y) {
    nn::linear_backward(dy, dw.attn_proj_w, dw.attn_proj_b, dattn, y, w.attn_proj_w, N, lc, C, mm);
  });
  zero(dqkv, static_cast<int64_t>(N) * lw.qkv);
  if (sb.context != nullptr)
    sb.context->backward(dqkv, dy, a.ptr(K::Qkv), a.ptr(K::AttY), a.ptr(K::AttSaved), attn_drop);
  else
    nn::attention_core_backward(c, dqkv, ws.attention(), dy, a, B, T, NH, lw.kv_heads, HS,
                                attn_drop);
  if (c.llama())  // back through the rotation of this rank's query and key heads
    rotate(sb, false, dqkv, ws.rope(), B, T, NH, lw.kv_heads, HS, lw.qkv, lc);
  zero(dc, n);
  a.visit(K::Ln1Out, [&](const auto* ln1) {
    nn::linear_backward(dc, dw.c_attn_w, dw.c_attn_b, dqkv, ln1, w.c_attn_w, N, C, lw.qkv, mm);
  });
  all_reduce(sb, dc, n);
  norm_backward(c, dres, dw.ln_1_w, dw.ln_1_b, dc, x, w.ln_1_w, a, K::Ln1Mean, K::Ln1Rstd,
                N);  // dres: d(x)
}

void shard_block_forward(const ShardBlock& sb, int layer, const nn::BlockParams& w,
                         const nn::BlockActivations& a, const float* x, nn::Workspace& ws, int B,
                         int T, const nn::StepRng& rng, const Epilogue& attn_epilogue,
                         const Epilogue& mlp_epilogue) {
  shard_half_forward(sb, layer, nn::BlockHalf::Attention, w, a, x, ws, B, T, rng, attn_epilogue);
  shard_half_forward(sb, layer, nn::BlockHalf::Mlp, w, a, a.ptr(nn::BlockAct::Resid1), ws, B, T,
                     rng, mlp_epilogue);
}

void shard_block_backward(const ShardBlock& sb, int layer, const nn::BlockParams& w,
                          const nn::BlockParams& dw, const nn::BlockActivations& a, const float* x,
                          float* dres, nn::Workspace& ws, int B, int T, const nn::StepRng& rng) {
  shard_half_backward(sb, layer, nn::BlockHalf::Mlp, w, dw, a, a.ptr(nn::BlockAct::Resid1), dres,
                      ws, B, T, rng);
  shard_half_backward(sb, layer, nn::BlockHalf::Attention, w, dw, a, x, dres, ws, B, T, rng);
}

}  // namespace tandem::parallel
