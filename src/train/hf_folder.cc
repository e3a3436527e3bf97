// A checkpoint exported as a Hugging Face folder (GPT-2 or Llama), and a run started from such a
// folder: its config read and checked against the run's, its weights scattered to the ranks; both
// one tensor at a time through one layout (hf_layout).
#include "tandem/train/hf_folder.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <variant>

#include "checkpoint_tensors.h"
#include "corpus_cache.h"
#include "run_checkpoint.h"
#include "tandem/comm/agree.h"
#include "tandem/comm/communicator.h"
#include "tandem/core/error.h"
#include "tandem/core/sha256.h"
#include "tandem/data/tokenizer.h"
#include "tandem/io/atomic_file.h"
#include "tandem/io/checkpoint.h"
#include "tandem/io/hf_folder.h"
#include "tandem/parallel/state_streamer.h"
#include "tandem/train/model_config.h"

namespace tandem::train {
namespace {

namespace fs = std::filesystem;

std::string in_folder(const std::string& dir, std::string_view name) {
  return (fs::path(dir) / name).string();
}

int64_t largest_tensor(const nn::GPTConfig& c) {
  int64_t n = 0;
  for (const nn::ParamSpec& s : nn::gpt_parameter_specs(c)) n = std::max(n, s.numel());
  return n;
}

// The tokenizer an export copies: its path and bytes, checked against the SHA-256 the checkpoint
// recorded. Empty for a byte-level model.
struct TokenizerFile {
  std::string path;
  std::string bytes;
};

TokenizerFile checkpoint_tokenizer(const io::RunMeta& meta, const std::string& checkpoint,
                                   const std::string& given) {
  const nlohmann::json& x = meta.extra;
  const std::string recorded = x.contains("tokenizer") && x["tokenizer"].is_string()
                                   ? x["tokenizer"].get<std::string>()
                                   : "";
  const std::string sha = x.contains("tokenizer_sha256") && x["tokenizer_sha256"].is_string()
                              ? x["tokenizer_sha256"].get<std::string>()
                              : "";
  if (given.empty() && recorded.empty()) return {};
  if (given.empty() && !fs::exists(recorded))
    user_error(
        "checkpoint '{}' records its tokenizer as '{}', which no longer exists: give the same "
        "file with --tokenizer",
        checkpoint, recorded);
  TokenizerFile t;
  t.path = given.empty() ? recorded : given;
  t.bytes = io::read_file(t.path, "tokenizer");
  if (!sha.empty() && sha256_hex(t.bytes) != sha)
    user_error(
        "tokenizer '{}' is not the one checkpoint '{}' was trained with (SHA-256 {}, recorded "
        "{}): its token ids would mean other pieces",
        t.path, checkpoint, sha256_hex(t.bytes), sha);
  return t;
}

// Refuses an output folder that holds anything an export does not write: replacing the folder
// would delete it.
void check_export_folder(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return;
  if (!fs::is_directory(dir, ec))
    user_error("--out '{}' is a file, not a folder: give a folder to export into", dir);
  const std::set<std::string> ours = {std::string(io::kHfWeightsFile),
                                      std::string(io::kHfConfigFile), "tokenizer.model",
                                      "tokenizer.json"};
  std::vector<std::string> others;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec))
    if (!ours.contains(e.path().filename().string()))
      others.push_back(e.path().filename().string());
  std::sort(others.begin(), others.end());
  if (!others.empty())
    user_error(
        "--out '{}' holds files an export does not write ({}): the folder is replaced whole, so "
        "give a new or empty folder",
        dir, fmt::join(others, ", "));
}

// ---------------------------------------------------------------------------------------------
// The layout: where each of Hugging Face's tensors sits in one of tandem's.

// A Hugging Face tensor: columns [begin, end) of a 2-D tandem tensor (elements of a 1-D one),
// stored transposed (nn.Linear's (out, in) from tandem's (in, out)) or as they are.
struct HfPiece {
  std::string name;  // as Hugging Face names it (canonical: GPT-2's with "transformer.")
  Shape shape;       // as Hugging Face stores it
  int64_t begin = 0, end = 0;
  bool transpose = false;
};

