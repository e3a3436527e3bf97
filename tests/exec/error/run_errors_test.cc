// The reference interpreter's run-time errors: every bad argument a caller can pass is a
// UserError naming the program, the binding and what was expected.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tandem/comm/thread.h"
#include "tandem/core/error.h"
#include "tandem/dsl/dsl.h"
#include "tandem/exec/reference.h"

namespace tandem::exec {
namespace {

using namespace tandem::dsl;  // NOLINT: the builder's vocabulary
using ::testing::AllOf;
using ::testing::HasSubstr;

// The message of the UserError that running `fn` on `ranks` threads throws.
std::string error_of(int ranks, const std::function<void(comm::Communicator&)>& fn) {
  try {
    comm::run_ranks(ranks, fn);
  } catch (const UserError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected a UserError, got: " << e.what();
    return {};
  }
  ADD_FAILURE() << "expected a UserError, none was thrown";
  return {};
}

// Adam's arguments on one rank, all correct; each test spoils one.
RunArgs adam_args(int64_t n = 4) {
  RunArgs a;
  a.symbols = {{"N", n}};
  a.scalars = {{"lr", 0.1},         {"beta1", 0.9}, {"beta2", 0.99},  {"eps", 1e-8},
               {"weight_decay", 0}, {"step", 1},    {"grad_scale", 1}};
  a.inputs = {{"g", Tensor::zeros(BF16, Shape{n})},
              {"w", Tensor::zeros(F32, Shape{n})},
              {"m", Tensor::zeros(F32, Shape{n})},
              {"v", Tensor::zeros(F32, Shape{n})}};
  return a;
}

std::string adam_error(RunArgs args) {
  const Program p = workloads::adam();
  return error_of(1, [&](comm::Communicator& c) { run_reference(p, c, args); });
}

TEST(RunErrors, CorrectArgumentsRun) {
  const Program p = workloads::adam();
  comm::run_ranks(
      1, [&](comm::Communicator& c) { EXPECT_NO_THROW(run_reference(p, c, adam_args())); });
}

TEST(RunErrors, UnboundScalar) {
  RunArgs a = adam_args();
  a.scalars.erase("beta2");
  EXPECT_THAT(
      adam_error(a),
      HasSubstr("program 'adam': scalar 'beta2' is not bound; give its value in RunArgs::scalars"));
}

TEST(RunErrors, UnknownScalar) {
  RunArgs a = adam_args();
  a.scalars["learning_rate"] = 1;
  EXPECT_THAT(
      adam_error(a),
      HasSubstr("program 'adam' has no scalar 'learning_rate' (its scalars: lr, beta1, beta2, eps, "
                "weight_decay, step, grad_scale)"));
}

TEST(RunErrors, UnboundSymbol) {
  RunArgs a = adam_args();
  a.symbols.clear();
  EXPECT_THAT(adam_error(a), HasSubstr("symbol 'N' (in the shape of input 'g' [N]) is not bound"));
}

TEST(RunErrors, UnknownOrNegativeSymbol) {
  RunArgs a = adam_args();
  a.symbols["M"] = 3;
  EXPECT_THAT(adam_error(a), HasSubstr("program 'adam' has no symbol 'M' (its symbols: N)"));
  RunArgs b = adam_args();
  b.symbols["N"] = -1;
  EXPECT_THAT(adam_error(b), HasSubstr("symbol 'N' is bound to -1; extents are >= 0"));
}

TEST(RunErrors, MissingInput) {
  RunArgs a = adam_args();
  a.inputs.erase("m");
  EXPECT_THAT(adam_error(a),
              HasSubstr("input 'm' is not given on rank 0 (index 0 of group 0, 1 ranks); pass this "
                        "rank's piece, f32[4] (global [4] Replicated)"));
}

TEST(RunErrors, UnknownInput) {
  RunArgs a = adam_args();
  a.inputs["grad"] = Tensor::zeros(F32, Shape{4});
  EXPECT_THAT(adam_error(a),
              HasSubstr("program 'adam' has no input 'grad' (its inputs: g, w, m, v)"));
}

TEST(RunErrors, InputOfTheWrongDtype) {
  RunArgs a = adam_args();
  a.inputs["g"] = Tensor::zeros(F32, Shape{4});
  EXPECT_THAT(
      adam_error(a),
      HasSubstr("input 'g' on rank 0 (index 0 of group 0, 1 ranks) is f32[4], but this rank's "
                "piece is bf16[4]"));
}

TEST(RunErrors, WholeTensorWhereAPieceIsExpected) {
  Program p("sliced");
  const Expr x = p.input(F32, {"N"}, Sliced(0), "x");
  p.output(AllGather(x * 2), "y");
  const std::string msg = error_of(3, [&](comm::Communicator& c) {
    RunArgs a;
    a.symbols = {{"N", 10}};
    a.inputs = {{"x", Tensor::zeros(F32, Shape{10})}};
    run_reference(p, c, a);
  });
  EXPECT_THAT(msg, AllOf(HasSubstr("input 'x' on rank"),
                         HasSubstr("is f32[10], but this rank's piece is f32["),
                         HasSubstr("(global [10] Sliced(0))")));
}

TEST(RunErrors, RanksDoNotSplitIntoGroups) {
  const Program p = workloads::pipeline_stage();
  EXPECT_THAT(error_of(3, [&](comm::Communicator& c) { run_reference(p, c, {}); }),
              HasSubstr("program 'pipeline_stage' has 2 groups, but the communicator has 3 ranks; "
                        "the ranks split into 2 "
                        "equal groups of consecutive ranks, so run it on a multiple of 2 ranks"));
}

TEST(RunErrors, BroadcastRootOutsideTheGroup) {
  Program p("bcast");
  const Expr x = p.input(F32, {3}, Local, "x");
  p.output(Broadcast(x, 2).named("b"), "b");
  EXPECT_THAT(error_of(2,
                       [&](comm::Communicator& c) {
                         run_reference(p, c, {{}, {}, {{"x", Tensor::zeros(F32, Shape{3})}}});
                       }),
              HasSubstr("program 'bcast', stage b: Broadcast root 2 is outside the group of 2 "
                        "ranks; the root is a rank "
                        "index within the group, 0 to 1"));
}

TEST(RunErrors, DropoutSeedNotAnInteger) {
  const Program p = workloads::megatron_layer();
  RunArgs a;
  a.symbols = {{"B", 1}, {"K", 1}, {"H", 1}};
  a.scalars = {{"seed", 1.5}};
  a.inputs = {{"x", Tensor::zeros(F32, Shape{1, 1})},
              {"w", Tensor::zeros(F32, Shape{1, 1})},
              {"bias", Tensor::zeros(F32, Shape{1})},
              {"residual", Tensor::zeros(F32, Shape{1, 1})}};
  EXPECT_THAT(error_of(1, [&](comm::Communicator& c) { run_reference(p, c, a); }),
              HasSubstr("program 'megatron_layer': scalar 'seed' = 1.5 keys a dropout mask, so it "
                        "must be an integer in "
                        "[0, 2^53)"));
}

TEST(RunErrors, InvalidProgramIsRefusedBeforeRunning) {
  Program p("idle");
  const Expr x = p.input(F32, {3}, Local, "x");
  (void)(x + 1);
  EXPECT_THAT(error_of(1,
                       [&](comm::Communicator& c) {
                         run_reference(p, c, {{}, {}, {{"x", Tensor::zeros(F32, Shape{3})}}});
                       }),
              HasSubstr("program 'idle' produces nothing"));
}

}  // namespace
}  // namespace tandem::exec
