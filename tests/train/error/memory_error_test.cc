// A run whose parameters, gradients, optimizer state and activations need more than the machine
// has is refused before it allocates, with the estimate, the memory available and what to change;
// the estimate is printed among the start-up lines.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "support/cli.h"
#include "tandem/core/bytes.h"
#include "tandem/parallel/context_parallel.h"
#include "tandem/train/memory_estimate.h"
#include "train/test_util.h"

namespace tandem::train {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using testing::user_error_of;

uint64_t mem_available() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  uint64_t kib = 0;
  while (f >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

// TANDEM_MEMORY_LIMIT set while alive (unset before and after).
struct StatedLimit {
  explicit StatedLimit(const std::string& v) { ::setenv("TANDEM_MEMORY_LIMIT", v.c_str(), 1); }
  ~StatedLimit() { ::unsetenv("TANDEM_MEMORY_LIMIT"); }
};

// d_model 1024: a block is 12.6M parameters, 16 bytes each with gradients and Adam's moments;
// enough blocks that those alone pass this machine's MemAvailable. Refused in seconds, before
// anything is allocated (the address-space limit turns an allocation into a quick failure
// should the check ever miss, rather than a machine out of memory).
TEST(MemoryCheck, AModelBeyondMemAvailableIsRefusedBeforeItAllocates) {
  const uint64_t avail = mem_available();
  ASSERT_GT(avail, 0u);
  const uint64_t per_block = (12ull * 1024 * 1024 + 13 * 1024) * 16;
  const uint64_t layers = avail / per_block + 4;
  const auto begin = std::chrono::steady_clock::now();
  const auto r = tandem::testing::run_command(fmt::format(
      "ulimit -v 4000000; env -u TANDEM_MEMORY_LIMIT timeout 120 '{}' train --d-model 1024 "
      "--heads 8 --layers {} --dp 1 --tp 1 --steps 1 --executor plan",
      tandem::testing::tandem_binary(), layers));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_LT(seconds, 20.0);
  EXPECT_THAT(
      r.output,
      MatchesRegex(
          "tandem: error: this run needs about [0-9.]+ [GT]iB on this machine \\(1 "
          "rank: parameters [0-9.]+ GiB, gradients [0-9.]+ GiB, optimizer state "
          "[0-9.]+ GiB, exchange buffers [0-9.]+ [MG]iB, activations [0-9.]+ [MG]iB\\), but "
          "[0-9.]+ [MGT]iB is available \\((MemAvailable in "
          "/proc/meminfo|the room under the cgroup limit .*|the room under the address-space "
          "limit \\(ulimit -v\\) of .*)\\); its parameters, "
          "gradients, optimizer state and exchange buffers alone need [0-9.]+ [GT]iB, which no "
          "--memory-budget changes. To fit, keep the model's blocks \\(weights, gradients, "
          "optimizer state\\) in a file \\(--model-state file:DIR, docs/out-of-core.md\\); or use "
          "a smaller model \\(--layers, "
          "--d-model\\), batch \\(--batch\\) or sequence \\(--seq-len\\); or spread "
          "the ranks over machines \\(--backend mpi under mpirun\\). "
          "TANDEM_MEMORY_LIMIT=SIZE states the memory available instead of what "
          "this machine reports \\(off: no check\\)\n"));
}

// Where the activations are what does not fit, the advice is --memory-budget; with a budget the
// estimate counts the budget, not the in-core activations.
TEST(MemoryCheck, ActivationsThatDoNotFitPointToMemoryBudget) {
  TrainConfig c = testing::tiny_run(1);
  c.batch = 64;
  const MemoryEstimate in_core = estimate_memory(c);
  EXPECT_FALSE(in_core.activations_budgeted);
  EXPECT_EQ(in_core.activations, in_core.activations_in_core);
  EXPECT_GT(in_core.activations, in_core.parameters + in_core.gradients + in_core.optimizer);
  {
    StatedLimit limit(std::to_string(in_core.total() - 1));
    EXPECT_EQ(user_error_of([&] { train(c); }),
              fmt::format("this run needs about {}, but {} is available (TANDEM_MEMORY_LIMIT). To "
                          "fit, train out-of-core with --memory-budget (e.g. --memory-budget 25% "
                          "keeps the saved activations in a quarter of their {}, the rest swapped "
                          "or recomputed: docs/out-of-core.md); or use a smaller model (--layers, "
                          "--d-model), batch (--batch) or sequence (--seq-len); or spread the "
                          "ranks over machines (--backend mpi under mpirun). "
                          "TANDEM_MEMORY_LIMIT=SIZE states the memory available instead of what "
                          "this machine reports (off: no check)",
                          in_core.str(), human_bytes(in_core.total() - 1),
                          human_bytes(in_core.activations)));
  }
  c.memory_budget = "25%";
  const MemoryEstimate budgeted = estimate_memory(c);
  EXPECT_TRUE(budgeted.activations_budgeted);
  EXPECT_EQ(budgeted.activations, parse_budget("25%", in_core.activations));
  EXPECT_EQ(budgeted.total() - budgeted.activations, in_core.total() - in_core.activations);
}

// In-process ranks share the machine: two data-parallel ranks hold two shards' worth, each with
// half the optimizer state and half of each exchange buffer, and checkpoint buffers each.
TEST(MemoryCheck, InProcessRanksAreCountedTogether) {
  TrainConfig c = testing::tiny_run(1);
  c.executor = exec::RunnerKind::Compiled;  // estimated only: nothing is compiled
  c.save_dir = "unused";
  const MemoryEstimate one = estimate_memory(c);
  c.grid = {2, 1, 1};
  const MemoryEstimate two = estimate_memory(c);
  EXPECT_EQ(two.ranks, 2);
  EXPECT_EQ(two.parameters, 2 * one.parameters);
  EXPECT_EQ(two.optimizer, one.optimizer);
  EXPECT_NEAR(static_cast<double>(two.exchange), static_cast<double>(one.exchange), 64.0);
  EXPECT_GT(one.checkpoint, 0u);
  EXPECT_EQ(two.checkpoint, 2 * one.checkpoint);
}

// --cp 2: two ranks, each with the whole model (its moments sliced over the two replicas), the
// activations of half the tokens of each row and context-parallel attention's key/value buffers.
TEST(MemoryCheck, ContextParallelRanksHoldHalfTheTokensAndTheKeysAndValues) {
  TrainConfig c = testing::tiny_run(1);
  c.executor = exec::RunnerKind::Compiled;  // estimated only: nothing is compiled
  const MemoryEstimate one = estimate_memory(c);
  TrainConfig half = c;
  half.model.seq_len = c.model.seq_len / 2;
  const MemoryEstimate half_tokens = estimate_memory(half);
  c.grid = {1, 1, 1, 2};
  const MemoryEstimate two = estimate_memory(c);
  EXPECT_EQ(two.ranks, 2);
  EXPECT_EQ(two.parameters, 2 * one.parameters);
  EXPECT_EQ(two.optimizer, one.optimizer);
  const uint64_t kv = parallel::ContextParallelAttention::buffer_bytes(
      parallel::ContextSplit(c.model.seq_len, 2, 0), static_cast<int>(c.batch), c.model.n_heads,
      c.model.n_kv_heads(), c.model.head_size());
  EXPECT_EQ(two.activations, 2 * (half_tokens.activations + kv));
}

TEST(MemoryCheck, TheEstimateIsAmongTheStartUpLines) {
  TrainConfig c = testing::tiny_run(1);
  std::ostringstream out;
  c.out = &out;
  train(c);
  EXPECT_THAT(out.str(), HasSubstr("  memory estimate: " + estimate_memory(c).str() + "; "));
  StatedLimit limit("8GiB");
  std::ostringstream stated;
  c.out = &stated;
  train(c);
  EXPECT_THAT(stated.str(), HasSubstr("; 8.00 GiB available (TANDEM_MEMORY_LIMIT)\n"));
}

// The largest model `tandem plan` states is the last layer count whose estimate fits: one more
// layer does not. In memory, and with the blocks in a host tier (which counts as memory).
TEST(MemoryCheck, TheLargestModelStatedIsTheLastThatFits) {
  StatedLimit limit("512MiB");
  for (const bool streamed : {false, true}) {
    TrainConfig c = testing::tiny_run(1);
    c.model.d_model = 128;
    if (streamed) c.model_state = ooc::TierSpec::parse("host");
    const std::string line = largest_model_line(c);
    const size_t at = line.find("this machine trains: ");
    ASSERT_NE(at, std::string::npos) << line;
    const int layers = std::stoi(line.substr(at + 21));
    EXPECT_THAT(line, HasSubstr("bounded by memory (512.0 MiB available, TANDEM_MEMORY_LIMIT)"));
    c.model.n_layers = layers;
    EXPECT_LE(estimate_memory(c).total(), 512u << 20) << line;
    c.model.n_layers = layers + 1;
    EXPECT_GT(estimate_memory(c).total(), 512u << 20) << line;
  }
}

TEST(MemoryCheck, AStatedLimitMustBeASize) {
  StatedLimit limit("lots");
  TrainConfig c = testing::tiny_run(1);
  EXPECT_THAT(
      user_error_of([&] { train(c); }),
      MatchesRegex("TANDEM_MEMORY_LIMIT: .*lots.* \\(give a size such as 16GiB, or off\\)"));
}

// Under an address-space limit (ulimit -v 400000, 391 MiB) the tiny model's data fits, but not
// OpenBLAS's 128 MiB buffer for each thread that multiplies: OpenBLAS spun without end at the
// first matmul, and ignored SIGTERM. The run is refused at once, naming the limit and what the
// BLAS and the threads reserve; the limit the message asks for trains (the figures are measured:
// core/available_memory.h).
TEST(MemoryCheck, AnAddressSpaceLimitTooSmallForTheThreadsIsRefusedAtStart) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's shadow memory needs more address space than any such limit";
#endif
  auto run = [](int kib) {
    return tandem::testing::run_command(fmt::format(
        "sh -c 'ulimit -v {}; exec timeout -s KILL 60 \"{}\" train --model tiny --dp 1 --tp 1 "
        "--steps 2 --threads 2 --quiet' 2>&1",
        kib, tandem::testing::tandem_binary()));
  };
  const auto begin = std::chrono::steady_clock::now();
  const tandem::testing::CommandResult small = run(400000);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count(), 20);
  EXPECT_EQ(small.status, 1) << small.output;
  EXPECT_THAT(small.output,
              MatchesRegex("tandem: error: this run needs about [0-9.]+ MiB of address space "
                           "\\([0-9.]+ [KM]iB of data, [0-9.]+ MiB reserved: 38.0 MiB of "
                           "OpenBLAS's library, [0-9.]+ MiB of its buffers, [0-9.]+ MiB of thread "
                           "stacks, [0-9.]+ MiB of malloc arenas, 64.0 MiB of other mappings\\), "
                           "but the address-space limit \\(ulimit -v\\) of 390.6 MiB leaves "
                           "[0-9.]+ MiB \\([0-9.]+ MiB mapped\\); OpenBLAS would hang without "
                           "room for its buffers. Raise it \\(ulimit -v [0-9]+ or more\\), .*\n"))
      << small.output;
  // The limit the message asks for is enough.
  const size_t at = small.output.find("ulimit -v ", small.output.find("Raise it"));
  ASSERT_NE(at, std::string::npos) << small.output;
  const int asked = std::atoi(small.output.c_str() + at + 10);
  const tandem::testing::CommandResult enough = run(asked);
  EXPECT_EQ(enough.status, 0) << asked << "\n" << enough.output;
}

}  // namespace
}  // namespace tandem::train