// A tandem tensor and the Hugging Face tensors that hold it: none for those not stored (Llama's
// wpe and absent biases, all empty).
struct HfTensor {
  nn::ParamSpec spec;
  std::vector<HfPiece> pieces;
};

int64_t columns(const Shape& s) { return s.rank() == 1 ? s[0] : s[1]; }
int64_t rows(const Shape& s) { return s.rank() == 1 ? 1 : s[0]; }

HfPiece whole(std::string name, const Shape& s) { return {std::move(name), s, 0, columns(s)}; }

// Columns [begin, end) of the (in, out) weight `s` as nn.Linear's (end - begin, in) weight.
HfPiece linear(std::string name, const Shape& s, int64_t begin, int64_t end) {
  return {std::move(name), Shape{end - begin, s[0]}, begin, end, true};
}

// Elements [begin, end) of the bias `s`.
HfPiece bias(std::string name, int64_t begin, int64_t end) {
  return {std::move(name), Shape{end - begin}, begin, end};
}

// LlamaForCausalLM's tensors of one of tandem's ("h.3.attn.c_attn.weight").
std::vector<HfPiece> llama_pieces(const nn::GPTConfig& c, const nn::ParamSpec& spec) {
  const std::string& n = spec.name;
  const Shape& s = spec.shape;
  if (spec.numel() == 0) return {};  // wpe, the biases Llama lacks
  if (n == "wte.weight") return {whole("model.embed_tokens.weight", s)};
  if (n == "ln_f.weight") return {whole("model.norm.weight", s)};
  if (n == std::string(io::kHfLmHead)) return {whole(std::string(io::kHfLmHead), s)};
  const size_t dot = n.find('.', 2);
  TANDEM_CHECK(n.starts_with("h.") && dot != std::string::npos, "Llama tensor '{}' unmapped", n);
  const std::string layer = "model.layers." + n.substr(2, dot - 2) + ".";
  const std::string rest = n.substr(dot + 1);
  const int64_t C = c.d_model, KV = int64_t{c.n_kv_heads()} * c.head_size(), F = c.mlp_width();
  if (rest == "ln_1.weight") return {whole(layer + "input_layernorm.weight", s)};
  if (rest == "ln_2.weight") return {whole(layer + "post_attention_layernorm.weight", s)};
  const std::string attn = layer + "self_attn.", mlp = layer + "mlp.";
  if (rest == "attn.c_attn.weight")
    return {linear(attn + "q_proj.weight", s, 0, C), linear(attn + "k_proj.weight", s, C, C + KV),
            linear(attn + "v_proj.weight", s, C + KV, C + 2 * KV)};
  if (rest == "attn.c_attn.bias")
    return {bias(attn + "q_proj.bias", 0, C), bias(attn + "k_proj.bias", C, C + KV),
            bias(attn + "v_proj.bias", C + KV, C + 2 * KV)};
  if (rest == "attn.c_proj.weight") return {linear(attn + "o_proj.weight", s, 0, C)};
  if (rest == "mlp.c_fc.weight")
    return {linear(mlp + "gate_proj.weight", s, 0, F), linear(mlp + "up_proj.weight", s, F, 2 * F)};
  if (rest == "mlp.c_proj.weight") return {linear(mlp + "down_proj.weight", s, 0, C)};
  internal_error(
      fmt::format("Llama tensor '{}' of {} elements has no Hugging Face name", n, spec.numel()));
}

// Every tandem tensor, in the flat buffer's order, with the Hugging Face tensors that hold it.
std::vector<HfTensor> hf_layout(const nn::GPTConfig& c) {
  std::vector<HfTensor> out;
  for (const nn::ParamSpec& spec : nn::gpt_parameter_specs(c)) {
    HfTensor t{spec, {}};
    if (c.llama())
      t.pieces = llama_pieces(c, spec);
    else
      t.pieces.push_back(whole(io::hf_gpt2_name(spec.name), spec.shape));
    out.push_back(std::move(t));
  }
  return out;
}

