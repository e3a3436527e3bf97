// Checkpoints: a folder holding the weights (safetensors, GPT-2 tensor names), the optimizer state
// (safetensors) and the run metadata (meta.json: model config, step, data position, RNG state,
// optimizer and its hyper-parameters, versions), written so that a crash leaves either the old
// checkpoint or the new one, whole, and read back with every part checked.
//
//   DIR/weights.safetensors     model weights, metadata {"format": "pt"} so PyTorch loaders agree
//   DIR/optimizer.safetensors   optimizer state (moments, ...), named by the optimizer
//   DIR/meta.json               RunMeta, as JSON
//
// Saving replaces DIR as a whole with replace_folder_atomic (atomic_file.h): the files are
// written into DIR.tmp-<pid>, fsync'd, and swapped into place in one rename, so no reader ever
// sees a mix of two steps' files. Loading goes through resolve_folder, which also finds the
// previous checkpoint if a save on a filesystem without an atomic swap died between its renames.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/io/atomic_file.h"
#include "tandem/io/safetensors.h"

namespace tandem::io {

// The version of the checkpoint layout; a reader refuses versions it does not know.
inline constexpr int kCheckpointFormatVersion = 1;
// tandem's version, recorded in every checkpoint (project(VERSION) in CMakeLists.txt).
inline constexpr std::string_view kTandemVersion = "0.1.0";

inline constexpr std::string_view kWeightsFile = "weights.safetensors";
inline constexpr std::string_view kOptimizerFile = "optimizer.safetensors";
inline constexpr std::string_view kMetaFile = "meta.json";

// Everything besides tensors that a resumed run needs to continue exactly where it stopped.
struct RunMeta {
  int format_version = kCheckpointFormatVersion;
  std::string tandem_version = std::string(kTandemVersion);
  nlohmann::json model_config = nlohmann::json::object();  // {"d_model": 256, "layers": 4, ...}
  int64_t step = 0;                                        // optimizer steps taken
  // The data: where it came from, its fingerprint (Corpus::fingerprint_hex) and the next sampler
  // step to draw (with a counter-based sampler, the batches already consumed).
  std::string data_source;
  std::string data_fingerprint;
  int64_t data_position = 0;
  // Counter-based RNG state: the seed and how many counters (e.g. dropout steps) were consumed.
  uint64_t rng_seed = 0;
  uint64_t rng_counter = 0;
  std::string optimizer;                                        // "adamw", "lamb"
  nlohmann::json optimizer_hparams = nlohmann::json::object();  // {"lr": 3e-4, "beta1": 0.9, ...}
  nlohmann::json extra = nlohmann::json::object();              // anything else the trainer keeps

  bool operator==(const RunMeta&) const = default;
};

nlohmann::json run_meta_to_json(const RunMeta& meta);
// `source` names the file in errors. A missing or ill-typed field, or an unknown format version,
// is a UserError.
RunMeta run_meta_from_json(const nlohmann::json& j, const std::string& source);

struct Checkpoint {
  RunMeta meta;
  std::vector<NamedTensor> weights;
  std::vector<NamedTensor> optimizer;
  std::string folder;  // where load_checkpoint read it (a series' step folder); unused by saves
};

// Writes `ckpt` to folder `dir`, replacing any checkpoint there atomically. `hooks` are for
// fault-injection tests.
void save_checkpoint(const std::string& dir, const Checkpoint& ckpt,
                     const FolderWriteHooks& hooks = {});

// Reads the checkpoint `dir` names: `dir` itself, or the newest of a series of step folders
// (checkpoint_series.h: resolve_checkpoint). The folder must exist and hold all three files,
// meta.json must be valid with a known format version, both safetensors files must be sound.
// Each problem is one UserError naming the checkpoint and what is wrong. `with_optimizer = false`
// skips the optimizer state (eval, sample): its file may be absent (a
// checkpoint copied without it, to evaluate or share the weights).
Checkpoint load_checkpoint(const std::string& dir, bool with_optimizer = true);

// The first tensor holding NaN or infinite values, described: "tensor 'wte' has 12 NaN and 0
// infinite values of 16384"; empty when every value is finite.
std::string non_finite_values(const std::vector<NamedTensor>& tensors);

// Refuses tensors holding NaN or infinite values, a model that diverged before it was saved:
// "checkpoint 'ck/step-00000040' holds non-finite weights: tensor 'wte' has ...". `where` names
// the checkpoint; `what` says what the tensors are ("weights").
void refuse_non_finite(const std::vector<NamedTensor>& tensors, const std::string& where,
                       std::string_view what);

// The differences between the config a checkpoint was trained with and the one a run asks for,
// over `keys` (all keys of both when empty), one "d_model 256 vs 128"-style entry per key.
struct ConfigMismatch {
  std::string key;
  nlohmann::json saved;      // null when the checkpoint has no such key
  nlohmann::json requested;  // null when the run does not set it
};
std::vector<ConfigMismatch> config_mismatches(const nlohmann::json& saved,
                                              const nlohmann::json& requested,
                                              const std::vector<std::string>& keys = {});

// Throws a UserError when the configs differ on `keys`: "checkpoint 'ckpt' was trained with
// d_model 256, this run asks for 128" (several keys: "... with d_model 256 and layers 4, this run
// asks for d_model 128 and layers 2").
void check_config_compatible(const std::string& checkpoint_dir, const nlohmann::json& saved,
                             const nlohmann::json& requested,
                             const std::vector<std::string>& keys = {});

}  // namespace tandem::io
