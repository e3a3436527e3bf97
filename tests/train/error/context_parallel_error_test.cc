// --cp: a sequence it does not cut into 2 cp equal chunks, a grid past the thread backend's ranks,
// and what context parallelism does not run yet (dropout, the unfused kernel, out-of-core
// activations, the plan across grids), each one clear line naming the flags.
#include <gtest/gtest.h>

#include "support/cli.h"

namespace tandem::train {
namespace context_parallel_error_test {

using tandem::testing::run_tandem;

struct Case {
  const char* args;
  const char* error;
};

TEST(ContextParallelFlags, EachMistakeIsOneClearError) {
  // A small run: only the flags at fault differ.
  const std::string base = "train --model tiny --steps 1 --eval-every 0 --tp 1";
  const Case cases[] = {
      {" --cp 3 --dp 1 --seq-len 16",
       "--cp 3 cuts each sequence into 6 equal chunks (two a rank, balanced for the causal mask), "
       "which --seq-len 16 does not divide into: give a --seq-len that is a multiple of 6"},
      {" --cp 0 --dp 1 --seq-len 16", "--cp 0 must be at least 1"},
      {" --cp 2 --dropout 0.1 --dp 1 --seq-len 16",
       "--cp 2 does not support --dropout yet (got 0.1): the residual and embedding masks would "
       "be drawn by a rank's token index, not the sequence's; give --dropout 0"},
      {" --cp 2 --attention unfused --dp 1 --seq-len 16",
       "--cp 2 runs the fused attention kernel; leave out --attention unfused"},
      {" --cp 2 --memory-budget 1GiB --dp 1 --seq-len 16",
       "--cp 2 with --memory-budget 1GiB: out-of-core training would recompute attention, whose "
       "context-parallel exchanges are collectives; not supported yet"},
      {" --cp 64 --dp 16 --batch 16 --seq-len 128",
       "--dp 16 x --tp 1 x --pp 1 x --cp 64 is 1024 ranks; the thread backend runs at most 256, "
       "each a thread of this process: use --backend mpi under mpirun for more"},
  };
  for (const Case& c : cases) {
    const auto r = run_tandem(base + c.args);
    EXPECT_EQ(r.status, 1) << c.args;
    EXPECT_EQ(r.output, fmt::format("tandem: error: {}\n", c.error)) << c.args;
  }
  // The plan across grids chooses cp itself.
  const auto r = run_tandem("train --model tiny --grid auto --ranks 4 --cp 2");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output,
            "tandem: error: --grid auto plans across grids and chooses --cp: leave it out\n");
}

}  // namespace context_parallel_error_test
}  // namespace tandem::train