// The Hugging Face names of the embedding the head is tied to, and of the head.
std::string hf_embedding_name(const nn::GPTConfig& c) {
  return c.llama() ? "model.embed_tokens.weight" : io::hf_gpt2_name("wte.weight");
}

// Every Hugging Face tensor name of the model, in the layout's order.
std::vector<std::string> hf_names(const std::vector<HfTensor>& layout) {
  std::vector<std::string> out;
  for (const HfTensor& t : layout)
    for (const HfPiece& p : t.pieces) out.push_back(p.name);
  return out;
}

// The file names of a family's folders as tandem reads them; the tensors that are constants.
std::string identity_name(std::string_view name) { return std::string(name); }
io::HfWeights::NameMap canonical_name(const nn::GPTConfig& c) {
  return c.llama() ? identity_name : io::hf_gpt2_canonical_name;
}
bool is_buffer(const nn::GPTConfig& c, std::string_view canonical) {
  return c.llama() ? io::hf_llama_is_buffer(canonical) : io::hf_gpt2_is_buffer(canonical);
}

// Copies between a tandem tensor t (shape `s`) and a piece's values p, in blocks of rows and
// columns so that a transposed copy touches both in cache-sized tiles.
template <bool kToPiece>
void copy_piece(float* t, const Shape& s, const HfPiece& piece, float* p) {
  const int64_t R = rows(s), W = columns(s), width = piece.end - piece.begin;
  constexpr int64_t kTile = 32;
  for (int64_t r0 = 0; r0 < R; r0 += kTile)
    for (int64_t j0 = 0; j0 < width; j0 += kTile)
      for (int64_t r = r0; r < std::min(R, r0 + kTile); ++r)
        for (int64_t j = j0; j < std::min(width, j0 + kTile); ++j) {
          float& in_t = t[r * W + piece.begin + j];
          float& in_p = piece.transpose ? p[j * R + r] : p[r * width + j];
          if constexpr (kToPiece)
            in_p = in_t;
          else
            in_t = in_p;
        }
}

int64_t largest_piece(const std::vector<HfTensor>& layout) {
  int64_t n = 0;
  for (const HfTensor& t : layout)
    for (const HfPiece& p : t.pieces) n = std::max(n, p.shape.numel());
  return n;
}

// A piece that is its tandem tensor as it is: copied without a second buffer.
bool is_whole(const HfTensor& t, const HfPiece& p) {
  return !p.transpose && p.begin == 0 && p.end == columns(t.spec.shape);
}

std::string rope_scaling_text(const nn::RopeScaling& r) {
  if (r.type != nn::RopeType::Llama3) return "none";
  return fmt::format("llama3:{},{},{},{}", r.factor, r.low_freq_factor, r.high_freq_factor,
                     r.original_max_position_embeddings);
}

}  // namespace

HfFieldNames hf_field_names(nn::Arch arch) {
  if (arch == nn::Arch::Llama)
    return {"vocab_size", "num_hidden_layers", "num_attention_heads", "hidden_size",
            "max_position_embeddings"};
  return {"vocab_size", "n_layer", "n_head", "n_embd", "n_positions"};
}

