// A run's checkpoints kept side by side, the newest N of them, so that a late failure or a
// divergence never costs the last good one:
//
//   DIR/step-00000100/   a checkpoint (checkpoint.h: weights, optimizer state, meta.json)
//   DIR/step-00000200/
//   DIR/latest           "step-00000200\n": the newest complete checkpoint, replaced atomically
//
// A save writes its step folder (atomically, replace_folder_atomic), then points `latest` at it
// (write_file_atomic), then removes the older step folders beyond the newest N. A crash at any
// point leaves `latest` naming a complete checkpoint. This is DeepSpeed's layout (a `latest` file
// naming the tag), with the step as the tag.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/io/checkpoint.h"

namespace tandem::io {

inline constexpr std::string_view kLatestFile = "latest";

// "step-00000100": zero-padded so that a listing sorts by step.
std::string step_folder_name(int64_t step);

// Writes `ckpt` as DIR/step-<ckpt.meta.step>, points DIR/latest at it, then keeps the newest
// `keep` step folders at or below that step (folders of later steps, left by a run this one went
// back from, are not touched). Returns the folder written. Failures are UserErrors that leave
// `latest` and the checkpoints it names as they were.
std::string save_in_series(const std::string& dir, const Checkpoint& ckpt, int keep);
// The same, streamed: `append` appends every tensor of both parts to the writer it is given
// (CheckpointWriter); the commit, `latest` and the pruning are done here.
std::string save_in_series(const std::string& dir, const RunMeta& meta,
                           const std::vector<TensorSpec>& weights,
                           const std::vector<TensorSpec>& optimizer,
                           const std::function<void(CheckpointWriter&)>& append, int keep);

// The folder of the one checkpoint `dir` names: `dir` itself when it is a checkpoint (it holds
// meta.json, or is one left aside by an interrupted save: resolve_folder), else the step folder
// its `latest` file names, else its highest step folder; else `dir` unchanged, for the caller to
// report what is missing. A `latest` that names no folder of `dir` is a UserError.
std::string resolve_checkpoint(const std::string& dir);

// Whether `dir` holds a checkpoint's files directly (meta.json): a single checkpoint, not a series.
bool is_single_checkpoint(const std::string& dir);

}  // namespace tandem::io
