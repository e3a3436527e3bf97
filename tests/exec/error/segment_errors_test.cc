// Segments (dsl/ir.h: segment_norm, segment_scale) misused: a segment op on a tensor it cannot cut,
// bounds that are missing, unordered, of the wrong extent or count, bounds for a program without
// segment ops, and the CUDA emitter, which does not emit segment ops: each a UserError naming the
// stage and the rule.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/schedules.h"
#include "support/scratch.h"
#include "tandem/codegen/cuda.h"
#include "tandem/comm/thread.h"
#include "tandem/core/error.h"
#include "tandem/dsl/dsl.h"
#include "tandem/exec/runner.h"

namespace tandem::exec {
namespace {

using namespace tandem::dsl;  // NOLINT: the builder's vocabulary
using tandem::testing::plan_named;
using tandem::testing::user_error_of;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(SegmentErrors, SegmentOpsCutF32TensorsOfOneDim) {
  Program p("cuts");
  const Expr x = p.input(F32, {"B", "N"}, Replicated, "x");
  EXPECT_THAT(user_error_of([&] { segment_norm(x); }),
              AllOf(HasSubstr("segment_norm cuts an f32 tensor of one dim"),
                    HasSubstr("x: f32[B, N] Replicated")));
  const Expr y = p.input(F32, {"N"}, Replicated, "y");
  const Expr t = p.input(F32, {4}, Replicated, "t");
  EXPECT_THAT(
      user_error_of([&] { segment_scale(t, y); }),
      HasSubstr("the factors t: f32[4] Replicated must be f32[S] Replicated, one per segment"));
}

// lamb_bucket set up on one rank with `bounds` (S bound to their count).
void set_up(const Segments& bounds, int64_t n = 10) {
  const schedule::Plan plan = plan_named(workloads::lamb_bucket(F32), "fused(RS-C-AG)+slice(m,v)");
  comm::run_ranks(1, [&](comm::Communicator& c) {
    RunnerOptions options;
    options.segments = bounds;
    make_runner(RunnerKind::Plan, plan, c, {{"N", n}, {"S", 2}}, options);
  });
}

TEST(SegmentErrors, BoundsAreCheckedAtSetUp) {
  EXPECT_THAT(
      user_error_of([] { set_up({}); }),
      HasSubstr(
          "program 'lamb_bucket' cuts its tensors into segments (w_norm): give their bounds"));
  EXPECT_THAT(user_error_of([] {
                set_up({1, 4, 10});
              }),
              HasSubstr("the segments' first bound is 1, not 0"));
  EXPECT_THAT(user_error_of([] {
                set_up({0, 4, 4, 10});
              }),
              HasSubstr("segment bounds must ascend strictly (every segment holds an element), but "
                        "bound 2 is 4 after 4"));
  EXPECT_THAT(
      user_error_of([] {
        set_up({0, 4, 9});
      }),
      HasSubstr("stage w_norm cuts w_mine (extent 10) into segments, but the segments end at 9"));
  EXPECT_THAT(user_error_of([] {
                set_up({0, 4, 6, 10});
              }),
              HasSubstr("stage w_norm has 2 segments (w_norm is [2]), but 3 segments are given"));
  const schedule::Plan adam = plan_named(workloads::adam(F32), "AR-C");
  EXPECT_THAT(user_error_of([&] {
                comm::run_ranks(1, [&](comm::Communicator& c) {
                  RunnerOptions options;
                  options.segments = {0, 10};
                  make_runner(RunnerKind::Reference, adam, c, {{"N", 10}}, options);
                });
              }),
              HasSubstr("program 'adam' has no segment op (segment_norm, segment_scale), so it "
                        "takes no segments"));
}

TEST(SegmentErrors, TheCudaEmitterRefusesSegmentOpsByName) {
  const schedule::Plan plan = plan_named(workloads::lamb_bucket(F32), "fused(RS-C-AG)+slice(m,v)");
  EXPECT_THAT(
      user_error_of([&] { codegen::emit_cuda(plan, "lamb_bucket"); }),
      AllOf(HasSubstr("codegen/cuda: plan 'fused(RS-C-AG)+slice(m,v)' of program 'lamb_bucket'"),
            HasSubstr("segment_norm"), HasSubstr("is not supported by the CUDA emitter")));
}

}  // namespace
}  // namespace tandem::exec