std::vector<HfFieldDifference> hf_block_differences(const nn::GPTConfig& folder,
                                                    const nn::GPTConfig& run) {
  std::vector<HfFieldDifference> out;
  const auto model_type = [](const nn::GPTConfig& c) -> std::string {
    return !c.llama() ? "\"gpt2\"" : c.qkv_bias ? "\"qwen2\"" : "\"llama\"";
  };
  if (folder.arch != run.arch) {
    out.push_back(
        {"model_type", model_type(folder), std::string(nn::arch_name(run.arch)), "--arch"});
    return out;
  }
  const HfFieldNames f = hf_field_names(folder.arch);
  const auto add = [&](const char* field, const auto& have, const auto& want, const char* flag) {
    if (have != want)
      out.push_back({field, fmt::format("{}", have), fmt::format("{}", want), flag});
  };
  add(f.layers, folder.n_layers, run.n_layers, "--layers");
  add(f.heads, folder.n_heads, run.n_heads, "--heads");
  add(f.d_model, folder.d_model, run.d_model, "--d-model");
  if (!folder.llama()) return out;
  add("num_key_value_heads", folder.n_kv_heads(), run.n_kv_heads(), "--kv-heads");
  add("intermediate_size", folder.mlp_width(), run.mlp_width(), "--ffn");
  add("rms_norm_eps", folder.norm_eps, run.norm_eps, "--norm-eps");
  add("rope_theta", folder.rope_theta, run.rope_theta, "--rope-theta");
  add("rope_scaling", rope_scaling_text(folder.rope_scaling), rope_scaling_text(run.rope_scaling),
      "--rope-scaling");
  if (folder.qkv_bias != run.qkv_bias)
    out.push_back({"model_type",
                   folder.qkv_bias ? "\"qwen2\" (q/k/v biases)" : "\"llama\" (no q/k/v biases)",
                   run.qkv_bias ? "true" : "false", "--qkv-bias"});
  add("tie_word_embeddings", folder.tie_embeddings, run.tie_embeddings, "--tie-embeddings");
  return out;
}

