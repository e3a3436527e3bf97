// Data-parallel LAMB step, 2 ranks: all-reduce then a two-pass LAMB loop (apex FusedLAMB's shape)
// against tandem's autotuned schedule; see docs/benchmarks.md.
#include "baselines/optimizer_bench.h"

int main(int argc, char** argv) {
  return tandem::bench::optimizer_bench_main(tandem::bench::Optimizer::Lamb, argc, argv);
}
