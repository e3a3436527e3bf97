// What a user reads when the compiler path fails: a plan feature the emitter cannot compile (named
// with the plan, the step and the feature), a compile that fails (the command and the compiler's
// output), a compiler that does not run, and the compiled runner's argument checks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "support/schedules.h"
#include "support/scratch.h"
#include "tandem/codegen/cpp.h"
#include "tandem/comm/thread.h"
#include "tandem/core/error.h"
#include "tandem/dsl/dsl.h"
#include "tandem/exec/compiled.h"
#include "tandem/schedule/transforms.h"

namespace tandem::codegen {
namespace {

using ::testing::HasSubstr;

using tandem::testing::plan_named;

using tandem::testing::user_error_of;

TEST(CodegenErrors, EmitterNamesTheStepAndTheFeature) {
  schedule::Plan plan = plan_named(dsl::workloads::megatron_layer(), "ol(MM,fused(AR-C))");
  size_t k = 0;
  while (k < plan.steps.size() && plan.steps[k].kind != schedule::StepKind::Pipeline) ++k;
  ASSERT_LT(k, plan.steps.size());
  schedule::Step nested = plan.steps[k];
  plan.steps[k].pipeline.body.push_back(nested);
  const std::string msg = user_error_of([&] { emit_cpp(plan); });
  EXPECT_THAT(msg, HasSubstr("codegen/cpp: plan 'ol(MM,fused(AR-C))' of program 'megatron_layer'"));
  EXPECT_THAT(msg, HasSubstr(fmt::format("step {}", k)));
  EXPECT_THAT(msg, HasSubstr("a pipeline inside a pipeline is not supported by the C++ emitter"));

  schedule::Plan chunk = plan_named(dsl::workloads::adam(), "AR-C");
  chunk.steps[1].kind = schedule::StepKind::Loop;
  chunk.steps[1].loop.domain = schedule::Domain::Chunk;
  EXPECT_THAT(user_error_of([&] { emit_cpp(chunk); }), HasSubstr("step 1"));
  EXPECT_THAT(user_error_of([&] { emit_cpp(chunk); }),
              HasSubstr("a chunk loop outside a collective"));
}

TEST(CodegenErrors, FailedCompileCarriesTheCommandAndTheCompilersWords) {
  exec::JitOptions options;
  options.cache_dir =
      (std::filesystem::temp_directory_path() / fmt::format("tandem-codegen-err-{}", ::getpid()))
          .string();
  options.flags = exec::default_jit_flags();
  options.flags.push_back("-include");
  options.flags.push_back("/nonexistent/tandem_missing_header.h");
  const std::string msg = user_error_of(
      [&] { exec::compile_plan(plan_named(dsl::workloads::adam(), "fused(AR-C)"), options); });
  EXPECT_THAT(msg, HasSubstr("JIT compile failed"));
  EXPECT_THAT(msg, HasSubstr("-include"));  // the command
  EXPECT_THAT(
      msg,
      HasSubstr("tandem_missing_header.h: No such file or directory"));  // the compiler's output
  std::filesystem::remove_all(options.cache_dir);
}

TEST(CodegenErrors, CompilerThatDoesNotRun) {
  exec::JitOptions options;
  options.cxx = "/nonexistent/bin/c++";
  const std::string msg = user_error_of(
      [&] { exec::compile_plan(plan_named(dsl::workloads::adam(), "AR-C"), options); });
  EXPECT_THAT(msg, HasSubstr("/nonexistent/bin/c++"));
  EXPECT_THAT(msg, HasSubstr("does not run"));
}

TEST(CodegenErrors, RunnerChecksItsArguments) {
  auto adam = exec::compile_plan(plan_named(dsl::workloads::adam(), "fused(RS-C-AG)+slice(m,v)"));
  comm::run_ranks(2, [&](comm::Communicator& c) {
    exec::CompiledRunner run(adam, c, {{"N", 9}});
    EXPECT_THAT(user_error_of([&] { run.run(); }),
                HasSubstr("scalar 'lr' is not bound; call set_scalar first"));
    EXPECT_THAT(user_error_of([&] { run.load("g", Tensor::zeros(DType::F32, Shape{9})); }),
                HasSubstr("input 'g' is bf16, given f32[9]"));
    EXPECT_THAT(user_error_of([&] { run.load("m", Tensor::zeros(DType::F32, Shape{7})); }),
                HasSubstr("input 'm' is stored as f32["))
        << "m is stored sliced: this rank's part, or the whole";
    EXPECT_THAT(user_error_of([&] { run.input("nope"); }),
                HasSubstr("program 'adam' has no input named 'nope'"));
    EXPECT_THAT(user_error_of([&] { run.set_scalar("nope", 1); }),
                HasSubstr("has no scalar named 'nope'"));
  });
  auto layer = exec::compile_plan(plan_named(dsl::workloads::megatron_layer(), "fused(AR-C)"));
  comm::run_ranks(1, [&](comm::Communicator& c) {
    exec::CompiledRunner run(layer, c, {{"B", 2}, {"K", 3}, {"H", 4}});
    EXPECT_THAT(
        user_error_of([&] { run.set_scalar("seed", 2.5); }),
        HasSubstr(
            "scalar 'seed' = 2.5 keys a dropout mask, so it must be an integer in [0, 2^53)"));
    EXPECT_THAT(user_error_of([&] {
                  exec::CompiledRunner bad(layer, c, {{"B", 2}, {"K", 3}});
                }),
                HasSubstr("'H'"));
  });
  auto pipe = exec::compile_plan(plan_named(dsl::workloads::pipeline_stage(), "AR-C"));
  comm::run_ranks(3, [&](comm::Communicator& c) {
    EXPECT_THAT(user_error_of([&] {
                  exec::CompiledRunner run(pipe, c, {{"B", 2}, {"K", 3}, {"H", 4}});
                }),
                HasSubstr("has 2 groups, but the communicator has 3 ranks"));
  });
}

}  // namespace
}  // namespace tandem::codegen
