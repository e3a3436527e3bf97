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
//
// CheckpointWriter and CheckpointReader do this tensor by tensor, so that a model larger than
// memory is saved and resumed without a whole-model copy; save_checkpoint and load_checkpoint are
// thin uses of them. The safetensors files carry per-tensor checksums (safetensors.h), verified
// whenever a tensor is read whole.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/io/atomic_file.h"
#include "tandem/io/safetensors.h"
#include "tandem/io/safetensors_stream.h"

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
  // The data: where it came from, its fingerprint (data::Corpus::fingerprint_hex) and the next
  // sampler step to draw (with a counter-based sampler, the batches already consumed).
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
// Reads and validates the meta.json at `path`.
RunMeta read_run_meta(const std::string& path);

struct Checkpoint {
  RunMeta meta;
  std::vector<NamedTensor> weights;
  std::vector<NamedTensor> optimizer;
  std::string folder;  // where load_checkpoint read it (a series' step folder); unused by saves
};

// The two tensor files of a checkpoint.
enum class CheckpointPart { Weights, Optimizer };

// Writes a checkpoint into DIR.tmp-<pid> and swaps it in as DIR at commit(), as save_checkpoint
// does (replace_folder_atomic: a crash or an error at any point leaves DIR's old checkpoint whole).
// The tensors of each part are appended in that part's order(), in pieces if need be; the two
// parts may be interleaved. Destroyed without commit(), it leaves DIR as it was.
//
//   CheckpointWriter w(dir, meta, weight_specs, optimizer_specs);
//   for (const TensorSpec& t : w.order(CheckpointPart::Weights))
//     w.append(CheckpointPart::Weights, bytes_of(t), t.nbytes());
//   ... the same for CheckpointPart::Optimizer ...
//   w.commit();
//
// A write failure is a UserError naming the file, ending "; the previous contents of 'DIR' are
// unchanged" when DIR existed. Misuse (bytes beyond the declared tensors, a commit before every
// byte is in) is an internal error.
class CheckpointWriter {
 public:
  CheckpointWriter(const std::string& dir, const RunMeta& meta,
                   const std::vector<TensorSpec>& weights, const std::vector<TensorSpec>& optimizer,
                   const FolderWriteHooks& hooks = {});
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // The part's tensors in the order their bytes must be appended (SafetensorsWriter::order), and
  // the index in it of the tensor the next append continues (its size once all are in).
  const std::vector<TensorSpec>& order(CheckpointPart part) const;
  size_t next(CheckpointPart part) const;

  void append(CheckpointPart part, const void* data, size_t bytes);
  // Appends every tensor of the part not yet begun, taken by name from `tensors`
  // (SafetensorsWriter::append_tensors): for a part held whole in memory.
  void append_tensors(CheckpointPart part, const std::vector<NamedTensor>& tensors);
  // Completes both files, writes meta.json, swaps the folder in.
  void commit();

 private:
  SafetensorsWriter& writer(CheckpointPart part) const;
  // Runs `f`; a UserError gets the folder's "previous contents are unchanged" note.
  template <typename F>
  void noting_unchanged(F&& f);

  std::string meta_text_;
  std::unique_ptr<FolderReplacement> folder_;
  AtomicFile* weights_file_ = nullptr;
  AtomicFile* optimizer_file_ = nullptr;
  std::unique_ptr<SafetensorsWriter> weights_, optimizer_;
};

// Reads the checkpoint `dir` names, as load_checkpoint does: `dir` itself or the newest of a
// series (resolve_checkpoint), or the previous checkpoint an interrupted save left aside
// (resolve_folder). The constructor checks everything but the tensors' data: the folder and its
// files, meta.json, both safetensors headers; each problem is one UserError naming the checkpoint
// (or the file) and what is wrong. `with_optimizer = false` skips the optimizer state, whose file
// may then be absent. Tensors are read through weights() and optimizer(), whole with their
// checksums verified, or by byte range.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& dir, bool with_optimizer = true);

  const RunMeta& meta() const { return meta_; }
  // The folder read (a series' step folder, or a folder left aside by an interrupted save).
  const std::string& folder() const { return folder_; }
  const SafetensorsReader& weights() const { return *weights_; }
  // Only with `with_optimizer`.
  const SafetensorsReader& optimizer() const;

  // Everything, read into memory (load_checkpoint).
  Checkpoint read_all() const;

 private:
  std::string folder_;
  RunMeta meta_;
  std::optional<SafetensorsReader> weights_, optimizer_;
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
