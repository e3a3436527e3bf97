// Checkpoint folders: RunMeta to and from JSON, the streaming writer (a FolderReplacement of
// safetensors files written tensor by tensor) and reader (every file checked up front, tensors
// read on demand), save and load as thin uses of them, and config compatibility messages.
#include "tandem/io/checkpoint.h"

#include <cmath>
#include <filesystem>
#include <set>

#include "tandem/core/error.h"
#include "tandem/io/checkpoint_series.h"
#include "tandem/io/json_file.h"

namespace tandem::io {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

template <typename... Args>
[[noreturn]] void bad_meta(const std::string& source, fmt::format_string<Args...> f,
                           Args&&... args) {
  user_error("invalid checkpoint metadata '{}': {}", source,
             fmt::format(f, std::forward<Args>(args)...));
}

// The member `key` of object `j` (named `where` in messages, e.g. "'data'"), which must exist.
const json& member(const json& j, const char* key, const std::string& where,
                   const std::string& source) {
  if (!j.is_object()) bad_meta(source, "{} must be a JSON object", where);
  auto it = j.find(key);
  if (it == j.end()) bad_meta(source, "{} has no '{}'", where, key);
  return *it;
}

bool is_non_negative_integer(const json& v) {
  return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
}

int64_t get_count(const json& j, const char* key, const std::string& where,
                  const std::string& source) {
  const json& v = member(j, key, where, source);
  if (!is_non_negative_integer(v) || v.get<uint64_t>() > uint64_t{INT64_MAX})
    bad_meta(source, "'{}' must be a non-negative integer (it is {})", key, json_excerpt(v));
  return v.get<int64_t>();
}

uint64_t get_u64(const json& j, const char* key, const std::string& where,
                 const std::string& source) {
  const json& v = member(j, key, where, source);
  if (!is_non_negative_integer(v))
    bad_meta(source, "'{}' must be a non-negative integer (it is {})", key, json_excerpt(v));
  return v.get<uint64_t>();
}

std::string get_string(const json& j, const char* key, const std::string& where,
                       const std::string& source) {
  const json& v = member(j, key, where, source);
  if (!v.is_string()) bad_meta(source, "'{}' must be a string (it is {})", key, json_excerpt(v));
  return v.get<std::string>();
}

const json& get_object(const json& j, const char* key, const std::string& where,
                       const std::string& source) {
  const json& v = member(j, key, where, source);
  if (!v.is_object())
    bad_meta(source, "'{}' must be a JSON object (it is {})", key, json_excerpt(v));
  return v;
}

// How a config value reads in a sentence: strings bare, absent values as "(unset)".
std::string value_text(const json& v) {
  if (v.is_null()) return "(unset)";
  if (v.is_string()) return v.get<std::string>();
  return json_excerpt(v);
}

// "a", "a and b", "a, b and c".
std::string join_and(const std::vector<std::string>& parts) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += i + 1 == parts.size() ? " and " : ", ";
    out += parts[i];
  }
  return out;
}

std::string in_folder(const std::string& dir, std::string_view file) {
  return (fs::path(dir) / std::string(file)).string();
}

}  // namespace

json run_meta_to_json(const RunMeta& m) {
  return json{
      {"format", "tandem checkpoint"},
      {"format_version", m.format_version},
      {"tandem_version", m.tandem_version},
      {"step", m.step},
      {"model", m.model_config},
      {"data",
       {{"source", m.data_source},
        {"fingerprint", m.data_fingerprint},
        {"position", m.data_position}}},
      {"rng", {{"seed", m.rng_seed}, {"counter", m.rng_counter}}},
      {"optimizer", {{"name", m.optimizer}, {"hyperparameters", m.optimizer_hparams}}},
      {"extra", m.extra},
  };
}

