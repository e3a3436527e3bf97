// The GPT configuration's checks, the parameter layout with GPT-2's names, and initialisation.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "tandem/core/error.h"
#include "tandem/core/parallel.h"
#include "tandem/core/rng.h"
#include "tandem/nn/gpt.h"

namespace tandem::nn {

std::string_view arch_name(Arch a) { return a == Arch::Llama ? "llama" : "gpt2"; }

std::string_view attention_kernel_name(AttentionKernel k) {
  return k == AttentionKernel::Unfused ? "unfused" : "fused";
}

namespace {

constexpr int kTensorsPerBlock = 12;
constexpr int kEmbeddingTensors = 2;  // wte, wpe

// The twelve tensors of a block, in order (gpt.h): name suffix and shape.
std::vector<std::pair<const char*, Shape>> block_tensors(const GPTConfig& c) {
  const int64_t C = c.d_model, QKV = c.qkv_width(), FC = c.fc_width(), F = c.mlp_width();
  const int64_t bias = c.llama() ? 0 : 1;  // Llama's absent tensors have no elements
  return {{"ln_1.weight", {C}},
          {"ln_1.bias", {bias * C}},
          {"attn.c_attn.weight", {C, QKV}},
          {"attn.c_attn.bias", {(bias || c.qkv_bias) ? QKV : 0}},
          {"attn.c_proj.weight", {C, C}},
          {"attn.c_proj.bias", {bias * C}},
          {"ln_2.weight", {C}},
          {"ln_2.bias", {bias * C}},
          {"mlp.c_fc.weight", {C, FC}},
          {"mlp.c_fc.bias", {bias * FC}},
          {"mlp.c_proj.weight", {F, C}},
          {"mlp.c_proj.bias", {bias * C}}};
}

int64_t block_floats(const GPTConfig& c) {
  int64_t n = 0;
  for (const auto& [name, shape] : block_tensors(c)) n += shape.numel();
  return n;
}

// Rows of wpe (Llama has no learned positions) and the untied head's floats.
int64_t wpe_rows(const GPTConfig& c) { return c.llama() ? 0 : c.max_positions; }
int64_t head_floats(const GPTConfig& c) {
  return c.tie_embeddings ? 0 : int64_t{c.vocab_size} * c.d_model;
}
int64_t final_norm_floats(const GPTConfig& c) { return c.llama() ? c.d_model : 2 * c.d_model; }

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

void GPTConfig::validate() const {
  if (vocab_size < 1) user_error("GPT config: vocab_size is {}; it must be at least 1", vocab_size);
  if (n_layers < 0) user_error("GPT config: n_layers is {}; it must be 0 or more", n_layers);
  if (n_heads < 1) user_error("GPT config: n_heads is {}; it must be at least 1", n_heads);
  if (d_model < 1) user_error("GPT config: d_model is {}; it must be at least 1", d_model);
  if (d_model % n_heads != 0)
    user_error("GPT config: d_model ({}) must be divisible by n_heads ({})", d_model, n_heads);
  if (seq_len < 1) user_error("GPT config: seq_len is {}; it must be at least 1", seq_len);
  if (max_positions < seq_len)
    user_error("GPT config: max_positions ({}) must be at least seq_len ({})", max_positions,
               seq_len);
  if (!(dropout >= 0.0f && dropout < 1.0f))
    user_error("GPT config: dropout is {}; it must be in [0, 1)", dropout);
  if (!llama()) {
    // The Llama fields keep their defaults, so that a GPT-2 run never half-reads them.
    if (kv_heads != 0 && kv_heads != n_heads)
      user_error(
          "GPT config: kv_heads is {}; grouped-query attention is a Llama field (arch llama)",
          kv_heads);
    if (ffn != 0 && ffn != 4 * d_model)
      user_error(
          "GPT config: ffn is {}; GPT-2's MLP is 4 x d_model ({}); another width needs "
          "arch llama",
          ffn, 4 * d_model);
    if (qkv_bias) user_error("GPT config: qkv_bias is a Llama field; GPT-2 has every bias");
    if (!tie_embeddings)
      user_error(
          "GPT config: tie_embeddings is false; GPT-2's head is tied to wte, an untied head "
          "needs arch llama");
    const GPTConfig defaults;
    if (norm_eps != defaults.norm_eps || rope_theta != defaults.rope_theta ||
        !(rope_scaling == defaults.rope_scaling))
      user_error(
          "GPT config: norm_eps, rope_theta and rope_scaling are Llama fields (RMSNorm, rotary "
          "positions); GPT-2's LayerNorm and learned positions have none");
  } else {
    if (kv_heads < 0 || (kv_heads > 0 && n_heads % kv_heads != 0))
      user_error("GPT config: kv_heads ({}) must divide n_heads ({})", kv_heads, n_heads);
    if (ffn < 0) user_error("GPT config: ffn is {}; it must be at least 1 (0: 4 x d_model)", ffn);
    if (!(norm_eps > 0.0f) || !std::isfinite(norm_eps))
      user_error("GPT config: norm_eps is {}; it must be positive", norm_eps);
    if (head_size() % 2 != 0)
      user_error(
          "GPT config: rotary positions rotate pairs, so the head size (d_model / "
          "n_heads = {}) must be even",
          head_size());
    (void)rope_inv_freq(head_size(), rope_theta, rope_scaling);  // checks theta and the scaling
  }
  if (matmul != DType::F32 && matmul != DType::BF16)
    user_error("GPT config: matmuls in {}; they multiply in f32 or bf16", dtype_name(matmul));
  auto at_most = [](const char* field, int value, int most) {
    if (value > most) user_error("GPT config: {} is {}; it must be at most {}", field, value, most);
  };
  at_most("vocab_size", vocab_size, kMaxVocab);
  at_most("n_layers", n_layers, kMaxLayers);
  at_most("d_model", d_model, kMaxWidth);
  at_most("max_positions", max_positions, kMaxPositions);
  at_most("ffn", ffn, kMaxWidth);
  // Within those sizes the count fits 64 bits.
  const int64_t C = d_model;
  const int64_t params = (int64_t{vocab_size} + wpe_rows(*this)) * C +
                         n_layers * block_floats(*this) + final_norm_floats(*this) +
                         head_floats(*this);
  if (params > kMaxParameters)
    user_error("GPT config: the model would have {} parameters; at most {} (2^40)", params,
               kMaxParameters);
}

std::vector<ParamSpec> gpt_parameter_specs(const GPTConfig& c) {
  c.validate();
  const int64_t C = c.d_model;
  std::vector<ParamSpec> specs;
  const auto block = block_tensors(c);
  specs.reserve(kEmbeddingTensors + static_cast<size_t>(c.n_layers) * kTensorsPerBlock + 2);
  int64_t offset = 0;
  auto add = [&](std::string name, Shape shape) {
    const int64_t n = shape.numel();
    specs.push_back({std::move(name), std::move(shape), offset});
    offset += n;
  };
  add("wte.weight", {c.vocab_size, C});
  add("wpe.weight", {wpe_rows(c), C});
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    for (const auto& [name, shape] : block) add(h + name, shape);
  }
  add("ln_f.weight", {C});
  add("ln_f.bias", {final_norm_floats(c) - C});
  if (!c.tie_embeddings) add("lm_head.weight", {c.vocab_size, C});
  return specs;
}

int64_t gpt_num_parameters(const GPTConfig& c) {
  c.validate();
  const int64_t C = c.d_model;
  return (static_cast<int64_t>(c.vocab_size) + wpe_rows(c)) * C + c.n_layers * block_floats(c) +
         final_norm_floats(c) + head_floats(c);
}

ParameterSet::ParameterSet(const GPTConfig& config, Allocator& alloc)
    : config_(config), specs_(gpt_parameter_specs(config)) {
  flat_ = Tensor::zeros(DType::F32, Shape{gpt_num_parameters(config)}, alloc);
  TANDEM_CHECK(specs_.back().offset + specs_.back().numel() == flat_.numel(),
               "parameter layout covers {} of {} floats",
               specs_.back().offset + specs_.back().numel(), flat_.numel());
}

float* ParameterSet::at(size_t spec_index) const {
  if (specs_[spec_index].numel() == 0) return nullptr;  // a tensor this family lacks
  return flat_.data_as<float>() + specs_[spec_index].offset;
}

Tensor ParameterSet::operator[](std::string_view name) const {
  for (size_t i = 0; i < specs_.size(); ++i)
    if (specs_[i].name == name) return Tensor::view_of(at(i), DType::F32, specs_[i].shape);
  user_error(
      "GPT has no parameter called '{}' (names are GPT-2's: wte.weight, wpe.weight, "
      "h.0.ln_1.weight, "
      "h.0.attn.c_attn.weight, ..., ln_f.bias; this model has layers 0..{})",
      name, config_.n_layers - 1);
}

std::vector<std::pair<std::string, Tensor>> ParameterSet::named() const {
  std::vector<std::pair<std::string, Tensor>> out;
  out.reserve(specs_.size());
  for (size_t i = 0; i < specs_.size(); ++i)
    out.emplace_back(specs_[i].name, Tensor::view_of(at(i), DType::F32, specs_[i].shape));
  return out;
}

EmbeddingParams ParameterSet::embedding() const { return {at(0), at(1)}; }

BlockParams ParameterSet::block(int layer) const {
  if (layer < 0 || layer >= config_.n_layers)
    user_error("GPT block {} does not exist: the model has layers 0..{}", layer,
               config_.n_layers - 1);
  const size_t s = kEmbeddingTensors + static_cast<size_t>(layer) * kTensorsPerBlock;
  return {at(s + 0), at(s + 1), at(s + 2), at(s + 3), at(s + 4),  at(s + 5),
          at(s + 6), at(s + 7), at(s + 8), at(s + 9), at(s + 10), at(s + 11)};
}

FinalParams ParameterSet::final_stage() const {
  const size_t s = kEmbeddingTensors + static_cast<size_t>(config_.n_layers) * kTensorsPerBlock;
  return {at(s), at(s + 1), config_.tie_embeddings ? at(0) : at(s + 2)};
}

Tensor ParameterSet::block_flat(int layer) const {
  (void)block(layer);  // checks the index
  const size_t s = kEmbeddingTensors + static_cast<size_t>(layer) * kTensorsPerBlock;
  return flat_.flat_slice(specs_[s].offset, block_floats(config_));  // (empty tensors included)
}

// Split over threads (core/parallel.h): a model's gradients are tens of MiB.
void ParameterSet::zero() const {
  if (flat_.nbytes() == 0) return;
  auto* p = static_cast<unsigned char*>(flat_.data());
  parallel_for(static_cast<int64_t>(flat_.nbytes()), int64_t{1} << 18,
               [&](int64_t b, int64_t e) { std::memset(p + b, 0, static_cast<size_t>(e - b)); });
}

void gpt_init_values(const GPTConfig& c, std::string_view name, int64_t first, int64_t count,
                     float* out, uint64_t seed) {
  if (count == 0) return;
  const bool layernorm = name.find("ln_") != std::string_view::npos;
  if (layernorm || ends_with(name, ".bias")) {
    std::fill(out, out + count, layernorm && ends_with(name, ".weight") ? 1.0f : 0.0f);
    return;
  }
  const float std_base = 0.02f;
  const float std_resid = 0.02f / std::sqrt(2.0f * static_cast<float>(std::max(c.n_layers, 1)));
  const float sd = ends_with(name, "c_proj.weight") ? std_resid : std_base;
  for (int64_t i = 0; i < count; ++i)
    out[i] = sd * random_normal(seed, static_cast<uint64_t>(first + i));
}

void gpt_init(const ParameterSet& params, uint64_t seed) {
  float* flat = params.flat().data_as<float>();
  for (const ParamSpec& s : params.specs())
    gpt_init_values(params.config(), s.name, s.offset, s.numel(), flat + s.offset, seed);
}

}  // namespace tandem::nn
