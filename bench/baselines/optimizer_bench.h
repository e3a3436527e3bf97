// The data-parallel optimizer step benchmark, shared by bench/adam_step.cc and bench/lamb_step.cc:
// the PyTorch-DDP-style baseline (all-reduce of the gradient, then one separately compiled
// optimizer loop over the whole tensor on every rank) against tandem's autotuned schedule, both
// checked against each other before timing, with the memory-traffic bound measured alongside.
#pragma once

namespace tandem::bench {

enum class Optimizer { Adam, Lamb };

// The benchmark's main: flags as in harness.h (--sizes 16Mi,64Mi --dtypes f32,bf16 ...).
int optimizer_bench_main(Optimizer which, int argc, char** argv);

}  // namespace tandem::bench
