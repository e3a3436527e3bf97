// The compile cache seen from a plan: the first compile_plan compiles, a second one in the same
// process is a memory hit, and once the module is unloaded the next one (another run, another
// process) loads the shared object from disk and compiles nothing.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "tandem/comm/thread.h"
#include "tandem/dsl/dsl.h"
#include "tandem/exec/compiled.h"
#include "tandem/schedule/transforms.h"

namespace tandem::exec {
namespace {

namespace fs = std::filesystem;

// A plan whose source no other test compiles (its program's name is in the source).
schedule::Plan unique_plan() {
  dsl::Program p(fmt::format("cache_test_{}", ::getpid()));
  const dsl::Expr x = p.input(DType::F32, {"N"}, dsl::Layout::local(), "x");
  const dsl::Expr s = dsl::AllReduce(dsl::ReduceOp::Sum, x);
  p.output((s * 2.0).named("y"), "y");
  schedule::Schedule sched(p);
  return sched.lower();
}

TEST(CompileCache, SecondCompileIsAHitAndRunsCompileNothing) {
  const fs::path dir =
      fs::temp_directory_path() / fmt::format("tandem-codegen-cache-{}", ::getpid());
  fs::remove_all(dir);
  JitOptions options;
  options.cache_dir = dir.string();
  const schedule::Plan plan = unique_plan();
  const JitStats s0 = jit_stats();
  {
    auto first = compile_plan(plan, options);
    EXPECT_TRUE(first->compiled_now());
    auto second = compile_plan(plan, options);
    EXPECT_EQ(&second->module(), &first->module()) << "the loaded module is shared";
    const JitStats s1 = jit_stats();
    EXPECT_EQ(s1.compiles - s0.compiles, 1);
    EXPECT_EQ(s1.memory_hits - s0.memory_hits, 1);
  }
  // Unloaded: the next compile_plan (another run of the program) finds the shared object on disk.
  const JitStats s2 = jit_stats();
  auto again = compile_plan(plan, options);
  EXPECT_FALSE(again->compiled_now());
  const JitStats s3 = jit_stats();
  EXPECT_EQ(s3.compiles, s2.compiles);
  EXPECT_EQ(s3.disk_hits - s2.disk_hits, 1);
  // Running it, on any number of ranks and sizes, compiles nothing either.
  for (int ranks : {1, 3})
    comm::run_ranks(ranks, [&](comm::Communicator& c) {
      CompiledRunner run(again, c, {{"N", 10}});
      run.input("x").fill(static_cast<float>(c.rank() + 1));
      run.run();
      const Tensor y = run.output("y");
      for (int64_t i = 0; i < y.numel(); ++i)
        EXPECT_EQ(y.get(i), static_cast<float>(ranks * (ranks + 1)));
    });
  EXPECT_EQ(jit_stats().compiles, s2.compiles);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tandem::exec
