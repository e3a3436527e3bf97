// The GPT model's saved-activation buffers, workspace, stages and whole forward/backward passes.
#include "tandem/nn/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "tandem/core/error.h"
#include "tandem/core/parallel.h"
#include "tandem/core/rng.h"

namespace tandem::nn {
namespace {

// Split over threads (core/parallel.h): the gradient buffers a backward block clears are several
// MiB, and one thread's memset leaves the other cores idle.
void zero(float* p, int64_t n) {
  parallel_for(n, int64_t{1} << 16, [&](int64_t b, int64_t e) {
    std::memset(p + b, 0, static_cast<size_t>(e - b) * sizeof(float));
  });
}

template <typename Kind>
Buffers<Kind> allocate(const GPTConfig& c, int B, int T, Allocator& alloc) {
  Buffers<Kind> a;
  for (int i = 0; i < kNumActs<Kind>; ++i) {
    const Kind k = static_cast<Kind>(i);
    a[k] = Tensor::empty(act_dtype(c, k), act_shape(c, k, B, T), alloc);
  }
  return a;
}

template <typename Kind>
void append_specs(std::vector<ActivationSpec>& out, const GPTConfig& c, const std::string& prefix,
                  int B, int T) {
  for (int i = 0; i < kNumActs<Kind>; ++i) {
    const Kind k = static_cast<Kind>(i);
    out.push_back({prefix + std::string(act_suffix(c, k)), act_shape(c, k, B, T), act_dtype(c, k)});
  }
}

template <typename Kind>
void append_named(std::vector<std::pair<std::string, Tensor>>& out, const GPTConfig& c,
                  const Buffers<Kind>& a, const std::string& prefix) {
  for (int i = 0; i < kNumActs<Kind>; ++i) {
    const Kind k = static_cast<Kind>(i);
    out.emplace_back(prefix + std::string(act_suffix(c, k)), a[k]);
  }
}

std::string block_prefix(int layer) { return "h." + std::to_string(layer) + "."; }

// The block's normalisation, LayerNorm (GPT-2) or RMSNorm (Llama: no mean, no bias), into out
// (N, C) of f32 or bf16, its statistics saved in a's mean and rstd slots.
template <typename Kind, typename Out>
void norm_forward(const GPTConfig& c, Out* out, const Buffers<Kind>& a, Kind mean, Kind rstd,
                  const float* x, const float* w, const float* b, int N) {
  if (c.llama())
    rmsnorm_forward(out, a.ptr(rstd), x, w, N, c.d_model, c.norm_eps);
  else
    layernorm_forward(out, a.ptr(mean), a.ptr(rstd), x, w, b, N, c.d_model);
}

// dx (N, C), dw, db += the normalisation's backward for dout (N, C).
template <typename Kind>
void norm_backward(const GPTConfig& c, float* dx, float* dw, float* db, const float* dout,
                   const float* x, const float* w, const Buffers<Kind>& a, Kind mean, Kind rstd,
                   int N) {
  if (c.llama())
    rmsnorm_backward(dx, dw, dout, x, w, a.ptr(rstd), N, c.d_model);
  else
    layernorm_backward(dx, dw, db, dout, x, w, a.ptr(mean), a.ptr(rstd), N, c.d_model);
}

// Every buffer defined, of its act_dtype (or f32, see Buffers) and shaped for (B, T): a mismatch
// is the caller binding the wrong buffer.
template <typename Kind>
void check_buffer(const GPTConfig& c, const Buffers<Kind>& a, Kind k, const std::string& prefix,
                  int B, int T) {
  const Shape want = act_shape(c, k, B, T);
  const DType type = act_dtype(c, k);
  if ((a[k].dtype() != type && a[k].dtype() != DType::F32) || a[k].numel() != want.numel() ||
      (a[k].data() == nullptr && want.numel() > 0))
    user_error("activation buffer {}{} is {}{}; the stage needs {}{}", prefix, act_suffix(c, k),
               a[k].str(), a[k].data() == nullptr ? " (unbound)" : "", dtype_name(type),
               want.str());
}

template <typename Kind>
void check_buffers(const GPTConfig& c, const Buffers<Kind>& a, const std::string& prefix, int B,
                   int T) {
  for (int i = 0; i < kNumActs<Kind>; ++i) check_buffer(c, a, static_cast<Kind>(i), prefix, B, T);
}

// The buffers one half of a block reads or writes: its saves, its output and the MLP's input.
void check_half(const GPTConfig& c, const BlockActivations& a, BlockHalf h, int layer, int B,
                int T) {
  const std::string prefix = block_prefix(layer);
  for (BlockAct k : half_saves(h)) check_buffer(c, a, k, prefix, B, T);
  check_buffer(c, a, half_output(h), prefix, B, T);
  if (h == BlockHalf::Mlp) check_buffer(c, a, BlockAct::Resid1, prefix, B, T);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Names and shapes.

std::string_view act_suffix(EmbeddingAct) { return "out"; }

std::string_view act_suffix(BlockAct k) {
  switch (k) {
    case BlockAct::Ln1Out:
      return "ln_1.out";
    case BlockAct::Ln1Mean:
      return "ln_1.mean";
    case BlockAct::Ln1Rstd:
      return "ln_1.rstd";
    case BlockAct::Qkv:
      return "attn.c_attn.out";
    case BlockAct::AttSaved:
      return "attn.lse";
    case BlockAct::AttY:
      return "attn.y";
    case BlockAct::Resid1:
      return "resid_1";
    case BlockAct::Ln2Out:
      return "ln_2.out";
    case BlockAct::Ln2Mean:
      return "ln_2.mean";
    case BlockAct::Ln2Rstd:
      return "ln_2.rstd";
    case BlockAct::FcOut:
      return "mlp.c_fc.out";
    case BlockAct::GeluOut:
      return "mlp.gelu.out";
    case BlockAct::Out:
      return "out";
    case BlockAct::kCount:
      break;
  }
  internal_error("bad BlockAct");
}

std::string_view act_suffix(const GPTConfig&, EmbeddingAct k) { return act_suffix(k); }
std::string_view act_suffix(const GPTConfig& c, BlockAct k) {
  if (k == BlockAct::AttSaved && c.attention == AttentionKernel::Unfused) return "attn.softmax";
  return act_suffix(k);
}
std::string_view act_suffix(const GPTConfig&, FinalAct k) { return act_suffix(k); }

std::string_view act_suffix(FinalAct k) {
  switch (k) {
    case FinalAct::LnfOut:
      return "ln_f.out";
    case FinalAct::LnfMean:
      return "ln_f.mean";
    case FinalAct::LnfRstd:
      return "ln_f.rstd";
    case FinalAct::Losses:
      return "lm_head.losses";
    case FinalAct::kCount:
      break;
  }
  internal_error("bad FinalAct");
}

Shape act_shape(const GPTConfig& c, EmbeddingAct, int B, int T) { return {B, T, c.d_model}; }

Shape act_shape(const GPTConfig& c, BlockAct k, int B, int T) {
  const int64_t C = c.d_model;
  switch (k) {
    case BlockAct::Ln1Mean:
    case BlockAct::Ln2Mean:
      if (c.llama()) return {0};  // RMSNorm saves no mean
      return {B, T};
    case BlockAct::Ln1Rstd:
    case BlockAct::Ln2Rstd:
      return {B, T};
    case BlockAct::Qkv:
      return {B, T, c.qkv_width()};
    case BlockAct::AttSaved:
      if (c.attention == AttentionKernel::Unfused) return {B, c.n_heads, T, T};
      return {B, c.n_heads, T};
    case BlockAct::FcOut:
      return {B, T, c.fc_width()};
    case BlockAct::GeluOut:
      return {B, T, c.mlp_width()};
    case BlockAct::Ln1Out:
    case BlockAct::AttY:
    case BlockAct::Resid1:
    case BlockAct::Ln2Out:
    case BlockAct::Out:
      return {B, T, C};
    case BlockAct::kCount:
      break;
  }
  internal_error("bad BlockAct");
}

Shape act_shape(const GPTConfig& c, FinalAct k, int B, int T) {
  switch (k) {
    case FinalAct::LnfOut:
      return {B, T, c.d_model};
    case FinalAct::LnfMean:
      if (c.llama()) return {0};
      return {B, T};
    case FinalAct::LnfRstd:
    case FinalAct::Losses:
      return {B, T};
    case FinalAct::kCount:
      break;
  }
  internal_error("bad FinalAct");
}

DType act_dtype(const GPTConfig&, EmbeddingAct) { return DType::F32; }

DType act_dtype(const GPTConfig& c, BlockAct k) {
  if (c.matmul != DType::BF16) return DType::F32;
  switch (k) {
    case BlockAct::AttY:  // the fused attention's backward reads it (gpt.h)
      return c.attention == AttentionKernel::Unfused ? DType::BF16 : DType::F32;
    case BlockAct::Ln1Out:
    case BlockAct::Ln2Out:
    case BlockAct::GeluOut:
      return DType::BF16;
    default:
      return DType::F32;
  }
}

DType act_dtype(const GPTConfig& c, FinalAct k) {
  return c.matmul == DType::BF16 && k == FinalAct::LnfOut ? DType::BF16 : DType::F32;
}

std::vector<ActivationSpec> block_activation_specs(const GPTConfig& c, int layer, int B, int T) {
  std::vector<ActivationSpec> out;
  append_specs<BlockAct>(out, c, block_prefix(layer), B, T);
  return out;
}

std::vector<ActivationSpec> gpt_activation_specs(const GPTConfig& c, int B, int T) {
  std::vector<ActivationSpec> out;
  append_specs<EmbeddingAct>(out, c, "embed.", B, T);
  for (int l = 0; l < c.n_layers; ++l) append_specs<BlockAct>(out, c, block_prefix(l), B, T);
  append_specs<FinalAct>(out, c, "", B, T);
  return out;
}

EmbeddingActivations allocate_embedding_activations(const GPTConfig& c, int B, int T,
                                                    Allocator& alloc) {
  return allocate<EmbeddingAct>(c, B, T, alloc);
}
BlockActivations allocate_block_activations(const GPTConfig& c, int B, int T, Allocator& alloc) {
  return allocate<BlockAct>(c, B, T, alloc);
}
FinalActivations allocate_final_activations(const GPTConfig& c, int B, int T, Allocator& alloc) {
  return allocate<FinalAct>(c, B, T, alloc);
}

GPTActivations::GPTActivations(const GPTConfig& config, int B, int T, Allocator& alloc)
    : config_(config), B_(B), T_(T) {
  config.validate();
  if (B < 1 || T < 1 || T > config.max_positions)
    user_error(
        "GPT activations for batch {} x sequence {}: need batch >= 1 and 1 <= sequence <= "
        "max_positions ({})",
        B, T, config.max_positions);
  embedding = allocate<EmbeddingAct>(config, B, T, alloc);
  blocks.reserve(static_cast<size_t>(config.n_layers));
  for (int l = 0; l < config.n_layers; ++l)
    blocks.push_back(allocate<BlockAct>(config, B, T, alloc));
  head = allocate<FinalAct>(config, B, T, alloc);
}

const float* GPTActivations::block_input(int layer) const {
  TANDEM_CHECK(layer >= 0 && layer <= config_.n_layers, "block_input({}) of {} layers", layer,
               config_.n_layers);
  return layer == 0 ? embedding.ptr(EmbeddingAct::Out)
                    : blocks[static_cast<size_t>(layer - 1)].ptr(BlockAct::Out);
}

std::vector<std::pair<std::string, Tensor>> GPTActivations::named() const {
  std::vector<std::pair<std::string, Tensor>> out;
  append_named(out, config_, embedding, "embed.");
  for (int l = 0; l < config_.n_layers; ++l)
    append_named(out, config_, blocks[static_cast<size_t>(l)], block_prefix(l));
  append_named(out, config_, head, "");
  return out;
}

// ---------------------------------------------------------------------------------------------
// Workspace: btc0, btc1, wide, attention, logits, dresidual; in bf16 also bf16_rows,
// bf16_other and rounded_weight.

namespace {

constexpr size_t kBf16Rows = 6, kBf16Other = 7, kRoundedWeight = 8;

// Floats that hold n bf16 values.
int64_t floats_for_bf16(int64_t n) { return (n + 1) / 2; }

}  // namespace

std::vector<ActivationSpec> Workspace::specs(const GPTConfig& c, int B, int T) {
  const int64_t C = c.d_model, V = c.vocab_size, N = static_cast<int64_t>(B) * T;
  const int64_t chunk = lm_head_chunk_rows(static_cast<int>(N), c.vocab_size);
  // wide: d(qkv), or the MLP's gradients: GPT-2's d(gelu.out) in place of d(c_fc.out) (4C);
  // Llama's d(swiglu.out) (F) beside d(c_fc.out) (2F).
  const int64_t wide = c.llama() ? std::max(c.qkv_width(), 3 * c.mlp_width()) : 4 * C;
  // The widest matmul operand row: c_fc's output or c_proj's input.
  const int64_t widest = std::max({c.qkv_width(), c.fc_width(), C});
  std::vector<ActivationSpec> s = {
      {"ws.btc0", {B, T, C}},
      {"ws.btc1", {B, T, C}},
      {"ws.wide", {B, T, wide}},
      {"ws.attention",
       {c.attention == AttentionKernel::Fused ? flash_attention_scratch_floats(T, c.head_size())
                                              : attention_scratch_floats(T)}},
      {"ws.logits", {chunk, V}},
      {"ws.dresidual", {B, T, C}}};
  if (c.matmul == DType::BF16) {
    // rows: an (N, .) operand, at most N x widest in a block; a chunk's input and dlogits,
    // chunk x (C + V), in the head.
    // other: a weight (C x widest, V x C) or a weight gradient's input (N x widest).
    s.push_back({"ws.bf16_rows", {floats_for_bf16(std::max(N * widest, chunk * (C + V)))}});
    s.push_back({"ws.bf16_other", {floats_for_bf16(std::max({C * widest, V * C, N * widest}))}});
    s.push_back({"ws.rounded_weight", {C * std::max(widest, C)}});
  }
  return s;
}

Workspace::Workspace(const GPTConfig& config, int B, int T, Allocator& alloc)
    : config_(config), B_(B), T_(T) {
  config.validate();
  if (B < 1 || T < 1)
    user_error("GPT workspace for batch {} x sequence {}: both must be >= 1", B, T);
  for (const ActivationSpec& s : specs(config, B, T))
    bufs_.push_back(Tensor::empty(DType::F32, s.shape, alloc));
  if (config.llama())
    rope_ =
        rope_table(rope_inv_freq(config.head_size(), config.rope_theta, config.rope_scaling), T);
}

void Workspace::check_fits(const GPTConfig& c, int B, int T) const {
  if (c.arch != config_.arch || c.qkv_width() != config_.qkv_width() ||
      c.mlp_width() != config_.mlp_width() || c.rope_theta != config_.rope_theta ||
      !(c.rope_scaling == config_.rope_scaling))
    user_error("GPT workspace was made for another block ({}, {} key/value heads, MLP {})",
               arch_name(config_.arch), config_.n_kv_heads(), config_.mlp_width());
  if (c.d_model != config_.d_model || c.vocab_size != config_.vocab_size)
    user_error("GPT workspace was made for d_model {} and vocabulary {}, not {} and {}",
               config_.d_model, config_.vocab_size, c.d_model, c.vocab_size);
  if (c.matmul != config_.matmul)
    user_error("GPT workspace was made for {} matmuls, not {}", dtype_name(config_.matmul),
               dtype_name(c.matmul));
  if (c.attention != config_.attention)
    user_error("GPT workspace was made for the {} attention kernel, not the {} one",
               attention_kernel_name(config_.attention), attention_kernel_name(c.attention));
  if (B > B_ || T > T_)
    user_error("GPT workspace holds batches up to {} x {}; this one is {} x {}", B_, T_, B, T);
}

float* Workspace::btc(int i) const { return bufs_[static_cast<size_t>(i)].data_as<float>(); }
float* Workspace::wide() const { return bufs_[2].data_as<float>(); }
float* Workspace::attention() const { return bufs_[3].data_as<float>(); }
float* Workspace::logits() const { return bufs_[4].data_as<float>(); }
float* Workspace::dresidual() const { return bufs_[5].data_as<float>(); }

MatmulPrecision Workspace::matmul() const {
  if (config_.matmul != DType::BF16) return {};
  const Tensor& rows = bufs_[kBf16Rows];
  const Tensor& other = bufs_[kBf16Other];
  return {DType::BF16, static_cast<bf16*>(rows.data()), 2 * rows.numel(),
          static_cast<bf16*>(other.data()), 2 * other.numel()};
}

float* Workspace::rounded_weight() const {
  return config_.matmul == DType::BF16 ? bufs_[kRoundedWeight].data_as<float>() : nullptr;
}

// ---------------------------------------------------------------------------------------------
// Dropout keys.

uint64_t dropout_key(uint64_t seed, uint64_t step, int layer, DropoutSite site) {
  // A tag in the last counter word keeps these keys apart from any other use of the seed.
  constexpr uint32_t kDropoutTag = 0x44524f50u;  // "DROP"
  const auto r = philox4x32(
      seed, {static_cast<uint32_t>(step), static_cast<uint32_t>(step >> 32),
             static_cast<uint32_t>(layer + 1), kDropoutTag ^ static_cast<uint32_t>(site)});
  return static_cast<uint64_t>(r[0]) | (static_cast<uint64_t>(r[1]) << 32);
}

Dropout site_dropout(const GPTConfig& c, const StepRng& rng, int layer, DropoutSite site, int T) {
  if (!rng.training || c.dropout <= 0.0f) return {};
  return {c.dropout, dropout_key(rng.seed, rng.step, layer, site),
          rng.sample_offset * static_cast<int64_t>(T) * c.d_model};
}

AttentionDropout attention_dropout(const GPTConfig& c, const StepRng& rng, int layer) {
  if (!rng.training || c.dropout <= 0.0f) return {};
  AttentionDropout d;
  d.p = c.dropout;
  d.key = dropout_key(rng.seed, rng.step, layer, DropoutSite::Attention);
  d.sample_offset = rng.sample_offset;
  d.head_offset = 0;
  d.n_heads_total = c.n_heads;
  return d;
}

// ---------------------------------------------------------------------------------------------
// Stages.

void embedding_forward(const GPTConfig& c, const EmbeddingParams& w, const EmbeddingActivations& a,
                       const int32_t* tokens, int B, int T, const StepRng& rng) {
  check_buffers(c, a, "embed.", B, T);
  float* out = a.ptr(EmbeddingAct::Out);  // (B, T, C)
  encoder_forward(out, tokens, w.wte, w.wpe, B, T, c.d_model);
  const Dropout drop = site_dropout(c, rng, -1, DropoutSite::Embedding, T);
  if (drop.active()) dropout_forward(out, out, static_cast<int64_t>(B) * T * c.d_model, drop);
}

void embedding_backward(const GPTConfig& c, const EmbeddingParams& dw, const float* dout,
                        const int32_t* tokens, Workspace& ws, int B, int T, const StepRng& rng) {
  ws.check_fits(c, B, T);
  const int64_t n = static_cast<int64_t>(B) * T * c.d_model;
  const Dropout drop = site_dropout(c, rng, -1, DropoutSite::Embedding, T);
  const float* denc = dout;  // (B, T, C) d(wte[tokens] + wpe)
  if (drop.active()) {
    float* d = ws.btc(0);
    zero(d, n);
    dropout_backward(d, dout, n, drop);
    denc = d;
  }
  encoder_backward(dw.wte, dw.wpe, denc, tokens, B, T, c.d_model);
}

std::string_view half_name(BlockHalf h) { return h == BlockHalf::Attention ? "attn" : "mlp"; }

std::vector<BlockAct> half_saves(BlockHalf h) {
  using K = BlockAct;
  if (h == BlockHalf::Attention)
    return {K::Ln1Out, K::Ln1Mean, K::Ln1Rstd, K::Qkv, K::AttSaved, K::AttY};
  return {K::Ln2Out, K::Ln2Mean, K::Ln2Rstd, K::FcOut, K::GeluOut};
}

BlockAct half_output(BlockHalf h) {
  return h == BlockHalf::Attention ? BlockAct::Resid1 : BlockAct::Out;
}

void block_forward(const GPTConfig& c, int layer, const BlockParams& w, const BlockActivations& a,
                   const float* x, Workspace& ws, int B, int T, const StepRng& rng) {
  check_buffers(c, a, block_prefix(layer), B, T);
  block_attention_forward(c, layer, w, a, x, ws, B, T, rng);
  block_mlp_forward(c, layer, w, a, ws, B, T, rng);
}

void block_backward(const GPTConfig& c, int layer, const BlockParams& w, const BlockParams& dw,
                    const BlockActivations& a, const float* x, float* dres, Workspace& ws, int B,
                    int T, const StepRng& rng) {
  check_buffers(c, a, block_prefix(layer), B, T);
  block_mlp_backward(c, layer, w, dw, a, dres, ws, B, T, rng);
  block_attention_backward(c, layer, w, dw, a, x, dres, ws, B, T, rng);
}

void attention_core_forward(const GPTConfig& c, float* out, float* scratch,
                            const BlockActivations& a, int B, int T, int NH, int KVH, int HS,
                            const AttentionDropout& drop) {
  using K = BlockAct;
  if (c.attention == AttentionKernel::Fused)
    flash_attention_forward(out, a.ptr(K::AttSaved), scratch, a.ptr(K::Qkv), B, T, NH, KVH, HS,
                            drop);
  else
    attention_forward(out, a.ptr(K::AttSaved), scratch, a.ptr(K::Qkv), B, T, NH, KVH, HS, drop);
}

void attention_core_backward(const GPTConfig& c, float* dqkv, float* scratch, const float* dout,
                             const BlockActivations& a, int B, int T, int NH, int KVH, int HS,
                             const AttentionDropout& drop) {
  using K = BlockAct;
  if (c.attention == AttentionKernel::Fused)
    flash_attention_backward(dqkv, scratch, dout, a.ptr(K::Qkv), a.ptr(K::AttY), a.ptr(K::AttSaved),
                             B, T, NH, KVH, HS, drop);
  else
    attention_backward(dqkv, scratch, dout, a.ptr(K::Qkv), a.ptr(K::AttSaved), B, T, NH, KVH, HS,
                       drop);
}

void block_attention_forward(const GPTConfig& c, int layer, const BlockParams& w,
                             const BlockActivations& a, const float* x, Workspace& ws, int B, int T,
                             const StepRng& rng) {
  check_half(c, a, BlockHalf::Attention, layer, B, T);
  ws.check_fits(c, B, T);
  const int C = c.d_model, NH = c.n_heads, KVH = c.n_kv_heads(), HS = c.head_size(), N = B * T;
  const int QKV = static_cast<int>(c.qkv_width());
  const int64_t n = static_cast<int64_t>(N) * C;
  float* proj = ws.btc(0);  // (B, T, C) the projection's output before dropout and residual
  const AttentionDropout attn_drop = attention_dropout(c, rng, layer);
  const Dropout resid_drop = site_dropout(c, rng, layer, DropoutSite::AttnResidual, T);
  using K = BlockAct;
  const MatmulPrecision mm = ws.matmul();
  a.visit(K::Ln1Out, [&](auto* ln1) {
    norm_forward(c, ln1, a, K::Ln1Mean, K::Ln1Rstd, x, w.ln_1_w, w.ln_1_b, N);  // (B, T, C)
    linear_forward(a.ptr(K::Qkv), ln1, w.c_attn_w, w.c_attn_b, N, C, QKV, mm);  // (B, T, QKV)
  });
  if (c.llama()) {  // q and k rotated in place: the saved qkv holds what attention multiplies
    rope_forward(a.ptr(K::Qkv), ws.rope(), B, T, NH, HS, QKV, 0);
    rope_forward(a.ptr(K::Qkv) + C, ws.rope(), B, T, KVH, HS, QKV, 0);
  }
  a.visit(K::AttY, [&](auto* y) {
    attention_core_forward(c, staged_output(y, ws.btc(1)), ws.attention(), a, B, T, NH, KVH, HS,
                           attn_drop);  // (B, T, C)
    store_staged(y, ws.btc(1), n);
    linear_forward(proj, y, w.attn_proj_w, w.attn_proj_b, N, C, C, mm);  // (B, T, C)
  });
  if (resid_drop.active()) dropout_forward(proj, proj, n, resid_drop);
  residual_forward(a.ptr(K::Resid1), x, proj, n);  // (B, T, C)
}

void block_mlp_forward(const GPTConfig& c, int layer, const BlockParams& w,
                       const BlockActivations& a, Workspace& ws, int B, int T, const StepRng& rng) {
  check_half(c, a, BlockHalf::Mlp, layer, B, T);
  ws.check_fits(c, B, T);
  const int C = c.d_model, N = B * T;
  const int F = static_cast<int>(c.mlp_width()), FC = static_cast<int>(c.fc_width());
  const int64_t n = static_cast<int64_t>(N) * C;
  float* proj = ws.btc(0);
  const Dropout resid_drop = site_dropout(c, rng, layer, DropoutSite::MlpResidual, T);
  using K = BlockAct;
  const MatmulPrecision mm = ws.matmul();
  a.visit(K::Ln2Out, [&](auto* ln2) {
    norm_forward(c, ln2, a, K::Ln2Mean, K::Ln2Rstd, a.ptr(K::Resid1), w.ln_2_w, w.ln_2_b,
                 N);                                                         // (B, T, C)
    linear_forward(a.ptr(K::FcOut), ln2, w.c_fc_w, w.c_fc_b, N, C, FC, mm);  // (B, T, FC)
  });
  a.visit(K::GeluOut, [&](auto* h) {
    if (c.llama())
      swiglu_rows_forward(h, a.ptr(K::FcOut), N, F);  // (B, T, F)
    else
      gelu_forward(h, a.ptr(K::FcOut), static_cast<int64_t>(N) * F);   // (B, T, 4C)
    linear_forward(proj, h, w.mlp_proj_w, w.mlp_proj_b, N, F, C, mm);  // (B, T, C)
  });
  if (resid_drop.active()) dropout_forward(proj, proj, n, resid_drop);
  residual_forward(a.ptr(K::Out), a.ptr(K::Resid1), proj, n);  // (B, T, C)
}

namespace {

// What reaches a residual branch's projection: dropout's backward of dres (the residual's
// identity path needs no kernel: dres is already part of the input's gradient, and the
// LayerNorm's input gradient is accumulated onto it in place).
const float* projection_grad(const Dropout& drop, const float* dres, Workspace& ws, int64_t n) {
  if (!drop.active()) return dres;
  float* d = ws.btc(0);
  zero(d, n);
  dropout_backward(d, dres, n, drop);
  return d;
}

}  // namespace

void block_mlp_backward(const GPTConfig& c, int layer, const BlockParams& w, const BlockParams& dw,
                        const BlockActivations& a, float* dres, Workspace& ws, int B, int T,
                        const StepRng& rng) {
  check_half(c, a, BlockHalf::Mlp, layer, B, T);
  ws.check_fits(c, B, T);
  const int C = c.d_model, N = B * T;
  const int F = static_cast<int>(c.mlp_width()), FC = static_cast<int>(c.fc_width());
  const int64_t n = static_cast<int64_t>(N) * C, nf = static_cast<int64_t>(N) * F;
  float* dc = ws.btc(1);  // (B, T, C) d(ln_2.out)
  // GPT-2: (B, T, 4C) d(mlp.gelu.out), then in place d(mlp.c_fc.out). Llama: dh (B, T, F)
  // d(swiglu.out), then dfc (B, T, 2F) d(mlp.c_fc.out) beside it.
  float* dh = ws.wide();
  float* dfc = c.llama() ? dh + nf : dh;
  using K = BlockAct;
  const float* dmlp =
      projection_grad(site_dropout(c, rng, layer, DropoutSite::MlpResidual, T), dres, ws, n);
  zero(dh, nf);
  const MatmulPrecision mm = ws.matmul();
  a.visit(K::GeluOut, [&](const auto* h) {
    linear_backward(dh, dw.mlp_proj_w, dw.mlp_proj_b, dmlp, h, w.mlp_proj_w, N, F, C, mm);
  });
  if (c.llama()) {
    zero(dfc, static_cast<int64_t>(N) * FC);
    swiglu_rows_backward(dfc, dh, a.ptr(K::FcOut), N, F);
  } else {
    gelu_backward_inplace(dfc, a.ptr(K::FcOut), nf);
  }
  zero(dc, n);
  a.visit(K::Ln2Out, [&](const auto* ln2) {
    linear_backward(dc, dw.c_fc_w, dw.c_fc_b, dfc, ln2, w.c_fc_w, N, C, FC, mm);
  });
  norm_backward(c, dres, dw.ln_2_w, dw.ln_2_b, dc, a.ptr(K::Resid1), w.ln_2_w, a, K::Ln2Mean,
                K::Ln2Rstd, N);  // dres is now d(resid_1)
}

void block_attention_backward(const GPTConfig& c, int layer, const BlockParams& w,
                              const BlockParams& dw, const BlockActivations& a, const float* x,
                              float* dres, Workspace& ws, int B, int T, const StepRng& rng) {
  check_half(c, a, BlockHalf::Attention, layer, B, T);
  ws.check_fits(c, B, T);
  const int C = c.d_model, NH = c.n_heads, KVH = c.n_kv_heads(), HS = c.head_size(), N = B * T;
  const int QKV = static_cast<int>(c.qkv_width());
  const int64_t n = static_cast<int64_t>(N) * C;
  float* dc = ws.btc(1);    // (B, T, C) d(attn.y), then d(ln_1.out)
  float* dqkv = ws.wide();  // (B, T, QKV)
  using K = BlockAct;
  const float* dattn =
      projection_grad(site_dropout(c, rng, layer, DropoutSite::AttnResidual, T), dres, ws, n);
  zero(dc, n);
  const MatmulPrecision mm = ws.matmul();
  a.visit(K::AttY, [&](const auto* y) {
    linear_backward(dc, dw.attn_proj_w, dw.attn_proj_b, dattn, y, w.attn_proj_w, N, C, C, mm);
  });
  zero(dqkv, static_cast<int64_t>(N) * QKV);
  attention_core_backward(c, dqkv, ws.attention(), dc, a, B, T, NH, KVH, HS,
                          attention_dropout(c, rng, layer));
  if (c.llama()) {  // the gradients of the rotated q and k back to those of the projection's
    rope_backward(dqkv, ws.rope(), B, T, NH, HS, QKV, 0);
    rope_backward(dqkv + C, ws.rope(), B, T, KVH, HS, QKV, 0);
  }
  zero(dc, n);
  a.visit(K::Ln1Out, [&](const auto* ln1) {
    linear_backward(dc, dw.c_attn_w, dw.c_attn_b, dqkv, ln1, w.c_attn_w, N, C, QKV, mm);
  });
  norm_backward(c, dres, dw.ln_1_w, dw.ln_1_b, dc, x, w.ln_1_w, a, K::Ln1Mean, K::Ln1Rstd,
                N);  // dres is now d(x)
}

float final_forward(const GPTConfig& c, const FinalParams& w, const FinalActivations& a,
                    const float* x, const int32_t* targets, Workspace& ws, int B, int T) {
  check_buffers(c, a, "", B, T);
  ws.check_fits(c, B, T);
  const int C = c.d_model, V = c.vocab_size, N = B * T;
  using K = FinalAct;
  a.visit(K::LnfOut, [&](auto* lnf) {
    norm_forward(c, lnf, a, K::LnfMean, K::LnfRstd, x, w.ln_f_w, w.ln_f_b, N);  // (B, T, C)
    if (targets == nullptr) return;
    // Per chunk of tokens: logits (chunk, V) in the workspace, then only each token's loss kept.
    lm_head_loss_forward(a.ptr(K::Losses), ws.logits(), lnf, w.wte, targets, N, C, V,
                         lm_head_chunk_rows(N, V), ws.matmul());
  });
  if (targets == nullptr) return std::numeric_limits<float>::quiet_NaN();
  // The mean in double, in token order: deterministic and no drift over many tokens.
  double sum = 0.0;
  const float* losses = a.ptr(K::Losses);
  for (int i = 0; i < N; ++i) sum += losses[i];
  return static_cast<float>(sum / N);
}

void final_backward(const GPTConfig& c, const FinalParams& w, const FinalParams& dw,
                    const FinalActivations& a, const float* x, const int32_t* targets, float dloss,
                    float* dx, Workspace& ws, int B, int T) {
  check_buffers(c, a, "", B, T);
  ws.check_fits(c, B, T);
  const int C = c.d_model, V = c.vocab_size, N = B * T;
  using K = FinalAct;
  float* dlnf = ws.btc(1);  // (B, T, C)
  zero(dlnf, static_cast<int64_t>(N) * C);
  // Per chunk: the forward's logits computed again (one more head matmul a step, for not keeping
  // N x V of them), their gradient in place, then dlnf and dwte from it.
  a.visit(K::LnfOut, [&](const auto* lnf) {
    lm_head_loss_backward(dlnf, dw.wte, ws.logits(), lnf, w.wte, targets,
                          dloss / static_cast<float>(N), N, C, V, lm_head_chunk_rows(N, V),
                          ws.matmul());
  });
  norm_backward(c, dx, dw.ln_f_w, dw.ln_f_b, dlnf, x, w.ln_f_w, a, K::LnfMean, K::LnfRstd, N);
}

void final_logits(const GPTConfig& c, const FinalParams& w, const FinalActivations& a,
                  Workspace& ws, int B, int T, int first, int rows, float* logits) {
  check_buffers(c, a, "", B, T);
  ws.check_fits(c, B, T);
  const int C = c.d_model, V = c.vocab_size;
  if (first < 0 || rows < 0 || first > B * T - rows)
    user_error("GPT head rows [{}, {}) are outside the batch's {} tokens", first, first + rows,
               B * T);
  a.visit(FinalAct::LnfOut, [&](const auto* lnf) {
    lm_head_forward(logits, lnf + static_cast<int64_t>(first) * C, w.wte, rows, C, V, ws.matmul());
  });
}

void final_probabilities(const GPTConfig& c, const FinalParams& w, const FinalActivations& a,
                         Workspace& ws, int B, int T, int first, int rows, float* probs) {
  final_logits(c, w, a, ws, B, T, first, rows, probs);
  crossentropy_forward(nullptr, probs, probs, nullptr, rows, c.vocab_size);
}

// ---------------------------------------------------------------------------------------------
// The whole model.

namespace {

void check_batch(const ParameterSet& params, const GPTActivations& acts, const Workspace& ws,
                 const Batch& batch, bool need_targets) {
  const GPTConfig& c = params.config();
  if (!(acts.config() == c))
    user_error("GPT activations were allocated for another model configuration");
  if (batch.tokens == nullptr) user_error("GPT batch has no tokens");
  if (need_targets && batch.targets == nullptr)
    user_error("GPT backward needs the batch's targets");
  if (batch.B != acts.batch() || batch.T != acts.seq())
    user_error("GPT batch is {} x {} but the activations are for {} x {}", batch.B, batch.T,
               acts.batch(), acts.seq());
  ws.check_fits(c, batch.B, batch.T);
  const int64_t n = static_cast<int64_t>(batch.B) * batch.T;
  for (int64_t i = 0; i < n; ++i) {
    if (batch.tokens[i] < 0 || batch.tokens[i] >= c.vocab_size)
      user_error("GPT batch token {} at position {} is outside the vocabulary [0, {})",
                 batch.tokens[i], i, c.vocab_size);
    if (batch.targets != nullptr && (batch.targets[i] < 0 || batch.targets[i] >= c.vocab_size))
      user_error("GPT batch target {} at position {} is outside the vocabulary [0, {})",
                 batch.targets[i], i, c.vocab_size);
  }
}

void call(const LayerHook& hook, Pass pass, Stage stage, int layer, bool after) {
  if (hook) hook(LayerEvent{pass, stage, layer, after});
}

}  // namespace

float gpt_forward(const ParameterSet& params, GPTActivations& acts, Workspace& ws,
                  const Batch& batch, const StepRng& rng, const LayerHook& hook) {
  check_batch(params, acts, ws, batch, false);
  const GPTConfig& c = params.config();
  const int B = batch.B, T = batch.T;
  call(hook, Pass::Forward, Stage::Embedding, -1, false);
  embedding_forward(c, params.embedding(), acts.embedding, batch.tokens, B, T, rng);
  call(hook, Pass::Forward, Stage::Embedding, -1, true);
  for (int l = 0; l < c.n_layers; ++l) {
    call(hook, Pass::Forward, Stage::Block, l, false);
    block_forward(c, l, params.block(l), acts.blocks[static_cast<size_t>(l)], acts.block_input(l),
                  ws, B, T, rng);
    call(hook, Pass::Forward, Stage::Block, l, true);
  }
  call(hook, Pass::Forward, Stage::Final, c.n_layers, false);
  const float loss = final_forward(c, params.final_stage(), acts.head, acts.block_input(c.n_layers),
                                   batch.targets, ws, B, T);
  call(hook, Pass::Forward, Stage::Final, c.n_layers, true);
  return loss;
}

void gpt_backward(const ParameterSet& params, const ParameterSet& grads, GPTActivations& acts,
                  Workspace& ws, const Batch& batch, const StepRng& rng, float dloss,
                  const LayerHook& hook) {
  check_batch(params, acts, ws, batch, true);
  if (!(grads.config() == params.config()))
    user_error("GPT gradients were allocated for another model configuration");
  const GPTConfig& c = params.config();
  const int B = batch.B, T = batch.T;
  float* dres = ws.dresidual();  // (B, T, C) d(loss)/d(residual stream), walking backwards
  zero(dres, static_cast<int64_t>(B) * T * c.d_model);
  call(hook, Pass::Backward, Stage::Final, c.n_layers, false);
  final_backward(c, params.final_stage(), grads.final_stage(), acts.head,
                 acts.block_input(c.n_layers), batch.targets, dloss, dres, ws, B, T);
  call(hook, Pass::Backward, Stage::Final, c.n_layers, true);
  for (int l = c.n_layers - 1; l >= 0; --l) {
    call(hook, Pass::Backward, Stage::Block, l, false);
    block_backward(c, l, params.block(l), grads.block(l), acts.blocks[static_cast<size_t>(l)],
                   acts.block_input(l), dres, ws, B, T, rng);
    call(hook, Pass::Backward, Stage::Block, l, true);
  }
  call(hook, Pass::Backward, Stage::Embedding, -1, false);
  embedding_backward(c, grads.embedding(), dres, batch.tokens, ws, B, T, rng);
  call(hook, Pass::Backward, Stage::Embedding, -1, true);
}

}  // namespace tandem::nn
