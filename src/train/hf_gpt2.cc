// A checkpoint exported as a Hugging Face GPT-2 folder, and a run started from such a folder: its
// config read and checked against the run's, its weights scattered to the ranks.
#include "tandem/train/hf_gpt2.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>

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
#include "tandem/io/hf_gpt2.h"
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

}  // namespace

HfExport export_hf_gpt2(const std::string& checkpoint, const std::string& out_dir,
                        const std::string& tokenizer) {
  const io::CheckpointReader reader(checkpoint, false);
  HfExport out;
  out.checkpoint = reader.folder();
  out.step = reader.meta().step;
  out.config = model_config_from_json(reader.meta().model_config,
                                      fmt::format("checkpoint '{}'", reader.folder()));
  const nn::GPTConfig& c = out.config;
  if (c.llama())
    user_error(
        "checkpoint '{}' holds a Llama model; --format hf writes GPT-2 folders only so far (a "
        "Llama folder's export is not implemented yet)",
        reader.folder());
  std::vector<std::string> names;
  for (const io::SafetensorsEntry& e : reader.weights().tensors()) names.push_back(e.name);
  detail::check_tensor_names(names, c, {""}, reader.weights().path());
  const TokenizerFile tok = checkpoint_tokenizer(reader.meta(), reader.folder(), tokenizer);
  check_export_folder(out_dir);

  io::HfGpt2Config h;
  h.vocab_size = c.vocab_size;
  h.n_positions = c.max_positions;
  h.n_embd = c.d_model;
  h.n_layer = c.n_layers;
  h.n_head = c.n_heads;
  h.layer_norm_epsilon = 1e-5;  // nn::kLayerNormEps, as GPT-2 writes it
  h.dropout = c.dropout;
  const std::string tok_name = tok.path.empty() ? "" : io::hf_tokenizer_file_name(tok.path);
  if (tok_name == "tokenizer.model") {
    const int eos = data::Tokenizer::load(tok.path).eos_id();
    if (eos >= 0) h.eos_token_id = eos;
  }

  io::FolderReplacement folder(out_dir);
  try {
    // model.safetensors, tensor by tensor from the checkpoint: one tensor's buffer at a time.
    std::vector<io::TensorSpec> specs;
    std::map<std::string, const nn::ParamSpec*> param_of;
    const std::vector<nn::ParamSpec> params = nn::gpt_parameter_specs(c);
    for (const nn::ParamSpec& s : params) {
      specs.push_back({io::hf_gpt2_name(s.name), DType::F32, s.shape});
      param_of[specs.back().name] = &s;
    }
    io::AtomicFile& weights = folder.open_file(std::string(io::kHfWeightsFile));
    io::SafetensorsWriter writer(weights, specs, {{"format", "pt"}});
    const detail::CheckpointTensors source(reader.weights());
    std::vector<float> buf(static_cast<size_t>(largest_tensor(c)));
    for (const io::TensorSpec& t : writer.order()) {
      const nn::ParamSpec& s = *param_of.at(t.name);
      source.read("", s, buf.data());
      io::refuse_non_finite({{s.name, Tensor::view_of(buf.data(), DType::F32, s.shape)}},
                            reader.folder(), "weights");
      writer.append(buf.data(), t.nbytes());
    }
    writer.commit();
    folder.close_file(weights);
    out.files.emplace_back(io::kHfWeightsFile);

    io::AtomicFile& config = folder.open_file(std::string(io::kHfConfigFile));
    config.write(io::hf_gpt2_config_json(h).dump(2) + "\n");
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
  const io::HfGpt2Config h = io::read_hf_gpt2_config(path);
  if (static_cast<float>(h.layer_norm_epsilon) != nn::kLayerNormEps)
    user_error("'{}': 'layer_norm_epsilon' is {}; tandem's LayerNorm uses {}", path,
               h.layer_norm_epsilon, nn::kLayerNormEps);
  nn::GPTConfig c;
  c.vocab_size = h.vocab_size;
  c.n_layers = h.n_layer;
  c.n_heads = h.n_head;
  c.d_model = h.n_embd;
  c.seq_len = h.n_positions;
  c.max_positions = h.n_positions;
  c.dropout = static_cast<float>(h.dropout);
  try {
    c.validate();
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
  // The sizes must be the folder's; only the sequence length and dropout are the run's to choose.
  std::vector<std::string> differ;
  auto same = [&](const char* hf, int have, int want, std::string_view flag) {
    if (have != want)
      differ.push_back(fmt::format("{} {} where this run has {} ({})", hf, have, want, flag));
  };
  same("vocab_size", saved.vocab_size, m.vocab_size,
       cfg.data.empty() ? "the synthetic corpus's bytes"
                        : fmt::format("the vocabulary of --data '{}'", cfg.data));
  same("n_layer", saved.n_layers, m.n_layers, "--layers");
  same("n_head", saved.n_heads, m.n_heads, "--heads");
  same("n_embd", saved.d_model, m.d_model, "--d-model");
  same("n_positions", saved.max_positions, m.max_positions, "the model's positions");
  if (!differ.empty())
    user_error("'{}' does not describe this run's model: {}", config_path, fmt::join(differ, "; "));

  const std::string weights_path = in_folder(dir, io::kHfWeightsFile);
  std::error_code ec;
  if (!fs::exists(weights_path, ec))
    user_error(
        "Hugging Face folder '{}' has no {} (tandem export --format hf writes one; save a "
        "transformers model with save_pretrained(..., safe_serialization=True))",
        dir, io::kHfWeightsFile);
  auto weights = std::make_shared<const io::SafetensorsReader>(weights_path);
  std::vector<std::string> names;
  std::map<std::string, const io::SafetensorsEntry*> entry;  // by canonical name
  for (const io::SafetensorsEntry& e : weights->tensors()) {
    const std::string name = io::hf_gpt2_canonical_name(e.name);
    entry[name] = &e;
    if (name == io::kHfLmHead) {
      const Shape head{m.vocab_size, m.d_model};
      if (!(e.shape == head))
        user_error("tensor '{}' in '{}' has shape {}; this model's tied LM head is wte's, {}",
                   e.name, weights_path, e.shape.str(), head.str());
      continue;
    }
    if (!io::hf_gpt2_is_buffer(name)) names.push_back(name);
  }
  check_tensor_names(names, m, {std::string(io::kHfPrefix)}, weights_path,
                     fmt::format("it is not the model '{}' describes", config_path));
  // The shapes, from the header: refused before any rank starts.
  for (const nn::ParamSpec& spec : nn::gpt_parameter_specs(m)) {
    const auto it = entry.find(io::hf_gpt2_name(spec.name));
    if (it == entry.end()) continue;  // named "transformer.wte": restore_hf_weights says so
    const io::SafetensorsEntry& e = *it->second;
    if (!(e.shape == spec.shape))
      user_error("tensor '{}' in '{}' has shape {}; the model '{}' describes needs {}", e.name,
                 weights_path, e.shape.str(), config_path, spec.shape.str());
  }

  auto r = std::make_shared<ResumeState>();
  r->meta.model_config = model_config_to_json(m);
  r->meta.step = 0;
  r->folder = dir;
  r->init_weights = weights;
  // The folder's tokenizer, when it has one of the kind the data recorded, must be the data's.
  const std::shared_ptr<const data::Corpus> corpus = corpus_for(cfg);
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
  std::optional<CheckpointTensors> weights;
  // A stored LM head must be wte: tandem's head is tied.
  const io::SafetensorsEntry* head = nullptr;
  if (reads) {
    weights.emplace(*init.init_weights, io::hf_gpt2_canonical_name);
    for (const io::SafetensorsEntry& e : init.init_weights->tensors())
      if (io::hf_gpt2_canonical_name(e.name) == io::kHfLmHead) head = &e;
  }
  std::vector<float> buf(static_cast<size_t>(largest_tensor(c)));
  parallel::StateStreamer streamer(model, nullptr);
  for (const nn::ParamSpec& spec : nn::gpt_parameter_specs(c)) {
    std::string error;
    if (reads) {
      const std::string prefix(io::kHfPrefix);
      try {
        weights->read(prefix, spec, buf.data());
        io::refuse_non_finite(
            {{prefix + spec.name, Tensor::view_of(buf.data(), DType::F32, spec.shape)}},
            init.folder, "weights");
        if (head != nullptr && spec.name == "wte.weight") {
          const nn::ParamSpec as_head{std::string(io::kHfLmHead), spec.shape, 0};
          std::vector<float> lm(static_cast<size_t>(spec.numel()));
          CheckpointTensors(*init.init_weights, io::hf_gpt2_canonical_name)
              .read("", as_head, lm.data());
          if (!std::equal(lm.begin(), lm.end(), buf.begin()))
            error = fmt::format(
                "tensor '{}' in '{}' differs from '{}wte.weight': tandem's GPT-2 ties its LM "
                "head to wte, so an untied head cannot be loaded",
                head->name, init.init_weights->path(), prefix);
        }
      } catch (const UserError& e) {
        error = e.what();
      }
    }
    error = comm::broadcast_string(world, error);
    if (!error.empty()) throw comm::CollectiveError(error);  // every rank, together
    streamer.scatter(parallel::StatePart::Weights, spec, buf.data());
  }
  streamer.finish();
}

}  // namespace detail
}  // namespace tandem::train
