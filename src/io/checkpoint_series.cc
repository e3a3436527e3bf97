// Step-numbered checkpoint folders with an atomically replaced `latest` pointer: saving one,
// pruning the old ones, and finding the checkpoint a folder names.
#include "tandem/io/checkpoint_series.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <optional>
#include <system_error>
#include <utility>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/io/atomic_file.h"

namespace tandem::io {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kStepPrefix = "step-";
// A step folder being removed is renamed to this first, so that a crash mid-removal never leaves
// a half-deleted folder under a checkpoint's name; the next save clears what is left.
constexpr std::string_view kRemovingPrefix = ".removing-";

// The step of a folder named "step-<digits>", if it is one.
std::optional<int64_t> step_of(std::string_view name) {
  if (name.size() <= kStepPrefix.size() || name.substr(0, kStepPrefix.size()) != kStepPrefix)
    return std::nullopt;
  const std::string_view digits = name.substr(kStepPrefix.size());
  int64_t step = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (ec != std::errc() || end != digits.data() + digits.size() || step < 0) return std::nullopt;
  return step;
}

// The step folders of `dir`, (step, name), in ascending step order.
std::vector<std::pair<int64_t, std::string>> step_folders(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const auto step = step_of(name);
    if (step && e.is_directory(ec)) out.emplace_back(*step, name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string in(const std::string& dir, std::string_view name) {
  return (fs::path(dir) / std::string(name)).string();
}

// Removes the step folders at or below `newest` beyond the `keep` highest, and the remains of
// removals a crash interrupted. Best effort: a folder that cannot be removed stays (a warning is
// not worth failing a run that has just saved).
void prune(const std::string& dir, int64_t newest, int keep) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind(kRemovingPrefix, 0) == 0) fs::remove_all(e.path(), ec);
  std::vector<std::pair<int64_t, std::string>> older;
  for (auto& f : step_folders(dir))
    if (f.first <= newest) older.push_back(std::move(f));
  const size_t drop = older.size() > static_cast<size_t>(keep) ? older.size() - keep : 0;
  for (size_t i = 0; i < drop; ++i) {
    const fs::path from = in(dir, older[i].second);
    const fs::path aside = in(dir, std::string(kRemovingPrefix) + older[i].second);
    fs::rename(from, aside, ec);
    fs::remove_all(ec ? from : aside, ec);
  }
}

}  // namespace

std::string step_folder_name(int64_t step) { return fmt::format("step-{:08d}", step); }

bool is_single_checkpoint(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(in(resolve_folder(dir), kMetaFile), ec);
}

std::string save_in_series(const std::string& dir, const Checkpoint& ckpt, int keep) {
  return save_in_series(
      dir, ckpt.meta, tensor_specs(ckpt.weights), tensor_specs(ckpt.optimizer),
      [&](CheckpointWriter& out) {
        out.append_tensors(CheckpointPart::Weights, ckpt.weights);
        out.append_tensors(CheckpointPart::Optimizer, ckpt.optimizer);
      },
      keep);
}

std::string save_in_series(const std::string& dir, const RunMeta& meta,
                           const std::vector<TensorSpec>& weights,
                           const std::vector<TensorSpec>& optimizer,
                           const std::function<void(CheckpointWriter&)>& append, int keep) {
  TANDEM_CHECK(keep >= 1, "keep {} checkpoints", keep);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) user_error("cannot create checkpoint folder '{}': {}", dir, ec.message());
  const std::string name = step_folder_name(meta.step);
  const std::string folder = in(dir, name);
  CheckpointWriter out(folder, meta, weights, optimizer);
  append(out);
  out.commit();
  write_file_atomic(in(dir, kLatestFile), name + "\n");
  prune(dir, meta.step, keep);
  return folder;
}

std::string resolve_checkpoint(const std::string& dir) {
  if (is_single_checkpoint(dir)) return dir;
  std::error_code ec;
  const std::string latest = in(dir, kLatestFile);
  if (fs::is_regular_file(latest, ec)) {
    std::string name = read_file(latest, "checkpoint pointer");
    while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' '))
      name.pop_back();
    if (!step_of(name))
      user_error("checkpoint pointer '{}' does not name a step folder (it holds '{}')", latest,
                 name.substr(0, 80));
    const std::string folder = in(dir, name);
    if (!fs::exists(resolve_folder(folder), ec))
      user_error("checkpoint pointer '{}' names '{}', which does not exist", latest, name);
    return folder;
  }
  const auto steps = step_folders(dir);
  return steps.empty() ? dir : in(dir, steps.back().second);
}

}  // namespace tandem::io