HfExport export_hf(const std::string& checkpoint, const std::string& out_dir,
                   const std::string& tokenizer) {
  const io::CheckpointReader reader(checkpoint, false);
  HfExport out;
  out.checkpoint = reader.folder();
  out.step = reader.meta().step;
  out.config = model_config_from_json(reader.meta().model_config,
                                      fmt::format("checkpoint '{}'", reader.folder()));
  const nn::GPTConfig& c = out.config;
  std::vector<std::string> names;
  for (const io::SafetensorsEntry& e : reader.weights().tensors()) names.push_back(e.name);
  detail::check_tensor_names(names, c, {""}, reader.weights().path());
  const TokenizerFile tok = checkpoint_tokenizer(reader.meta(), reader.folder(), tokenizer);
  check_export_folder(out_dir);

  const std::string tok_name = tok.path.empty() ? "" : io::hf_tokenizer_file_name(tok.path);
  // The tokenizer's end-of-text (and, for Llama, document-start) ids, where it has them: a
  // SentencePiece model's, or for Llama also a tokenizer.json's (Llama 3's, Llama 2's).
  std::optional<int> eos, bos;
  if (tok_name == "tokenizer.model" || (c.llama() && !tok_name.empty())) {
    const data::Tokenizer t = data::Tokenizer::load(tok.path);
    if (t.eos_id() >= 0) eos = t.eos_id();
    if (t.bos_id() >= 0) bos = t.bos_id();
  }
  nlohmann::json config_json;
  if (c.llama()) {
    io::HfLlamaConfig h;
    h.qwen2 = c.qkv_bias;
    h.vocab_size = c.vocab_size;
    h.hidden_size = c.d_model;
    h.intermediate_size = static_cast<int>(c.mlp_width());
    h.num_hidden_layers = c.n_layers;
    h.num_attention_heads = c.n_heads;
    h.num_key_value_heads = c.n_kv_heads();
    h.max_position_embeddings = c.max_positions;
    h.rms_norm_eps = c.norm_eps;
    h.rope_theta = c.rope_theta;
    if (c.rope_scaling.type == nn::RopeType::Llama3) {
      const nn::RopeScaling& r = c.rope_scaling;
      h.rope_scaling = io::HfLlama3Scaling{r.factor, r.low_freq_factor, r.high_freq_factor,
                                           r.original_max_position_embeddings};
    }
    h.tie_word_embeddings = c.tie_embeddings;
    h.eos_token_id = eos;
    h.bos_token_id = bos;
    config_json = io::hf_llama_config_json(h);
  } else {
    io::HfGpt2Config h;
    h.vocab_size = c.vocab_size;
    h.n_positions = c.max_positions;
    h.n_embd = c.d_model;
    h.n_layer = c.n_layers;
    h.n_head = c.n_heads;
    h.layer_norm_epsilon = 1e-5;  // nn::kLayerNormEps, as GPT-2 writes it
    h.dropout = c.dropout;
    h.eos_token_id = eos;
    config_json = io::hf_gpt2_config_json(h);
  }

  io::FolderReplacement folder(out_dir);
  try {
    // model.safetensors, tensor by tensor from the checkpoint: one tandem tensor's buffer and one
    // Hugging Face tensor's at a time.
    const std::vector<HfTensor> layout = hf_layout(c);
    std::vector<io::TensorSpec> specs;
    std::map<std::string, std::pair<const HfTensor*, const HfPiece*>> piece_of;
    for (const HfTensor& t : layout)
      for (const HfPiece& p : t.pieces) {
        specs.push_back({p.name, DType::F32, p.shape});
        piece_of[p.name] = {&t, &p};
      }
    io::AtomicFile& weights = folder.open_file(std::string(io::kHfWeightsFile));
    io::SafetensorsWriter writer(weights, specs, {{"format", "pt"}});
    const detail::CheckpointTensors source(reader.weights());
    std::vector<float> buf(static_cast<size_t>(largest_tensor(c)));
    std::vector<float> piece(static_cast<size_t>(largest_piece(layout)));
    const HfTensor* in_buf = nullptr;  // the tandem tensor buf holds
    for (const io::TensorSpec& spec : writer.order()) {
      const auto [t, p] = piece_of.at(spec.name);
      if (in_buf != t) {  // q, k and v's tensor is read once for each of them: they are apart
        source.read("", t->spec, buf.data());
        io::refuse_non_finite(
            {{t->spec.name, Tensor::view_of(buf.data(), DType::F32, t->spec.shape)}},
            reader.folder(), "weights");
        in_buf = t;
      }
      if (is_whole(*t, *p)) {
        writer.append(buf.data(), spec.nbytes());
        continue;
      }
      copy_piece<true>(buf.data(), t->spec.shape, *p, piece.data());
      writer.append(piece.data(), spec.nbytes());
    }
    writer.commit();
    folder.close_file(weights);
    out.files.emplace_back(io::kHfWeightsFile);

    io::AtomicFile& config = folder.open_file(std::string(io::kHfConfigFile));
    config.write(config_json.dump(2) + "\n");
    folder.close_file(config);
    out.files.emplace_back(io::kHfConfigFile);

    if (!tok_name.empty()) {
      io::AtomicFile& t = folder.open_file(tok_name);
      t.write(tok.bytes);
      folder.close_file(t);
      out.files.push_back(tok_name);
    }
    folder.commit();
  } catch (const UserError& e) {
    throw UserError(e.what() + folder.unchanged_note());
  }
  return out;
}

