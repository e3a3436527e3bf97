// Helpers shared by the parallel test suites: small GPT configs, whole-model reference runs
// through nn, and gathering every rank's shard back into whole-model buffers.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "tandem/core/rng.h"
#include "tandem/nn/gpt.h"

namespace tandem::parallel::testing {

// A GPT small enough for ASan runs, with heads and layers that split over tp = 2 and pp = 2.
inline nn::GPTConfig tiny_config(int layers = 2, int heads = 2, int d_model = 16, int T = 8) {
  nn::GPTConfig c;
  c.n_layers = layers;
  c.n_heads = heads;
  c.d_model = d_model;
  c.seq_len = T;
  c.max_positions = T;
  return c;
}

// Deterministic tokens in [0, V).
inline std::vector<int32_t> tokens(size_t n, uint64_t seed, int V = 256) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i)
    t[i] = static_cast<int32_t>(random_bits(seed, i) % static_cast<uint32_t>(V));
  return t;
}

// |got - want| <= atol + rtol * max|want|, elementwise; reports the worst and first failures.
inline ::testing::AssertionResult close(const std::string& label, const std::vector<float>& got,
                                        const std::vector<float>& want, double rtol,
                                        double atol = 0.0) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure()
           << label << ": size " << got.size() << " vs " << want.size();
  double scale = 0.0;
  for (float w : want) scale = std::max(scale, std::fabs(static_cast<double>(w)));
  const double tol = atol + rtol * scale;
  size_t bad = 0, worst_i = 0;
  double worst = 0.0;
  std::ostringstream first;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
    if (!(d <= tol)) {
      if (bad < 5) first << "\n  [" << i << "] got " << got[i] << " want " << want[i];
      ++bad;
    }
    if (d > worst || std::isnan(d)) {
      worst = d;
      worst_i = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << label << ": " << bad << " of " << got.size() << " differ by more than " << tol
         << "; worst " << worst << " at [" << worst_i << "]" << first.str();
}

// One step of the whole model on one rank (GPT-2's initialisation, seed 7), the loss and every
// gradient in the whole model's layout: what the parallel runs are compared against.
struct StepResult {
  double loss = 0.0;
  std::vector<float> grads;  // whole-model layout
};

inline StepResult whole_model_step(const nn::GPTConfig& c, const std::vector<int32_t>& in,
                                   const std::vector<int32_t>& tg, int B, uint64_t seed,
                                   uint64_t step) {
  nn::ParameterSet p(c), g(c);
  nn::gpt_init(p, 7);
  nn::GPTActivations acts(c, B, c.seq_len);
  nn::Workspace ws(c, B, c.seq_len);
  const nn::Batch b{in.data(), tg.data(), B, c.seq_len};
  const nn::StepRng rng{seed, step, 0, true};
  StepResult r;
  r.loss = nn::gpt_forward(p, acts, ws, b, rng);
  nn::gpt_backward(p, g, acts, ws, b, rng);
  const float* gd = g.flat().data_as<float>();
  r.grads.assign(gd, gd + g.size());
  return r;
}

}  // namespace tandem::parallel::testing
