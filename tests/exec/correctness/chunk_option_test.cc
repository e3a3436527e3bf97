// RunnerOptions::chunk_bytes on the compiled and plan runners: fused schedules run at a runner's
// own chunk size give bitwise what they give at the same size set process-wide, and the size
// reaches every collective the runner runs (ranks that ask for different sizes are told so,
// where without the option they would all run at the process's).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "support/schedules.h"
#include "tandem/comm/thread.h"
#include "tandem/core/error.h"
#include "tandem/dsl/workloads.h"
#include "tandem/exec/compiled.h"
#include "tandem/exec/runner.h"

namespace tandem::exec {
namespace {

using tandem::testing::plan_named;
using ::testing::MatchesRegex;

struct ChunkCase {
  std::string label;
  dsl::Program program;
  std::string schedule;
  dsl::SymbolMap sizes;
};

// Fused schedules whose hooks run over many 64-byte chunks of these small tensors.
std::vector<ChunkCase> chunk_cases() {
  return {
      {"adam f32", dsl::workloads::adam(DType::F32), "fused(RS-C-AG)+slice(m,v)", {{"N", 1001}}},
      {"adam bf16", dsl::workloads::adam(DType::BF16), "fused(RS-C-AG)+slice(m,v)", {{"N", 517}}},
      {"megatron",
       dsl::workloads::megatron_layer(DType::F32, 0.1),
       "fused(AR-C)",
       {{"B", 7}, {"K", 10}, {"H", 6}}},
  };
}

// Sets `kind` up for `plan` with `options`, fills every input of this rank's group and every
// scalar deterministically (the same on every run), runs it once and returns its results' bytes.
std::vector<std::vector<char>> run_once(RunnerKind kind, const schedule::Plan& plan,
                                        comm::Communicator& c, const dsl::SymbolMap& sizes,
                                        const RunnerOptions& options) {
  std::unique_ptr<Runner> run = make_runner(kind, plan, c, sizes, options);
  const dsl::Program& p = run->program();
  for (int id : p.inputs()) {
    const dsl::Stage& st = p.stage(id);
    if (!run->placement().holds(st)) continue;
    const Tensor t = run->input(st.name);
    for (int64_t k = 0; k < t.numel(); ++k)
      t.set(k, 0.25f + static_cast<float>((k * 7 + id * 5 + c.rank() * 3) % 11) / 16.0f);
  }
  for (int id : p.scalars())
    run->set_scalar(p.stage(id).name, p.stage(id).name == "seed" ? 7.0 : 0.5);
  run->run();
  std::vector<std::vector<char>> out;
  for (const auto& [name, t] : run->results()) {
    std::vector<char> b(t.nbytes());
    if (!b.empty()) std::memcpy(b.data(), t.data(), b.size());
    out.push_back(std::move(b));
  }
  return out;
}

TEST(ChunkOption, RunsAsTheSameProcessWideSize) {
  for (const ChunkCase& cs : chunk_cases()) {
    const schedule::Plan plan = plan_named(cs.program, cs.schedule);
    RunnerOptions own;
    own.chunk_bytes = 64;
    own.compiled = compile_plan(plan);
    RunnerOptions process;
    process.compiled = own.compiled;
    for (RunnerKind kind : {RunnerKind::Compiled, RunnerKind::Plan})
      for (int ranks = 1; ranks <= 4; ++ranks) {
        const std::string what =
            fmt::format("{} {} on {} ranks", cs.label, runner_kind_name(kind), ranks);
        std::vector<std::vector<std::vector<char>>> a(ranks), b(ranks);
        comm::set_chunk_bytes(size_t{1} << 20);  // one chunk for all, were the option ignored
        comm::run_ranks(ranks, [&](comm::Communicator& c) {
          a[c.rank()] = run_once(kind, plan, c, cs.sizes, own);
        });
        comm::set_chunk_bytes(64);
        comm::run_ranks(ranks, [&](comm::Communicator& c) {
          b[c.rank()] = run_once(kind, plan, c, cs.sizes, process);
        });
        comm::set_chunk_bytes(0);
        for (int r = 0; r < ranks; ++r) {
          EXPECT_FALSE(a[r].empty()) << what;
          EXPECT_TRUE(a[r] == b[r]) << what << ": rank " << r << "'s results differ";
        }
      }
  }
}

// Rank 1's runner asks for another chunk size than the others': if the option did not reach every
// collective the runner runs, all would run at the process's size and agree.
TEST(ChunkOption, ReachesEveryCollective) {
  for (const ChunkCase& cs : chunk_cases()) {
    const schedule::Plan plan = plan_named(cs.program, cs.schedule);
    const std::shared_ptr<const CompiledPlan> compiled = compile_plan(plan);
    for (RunnerKind kind : {RunnerKind::Compiled, RunnerKind::Plan}) {
      std::string message = "no error";
      try {
        comm::run_ranks(3, [&](comm::Communicator& c) {
          RunnerOptions o;
          o.compiled = compiled;
          o.chunk_bytes = c.rank() == 1 ? 128 : 64;
          run_once(kind, plan, c, cs.sizes, o);
        });
      } catch (const UserError& e) {
        message = e.what();
      }
      EXPECT_THAT(message,
                  MatchesRegex(
                      "[a-z_]+ on rank [012] of 3: chunk size mismatch across ranks: rank 0 passed "
                      "64 bytes, rank 1 passed 128 bytes.*"))
          << cs.label << " " << runner_kind_name(kind);
    }
  }
}

}  // namespace
}  // namespace tandem::exec
