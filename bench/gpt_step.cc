// tandem's single-rank GPT training step (forward + backward) at the size of the PyTorch
// comparison (4 layers, d_model 256, 4 heads, sequence 128, batch 8, vocabulary 256): median
// step time, GFLOP/s against the GEMM peak, and the time per stage through the layer hook.
// Its PyTorch twin is bench/pytorch_gpt_step.py; docs/benchmarks.md has both and the command.
//
// usage: bench_gpt_step [--steps 10] [--dropout 0.0] [--threads 2]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "tandem/core/blas.h"
#include "tandem/nn/gpt.h"
#include "tandem/perf/flops.h"

namespace tandem::nn {
namespace {

using Clock = std::chrono::steady_clock;

// Model FLOPs of one step (perf/flops.h: the blocks' matmuls, attention's full T x T square as
// frameworks count it, the LM head; backward twice the forward).
double step_flops(const GPTConfig& c, int B, int T) {
  return static_cast<double>(B) * T * tandem::perf::step_flops_per_token(c, T);
}

int time_step(float dropout, int steps) {
  GPTConfig c;
  c.n_layers = 4;
  c.n_heads = 4;
  c.d_model = 256;
  c.seq_len = c.max_positions = 128;
  c.dropout = dropout;
  const int B = 8, T = 128;
  ParameterSet params(c), grads(c);
  gpt_init(params, 1);
  GPTActivations acts(c, B, T);
  Workspace ws(c, B, T);
  std::vector<int32_t> tokens(static_cast<size_t>(B) * T), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>((i * 7 + 3) % 256);
    targets[i] = static_cast<int32_t>((i * 7 + 10) % 256);
  }
  const Batch batch{tokens.data(), targets.data(), B, T};

  // Per-stage time through the layer hook.
  std::map<std::string, double> stage_ms;
  Clock::time_point started;
  const LayerHook hook = [&](const LayerEvent& e) {
    if (!e.after) {
      started = Clock::now();
      return;
    }
    const char* stage = e.stage == Stage::Block   ? "blocks"
                        : e.stage == Stage::Final ? "final"
                                                  : "embedding";
    const std::string key = std::string(e.pass == Pass::Forward ? "forward " : "backward ") + stage;
    stage_ms[key] += std::chrono::duration<double, std::milli>(Clock::now() - started).count();
  };

  std::vector<double> ms;
  float first = 0.0f, last = 0.0f;
  for (int s = -1; s < steps; ++s) {  // step -1 warms up
    if (s == 0) stage_ms.clear();
    const StepRng rng{1, static_cast<uint64_t>(s + 1), 0, true};
    const auto t0 = Clock::now();
    grads.zero();
    const float loss = gpt_forward(params, acts, ws, batch, rng, hook);
    gpt_backward(params, grads, acts, ws, batch, rng, 1.0f, hook);
    const auto t1 = Clock::now();
    if (s >= 0) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    if (s == -1) first = loss;
    last = loss;
  }
  // The check before the timing means anything: a finite loss near ln 256 at init.
  if (!(std::fabs(first - 5.545) < 0.1) || !std::isfinite(last)) {
    std::printf("bench_gpt_step: CHECK FAILED: first loss %.4f (want ln 256 = 5.545), last %.4f\n",
                first, last);
    return 1;
  }
  std::sort(ms.begin(), ms.end());
  const double median = ms[ms.size() / 2];
  const double gflops = step_flops(c, B, T) / (median * 1e-3) / 1e9;
  std::printf(
      "GPT step (4 layers, d 256, 4 heads, T 128, B 8, dropout %.1f, BLAS %s x%d): median "
      "%.1f ms (min %.1f, max %.1f) over %d steps, %.1f GFLOP/s (%.1f GFLOP a step)\n",
      dropout, blas::kernel_name().c_str(), blas::num_threads(), median, ms.front(), ms.back(),
      steps, gflops, step_flops(c, B, T) / 1e9);
  for (const auto& [k, v] : stage_ms) std::printf("  %-20s %7.1f ms/step\n", k.c_str(), v / steps);
  std::printf("tandem_step_ms %.2f\n", median);
  return 0;
}

}  // namespace
}  // namespace tandem::nn

int main(int argc, char** argv) {
  CLI::App app{"tandem's single-rank GPT training step (the PyTorch comparison's size)"};
  int steps = 10, threads = 2;
  float dropout = 0.0f;
  app.add_option("--steps", steps, "Timed steps (after one warm-up)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--dropout", dropout, "Dropout probability")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.9));
  app.add_option("--threads", threads, "BLAS threads (and tandem's, which follow them)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  tandem::blas::set_num_threads(threads);
  return tandem::nn::time_step(dropout, steps);
}
