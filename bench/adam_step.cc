// Data-parallel AdamW step, 2 ranks: the PyTorch DDP + fused-optimizer baseline (all-reduce, then
// one vectorised AdamW loop) against tandem's autotuned schedule; see docs/benchmarks.md.
#include "baselines/optimizer_bench.h"

int main(int argc, char** argv) {
  return tandem::bench::optimizer_bench_main(tandem::bench::Optimizer::Adam, argc, argv);
}