RunMeta run_meta_from_json(const json& j, const std::string& source) {
  if (!j.is_object()) bad_meta(source, "it is not a JSON object");
  // The version first: a newer layout may differ in every other field.
  auto version = j.find("format_version");
  if (version == j.end() || !version->is_number_integer())
    bad_meta(source, "it has no integer 'format_version', so it is not tandem checkpoint metadata");
  const int64_t v = version->get<int64_t>();
  if (v != kCheckpointFormatVersion)
    user_error(
        "checkpoint metadata '{}' has format version {}; this tandem ({}) reads format "
        "version {}{}",
        source, v, kTandemVersion, kCheckpointFormatVersion,
        v > kCheckpointFormatVersion ? " (the checkpoint was written by a newer tandem)" : "");
  const std::string top = "the top level";
  RunMeta m;
  m.format_version = static_cast<int>(v);
  m.tandem_version = get_string(j, "tandem_version", top, source);
  m.step = get_count(j, "step", top, source);
  m.model_config = get_object(j, "model", top, source);
  const json& data = get_object(j, "data", top, source);
  m.data_source = get_string(data, "source", "'data'", source);
  m.data_fingerprint = get_string(data, "fingerprint", "'data'", source);
  m.data_position = get_count(data, "position", "'data'", source);
  const json& rng = get_object(j, "rng", top, source);
  m.rng_seed = get_u64(rng, "seed", "'rng'", source);
  m.rng_counter = get_u64(rng, "counter", "'rng'", source);
  const json& opt = get_object(j, "optimizer", top, source);
  m.optimizer = get_string(opt, "name", "'optimizer'", source);
  m.optimizer_hparams = get_object(opt, "hyperparameters", "'optimizer'", source);
  m.extra = j.contains("extra") ? get_object(j, "extra", top, source) : json::object();
  return m;
}

RunMeta read_run_meta(const std::string& path) {
  // Nesting past kMaxJsonDepth is refused before anything recursive walks it.
  const json j =
      parse_json(read_file(path, "checkpoint file"), fmt::format("checkpoint metadata '{}'", path));
  return run_meta_from_json(j, path);
}

CheckpointWriter::CheckpointWriter(const std::string& dir, const RunMeta& meta,
                                   const std::vector<TensorSpec>& weights,
                                   const std::vector<TensorSpec>& optimizer,
                                   const FolderWriteHooks& hooks)
    : meta_text_(run_meta_to_json(meta).dump(2) + "\n"),
      folder_(std::make_unique<FolderReplacement>(dir, hooks)) {
  noting_unchanged([&] {
    weights_file_ = &folder_->open_file(std::string(kWeightsFile));
    weights_ = std::make_unique<SafetensorsWriter>(*weights_file_, weights,
                                                   SafetensorsMetadata{{"format", "pt"}});
    optimizer_file_ = &folder_->open_file(std::string(kOptimizerFile));
    optimizer_ = std::make_unique<SafetensorsWriter>(*optimizer_file_, optimizer);
  });
}

CheckpointWriter::~CheckpointWriter() = default;

template <typename F>
void CheckpointWriter::noting_unchanged(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    throw UserError(e.what() + folder_->unchanged_note());
  }
}

SafetensorsWriter& CheckpointWriter::writer(CheckpointPart part) const {
  return part == CheckpointPart::Weights ? *weights_ : *optimizer_;
}

const std::vector<TensorSpec>& CheckpointWriter::order(CheckpointPart part) const {
  return writer(part).order();
}

size_t CheckpointWriter::next(CheckpointPart part) const { return writer(part).next(); }

void CheckpointWriter::append(CheckpointPart part, const void* data, size_t bytes) {
  noting_unchanged([&] { writer(part).append(data, bytes); });
}

void CheckpointWriter::append_tensors(CheckpointPart part,
                                      const std::vector<NamedTensor>& tensors) {
  noting_unchanged([&] { writer(part).append_tensors(tensors); });
}

void CheckpointWriter::commit() {
  // meta.json last: not needed for atomicity (the folder swap gives that), but a reader looking
  // inside DIR.tmp-<pid> after a crash finds meta.json only if the tensors are all there.
  noting_unchanged([&] {
    weights_->commit();
    folder_->close_file(*weights_file_);
    optimizer_->commit();
    folder_->close_file(*optimizer_file_);
    AtomicFile& meta = folder_->open_file(std::string(kMetaFile));
    meta.write(meta_text_);
    folder_->close_file(meta);
  });
  folder_->commit();  // its messages say what is unchanged
}

CheckpointReader::CheckpointReader(const std::string& dir, bool with_optimizer) {
  std::error_code ec;
  if (!fs::exists(resolve_folder(dir), ec))
    user_error("checkpoint folder '{}' does not exist", dir);
  // A series' newest step folder, or dir itself; messages name the step folder when it is one.
  const std::string named = resolve_checkpoint(dir);
  folder_ = resolve_folder(named);
  if (!fs::is_directory(folder_, ec)) user_error("checkpoint '{}' is not a folder", named);
  std::vector<std::string> missing;
  for (std::string_view file : {kWeightsFile, kOptimizerFile, kMetaFile})
    if ((with_optimizer || file != kOptimizerFile) &&
        !fs::is_regular_file(in_folder(folder_, file), ec))
      missing.emplace_back(file);
  if (!missing.empty())
    user_error("checkpoint '{}' is incomplete: it has no {}", named, join_and(missing));
  meta_ = read_run_meta(in_folder(folder_, kMetaFile));
  weights_.emplace(in_folder(folder_, kWeightsFile));
  if (with_optimizer) optimizer_.emplace(in_folder(folder_, kOptimizerFile));
}

