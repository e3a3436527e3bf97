// Helpers shared by the train/ tests: a tiny run's config, two runs compared bit for bit or by how
// far apart their weights moved, and the shared helpers (scratch folders, files, the UserError a
// call must raise) under short names.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "support/files.h"
#include "support/scratch.h"
#include "tandem/core/error.h"
#include "tandem/io/checkpoint.h"
#include "tandem/io/checkpoint_series.h"
#include "tandem/train/hf_folder.h"
#include "tandem/train/trainer.h"

namespace tandem::train::testing {

using tandem::testing::FileSizeLimit;
using tandem::testing::read_bytes;
using tandem::testing::ScratchDir;
using tandem::testing::user_error_of;
using tandem::testing::write_bytes;

// A model small enough that a step takes milliseconds on one core, trained on the synthetic
// corpus by one in-process rank, printing nothing.
inline TrainConfig tiny_run(int64_t steps) {
  TrainConfig c;
  c.model.n_layers = 2;
  c.model.n_heads = 2;
  c.model.d_model = 16;
  c.model.seq_len = 16;
  c.model.max_positions = 16;
  c.batch = 4;
  c.steps = steps;
  c.lr = 1e-2;
  c.warmup = 2;
  c.grid = {1, 1, 1};
  c.synthetic_bytes = 1 << 14;
  c.eval_every = 0;
  c.progress = false;
  c.blas_threads = 1;
  c.executor = exec::RunnerKind::Plan;  // no JIT compile: these runs are about files, not speed
  static std::ostringstream sink;       // the summary lines, unread
  c.out = &sink;
  return c;
}

// ||a - b|| / ||b - w0||: the difference of two runs' weights relative to how far training moved
// them, so that the bound means the same whatever the learning rate.
inline double relative_update_difference(const std::vector<float>& a, const std::vector<float>& b,
                                         const std::vector<float>& w0) {
  double diff = 0, moved = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += std::pow(static_cast<double>(a[i]) - b[i], 2);
    moved += std::pow(static_cast<double>(b[i]) - w0[i], 2);
  }
  return std::sqrt(diff / moved);
}

// The weights a run of config c starts from.
inline std::vector<float> initial_weights(const TrainConfig& c) {
  TrainConfig z = c;
  z.steps = 0;
  return train(z).weights;
}

// Two runs' final weights (keep_weights) and losses, equal bit for bit.
inline void expect_bitwise(const TrainResult& a, const TrainResult& b, const std::string& what) {
  ASSERT_EQ(a.weights.size(), b.weights.size()) << what;
  size_t differ = 0;
  for (size_t i = 0; i < a.weights.size(); ++i) differ += a.weights[i] != b.weights[i];
  EXPECT_EQ(differ, 0u) << what << ": weights differ in " << differ << " of " << a.weights.size();
  EXPECT_EQ(a.losses, b.losses) << what;
}

// A run trained and exported as a Hugging Face folder (tandem export --format hf).
struct HfExport {
  TrainConfig config;
  std::string checkpoint;  // the step folder
  std::string folder;      // the export
};
inline HfExport train_and_export(const ScratchDir& dir, TrainConfig config) {
  HfExport e;
  e.config = std::move(config);
  e.config.save_dir = dir.path("ckpt");
  train(e.config);
  e.checkpoint = io::resolve_checkpoint(e.config.save_dir);
  e.folder = dir.path("hf");
  export_hf(e.config.save_dir, e.folder);
  return e;
}

// A checkpoint's weights as one flat vector in the model's order (TrainResult::weights').
inline std::vector<float> checkpoint_weights(const std::string& folder, const nn::GPTConfig& c) {
  const io::Checkpoint ck = io::load_checkpoint(folder, false);
  std::vector<float> flat;
  for (const nn::ParamSpec& s : nn::gpt_parameter_specs(c)) {
    const Tensor* t = nullptr;
    for (const io::NamedTensor& n : ck.weights)
      if (n.name == s.name) t = &n.tensor;
    EXPECT_NE(t, nullptr) << s.name;
    if (t == nullptr) return {};
    const float* p = t->data_as<float>();
    flat.insert(flat.end(), p, p + t->numel());
  }
  return flat;
}

}  // namespace tandem::train::testing