nn::GPTConfig hf_model_config(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    user_error("Hugging Face folder '{}' {}", dir,
               fs::exists(dir, ec) ? "is a file, not a folder" : "does not exist");
  const std::string path = in_folder(dir, io::kHfConfigFile);
  if (!fs::exists(path, ec))
    user_error("Hugging Face folder '{}' has no {} (tandem export --format hf writes one)", dir,
               io::kHfConfigFile);
  const io::HfConfig hf = io::read_hf_config(path);
  nn::GPTConfig c;
  if (const auto* h = std::get_if<io::HfGpt2Config>(&hf)) {
    if (static_cast<float>(h->layer_norm_epsilon) != nn::kLayerNormEps)
      user_error("'{}': 'layer_norm_epsilon' is {}; tandem's LayerNorm uses {}", path,
                 h->layer_norm_epsilon, nn::kLayerNormEps);
    c.vocab_size = h->vocab_size;
    c.n_layers = h->n_layer;
    c.n_heads = h->n_head;
    c.d_model = h->n_embd;
    c.seq_len = h->n_positions;
    c.max_positions = h->n_positions;
    c.dropout = static_cast<float>(h->dropout);
  } else {
    const io::HfLlamaConfig& l = std::get<io::HfLlamaConfig>(hf);
    c.arch = nn::Arch::Llama;
    c.vocab_size = l.vocab_size;
    c.n_layers = l.num_hidden_layers;
    c.n_heads = l.num_attention_heads;
    c.kv_heads = l.num_key_value_heads;
    c.d_model = l.hidden_size;
    c.ffn = l.intermediate_size;
    c.seq_len = l.max_position_embeddings;
    c.max_positions = l.max_position_embeddings;
    c.norm_eps = static_cast<float>(l.rms_norm_eps);
    c.rope_theta = l.rope_theta;
    if (l.rope_scaling) {
      const io::HfLlama3Scaling& r = *l.rope_scaling;
      c.rope_scaling = {nn::RopeType::Llama3, r.factor, r.low_freq_factor, r.high_freq_factor,
                        r.original_max_position_embeddings};
    }
    c.qkv_bias = l.qwen2;
    c.tie_embeddings = l.tie_word_embeddings;
  }
  try {
    c.validate();
    if (c.llama()) nn::rope_inv_freq(c.head_size(), c.rope_theta, c.rope_scaling);
  } catch (const UserError& e) {
    user_error("'{}': {}", path, e.what());
  }
  return c;
}