const SafetensorsReader& CheckpointReader::optimizer() const {
  TANDEM_CHECK(optimizer_.has_value(), "the optimizer state of '{}' was not asked for", folder_);
  return *optimizer_;
}

Checkpoint CheckpointReader::read_all() const {
  Checkpoint ckpt;
  ckpt.meta = meta_;
  ckpt.folder = folder_;
  ckpt.weights = weights_->read_all().tensors;
  if (optimizer_) ckpt.optimizer = optimizer_->read_all().tensors;
  return ckpt;
}

void save_checkpoint(const std::string& dir, const Checkpoint& ckpt,
                     const FolderWriteHooks& hooks) {
  CheckpointWriter out(dir, ckpt.meta, tensor_specs(ckpt.weights), tensor_specs(ckpt.optimizer),
                       hooks);
  out.append_tensors(CheckpointPart::Weights, ckpt.weights);
  out.append_tensors(CheckpointPart::Optimizer, ckpt.optimizer);
  out.commit();
}

Checkpoint load_checkpoint(const std::string& dir, bool with_optimizer) {
  return CheckpointReader(dir, with_optimizer).read_all();
}

std::string non_finite_values(const std::vector<NamedTensor>& tensors) {
  for (const NamedTensor& t : tensors) {
    int64_t nan = 0, inf = 0;
    const int64_t n = t.tensor.numel();
    if (t.tensor.dtype() == DType::F32) {
      const float* p = t.tensor.data_as<float>();
      for (int64_t i = 0; i < n; ++i) {
        nan += std::isnan(p[i]);
        inf += std::isinf(p[i]);
      }
    } else {
      for (int64_t i = 0; i < n; ++i) {
        const float x = t.tensor.get(i);
        nan += std::isnan(x);
        inf += std::isinf(x);
      }
    }
    if (nan + inf > 0)
      return fmt::format("tensor '{}' has {} NaN and {} infinite values of {}", t.name, nan, inf,
                         n);
  }
  return {};
}

void refuse_non_finite(const std::vector<NamedTensor>& tensors, const std::string& where,
                       std::string_view what) {
  const std::string bad = non_finite_values(tensors);
  if (!bad.empty())
    user_error(
        "checkpoint '{}' holds non-finite {}: {}; the model diverged before it was saved, "
        "so use an earlier checkpoint",
        where, what, bad);
}

std::vector<ConfigMismatch> config_mismatches(const json& saved, const json& requested,
                                              const std::vector<std::string>& keys) {
  TANDEM_CHECK(saved.is_object() && requested.is_object(), "configs must be JSON objects");
  std::vector<std::string> compare = keys;
  if (compare.empty()) {
    std::set<std::string> all;
    for (const auto& [k, v] : saved.items()) all.insert(k);
    for (const auto& [k, v] : requested.items()) all.insert(k);
    compare.assign(all.begin(), all.end());
  }
  std::vector<ConfigMismatch> out;
  for (const std::string& k : compare) {
    const json a = saved.contains(k) ? saved[k] : json();
    const json b = requested.contains(k) ? requested[k] : json();
    if (a != b) out.push_back({k, a, b});
  }
  return out;
}

void check_config_compatible(const std::string& checkpoint_dir, const json& saved,
                             const json& requested, const std::vector<std::string>& keys) {
  const auto diffs = config_mismatches(saved, requested, keys);
  if (diffs.empty()) return;
  if (diffs.size() == 1)
    user_error("checkpoint '{}' was trained with {} {}, this run asks for {}", checkpoint_dir,
               diffs[0].key, value_text(diffs[0].saved), value_text(diffs[0].requested));
  std::vector<std::string> was, asks;
  for (const ConfigMismatch& d : diffs) {
    was.push_back(d.key + " " + value_text(d.saved));
    asks.push_back(d.key + " " + value_text(d.requested));
  }
  user_error("checkpoint '{}' was trained with {}, this run asks for {}", checkpoint_dir,
             join_and(was), join_and(asks));
}

}  // namespace tandem::io