namespace detail {

std::shared_ptr<const ResumeState> prepare_init(const TrainConfig& cfg) {
  const std::string& dir = cfg.init_from;
  const nn::GPTConfig saved = hf_model_config(dir);
  const nn::GPTConfig& m = cfg.model;
  const std::string config_path = in_folder(dir, io::kHfConfigFile);
  // The block must be the folder's; only the sequence length and dropout are the run's to choose.
  const HfFieldNames f = hf_field_names(saved.arch);
  std::vector<std::string> differ;
  auto same = [&](const char* hf, int have, int want, std::string_view flag) {
    if (have != want)
      differ.push_back(fmt::format("{} {} where this run has {} ({})", hf, have, want, flag));
  };
  same(f.vocab, saved.vocab_size, m.vocab_size,
       cfg.data.empty() ? "the synthetic corpus's bytes"
                        : fmt::format("the vocabulary of --data '{}'", cfg.data));
  for (const HfFieldDifference& d : hf_block_differences(saved, m))
    differ.push_back(fmt::format("{} {} where this run has {} ({})", d.field, d.folder_value,
                                 d.run_value, d.flag));
  same(f.positions, saved.max_positions, m.max_positions, "the model's positions");
  if (!differ.empty())
    user_error("'{}' does not describe this run's model: {}", config_path, fmt::join(differ, "; "));

  auto weights = std::make_shared<const io::HfWeights>(dir, canonical_name(m));
  const std::vector<HfTensor> layout = hf_layout(m);
  const std::string embedding = hf_embedding_name(m);
  std::vector<std::string> names;
  for (const auto& [name, found] : weights->tensors()) {
    if (m.tie_embeddings && name == io::kHfLmHead) {
      const Shape head{m.vocab_size, m.d_model};
      if (!(found.entry->shape == head))
        user_error("tensor '{}' in '{}' has shape {}; this model's tied LM head is {}'s, {}",
                   found.entry->name, found.file->path(), found.entry->shape.str(), embedding,
                   head.str());
      continue;
    }
    if (!is_buffer(m, name)) names.push_back(name);
  }
  check_tensor_names(names, hf_names(layout), m, weights->source(),
                     fmt::format("it is not the model '{}' describes", config_path));
  // The shapes, from the headers: refused before any rank starts.
  for (const HfTensor& t : layout)
    for (const HfPiece& p : t.pieces) {
      const io::SafetensorsEntry& e = *weights->find(p.name)->entry;
      if (!(e.shape == p.shape))
        user_error("tensor '{}' in '{}' has shape {}; the model '{}' describes needs {}", e.name,
                   weights->find(p.name)->file->path(), e.shape.str(), config_path, p.shape.str());
    }

  auto r = std::make_shared<ResumeState>();
  r->meta.model_config = model_config_to_json(m);
  r->meta.step = 0;
  r->folder = dir;
  r->init_weights = weights;
  // The folder's tokenizer, when it has one of the kind the data recorded, must be the data's.
  const std::shared_ptr<const data::Corpus> corpus = corpus_for(cfg);
  std::error_code ec;
  if (!corpus->tokenizer_path.empty()) {
    const std::string mine = in_folder(dir, io::hf_tokenizer_file_name(corpus->tokenizer_path));
    if (!fs::exists(mine, ec)) {
      r->warnings.push_back(fmt::format(
          "Hugging Face folder '{}' holds no tokenizer: the model is taken to read the ids of "
          "'{}' ({})",
          dir, corpus->tokenizer_path, corpus->source));
    } else if (const std::string sha = sha256_hex(io::read_file(mine, "tokenizer"));
               sha != corpus->tokenizer_sha256) {
      user_error(
          "the tokenizer '{}' is not the one --data '{}' was encoded with ('{}'; SHA-256 {} vs "
          "{}): the model's token ids would mean other pieces; encode the text with tandem "
          "tokenize --tokenizer '{}'",
          mine, corpus->source, corpus->tokenizer_path, sha, corpus->tokenizer_sha256, mine);
    }
  }
  return r;
}

void restore_hf_weights(const ResumeState& init, const parallel::ParallelGPT& model) {
  const nn::GPTConfig& c = model.config();
  comm::Communicator& world = model.grid().world();
  const bool reads = world.rank() == 0;
  const io::HfWeights& weights = *init.init_weights;
  const std::vector<HfTensor> layout = hf_layout(c);
  // A stored LM head of a tied model must be its embedding.
  const std::string embedding = hf_embedding_name(c);
  const bool check_head = c.tie_embeddings && weights.find(io::kHfLmHead) != nullptr;
  std::vector<float> buf(static_cast<size_t>(largest_tensor(c)));
  std::vector<float> piece(static_cast<size_t>(largest_piece(layout)));
  parallel::StateStreamer streamer(model, nullptr);
  for (const HfTensor& t : layout) {
    std::string error;
    if (reads) {
      try {
        for (const HfPiece& p : t.pieces) {
          float* into = is_whole(t, p) ? buf.data() : piece.data();
          weights.read(p.name, p.shape, into);
          io::refuse_non_finite({{p.name, Tensor::view_of(into, DType::F32, p.shape)}}, init.folder,
                                "weights");
          if (into != buf.data()) copy_piece<false>(buf.data(), t.spec.shape, p, into);
          if (check_head && p.name == embedding) {
            std::vector<float> lm(static_cast<size_t>(p.shape.numel()));
            weights.read(io::kHfLmHead, p.shape, lm.data());
            if (!std::equal(lm.begin(), lm.end(), into))
              error = fmt::format(
                  "tensor '{}' in '{}' differs from '{}': {}, so an untied head cannot be loaded",
                  weights.find(io::kHfLmHead)->entry->name,
                  weights.find(io::kHfLmHead)->file->path(), embedding,
                  c.llama() ? "the folder's config.json ties the LM head to the embedding "
                              "(tie_word_embeddings true)"
                            : "tandem's GPT-2 ties its LM head to wte");
          }
        }
      } catch (const UserError& e) {
        error = e.what();
      }
    }
    error = comm::broadcast_string(world, error);
    if (!error.empty()) throw comm::CollectiveError(error);  // every rank, together
    streamer.scatter(parallel::StatePart::Weights, t.spec, buf.data());
  }
  streamer.finish();
}

}  // namespace detail
}  // namespace tandem::train
