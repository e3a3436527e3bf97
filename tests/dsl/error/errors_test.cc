// The DSL's error catalogue: every mistake a user can make while building a program is a
// UserError whose message names the stage, the operands with their types, and what is legal.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/scratch.h"
#include "tandem/core/error.h"
#include "tandem/dsl/dsl.h"

namespace tandem::dsl {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using tandem::testing::user_error_of;

// ------------------------------------------------------------------------------------ layouts

TEST(LayoutErrors, LocalWithReplicated) {
  Program p("adam");
  const Expr g = p.input(BF16, {"N"}, Local, "g");
  const Expr w = p.input(BF16, {"N"}, Replicated, "w");
  EXPECT_THAT(user_error_of([&] { g + w; }),
              AllOf(HasSubstr("program 'adam', stage %2 = add(g, w)"),
                    HasSubstr("operands mix layouts Local and Replicated"),
                    HasSubstr("g: bf16[N] Local; w: bf16[N] Replicated"),
                    HasSubstr("Sliced(d) operands with Replicated"),
                    HasSubstr("AllReduce the Local one first")));
}

TEST(LayoutErrors, LocalWithSliced) {
  Program p("p");
  const Expr g = p.input(F32, {"N"}, Local, "g");
  const Expr s = p.input(F32, {"N"}, Sliced(0), "s");
  EXPECT_THAT(user_error_of([&] { s* g; }),
              AllOf(HasSubstr("operands mix layouts Sliced(0) and Local"),
                    HasSubstr("ReduceScatter the Local one along the same dim")));
}

TEST(LayoutErrors, SlicedAlongDifferentDims) {
  Program p("p");
  const Expr a = p.input(F32, {4, 4}, Sliced(0), "a");
  const Expr b = p.input(F32, {4, 4}, Sliced(1), "b");
  EXPECT_THAT(user_error_of([&] { a - b; }),
              AllOf(HasSubstr("operands mix layouts Sliced(0) and Sliced(1)"),
                    HasSubstr("Slice both along the same dim")));
}

TEST(LayoutErrors, LocalScalarWithReplicatedTensor) {
  Program p("p");
  const Expr g = p.input(F32, {"N"}, Local, "g");
  const Expr w = p.input(F32, {"N"}, Replicated, "w");
  // The norm of a Local tensor is each rank's own: not a scalar every rank shares.
  EXPECT_THAT(user_error_of([&] { norm(g) * w; }),
              HasSubstr("operands mix layouts Local and Replicated"));
}

TEST(LayoutErrors, PartialIntoElementwise) {
  const Program ok = workloads::megatron_layer();
  Program p("layer");
  const Expr x = p.input(F32, {"B", "K"}, Sliced(1), "x");
  const Expr w = p.input(F32, {"K", "H"}, Sliced(0), "w");
  const Expr b = p.input(F32, {"H"}, Replicated, "b");
  const Expr y = matmul(x, w).named("y");
  EXPECT_THAT(
      user_error_of([&] { y + b; }),
      AllOf(HasSubstr("stage %4 = add(y, b)"), HasSubstr("operand y: f32[B, H] Partial is Partial"),
            HasSubstr("Only AllReduce(Sum, x) and ReduceScatter(Sum, x) take a Partial operand")));
  EXPECT_THAT(user_error_of([&] { norm(y); }), HasSubstr("and norm needs the value"));
  EXPECT_THAT(user_error_of([&] { AllGather(y); }),
              HasSubstr("AllGather takes a Sliced operand, not Partial"));
}

TEST(LayoutErrors, PartialReducedByMax) {
  Program p("p");
  const Expr x = p.input(F32, {2, 3}, Sliced(1), "x");
  const Expr w = p.input(F32, {3, 2}, Replicated, "w");
  EXPECT_THAT(
      user_error_of([&] { AllReduce(Max, matmul(x, w)); }),
      HasSubstr(
          "AllReduce(max) of a Partial operand %2: f32[2, 2] Partial: its ranks hold summands, so "
          "only Sum reduces them"));
  EXPECT_THAT(user_error_of([&] { Shift(matmul(x, w)); }),
              AllOf(HasSubstr("Shift takes a Local operand"), HasSubstr("not Partial"),
                    HasSubstr("Reduce the summands first")));
}

TEST(LayoutErrors, CollectiveOperands) {
  Program p("p");
  const Expr r = p.input(F32, {"N"}, Replicated, "r");
  const Expr s = p.input(F32, {"N"}, Sliced(0), "s");
  const Expr l = p.input(F32, {"N"}, Local, "l");
  EXPECT_THAT(user_error_of([&] { AllReduce(Sum, r); }),
              AllOf(HasSubstr("stage %3 = allreduce(r)"),
                    HasSubstr("AllReduce takes a Local (or Partial) operand, not "
                              "Replicated: r: f32[N] Replicated"),
                    HasSubstr("Every rank already holds the same value")));
  EXPECT_THAT(user_error_of([&] { ReduceScatter(Sum, s); }),
              AllOf(HasSubstr("ReduceScatter takes a Local (or Partial) operand, not Sliced(0)"),
                    HasSubstr("AllGather makes it Replicated")));
  EXPECT_THAT(
      user_error_of([&] { AllGather(l); }),
      AllOf(HasSubstr("AllGather takes a Sliced operand, not Local"), HasSubstr("use AllReduce")));
  EXPECT_THAT(user_error_of([&] { AllGather(r); }),
              HasSubstr("A Replicated value is already whole"));
  EXPECT_THAT(user_error_of([&] { Broadcast(s, 0); }),
              HasSubstr("Broadcast takes a Local operand (the root's value goes to "
                        "every rank), not Sliced(0)"));
  EXPECT_THAT(user_error_of([&] { Broadcast(l, -1); }), HasSubstr("Broadcast root -1 is negative"));
  EXPECT_THAT(user_error_of([&] { Shift(s); }),
              AllOf(HasSubstr("shift(s)"),
                    HasSubstr("Shift takes a Local operand (each rank passes its own piece to the "
                              "next rank), not Sliced(0): s: f32[N] Sliced(0)"),
                    HasSubstr("hand each rank its piece as a Local input")));
  EXPECT_THAT(user_error_of([&] { Shift(r); }),
              HasSubstr("Shift takes a Local operand (each rank passes its own piece to the "
                        "next rank), not Replicated"));
  EXPECT_THAT(user_error_of([&] { ReduceScatter(Sum, l, 1); }),
              HasSubstr("ReduceScatter along dim 1 of l: f32[N] Local: the dim must be in [0, 1)"));
}

TEST(LayoutErrors, ScatterNeedsReplicated) {
  Program p("p");
  const Expr l = p.input(F32, {4}, Local, "l");
  const Expr r = p.input(F32, {4}, Replicated, "r");
  EXPECT_THAT(user_error_of([&] { scatter(l, 0); }),
              HasSubstr("scatter takes a Replicated tensor (each rank keeps its part), not Local"));
  EXPECT_THAT(user_error_of([&] { scatter(r, 1); }),
              HasSubstr("scatter along dim 1 of r: f32[4] Replicated: the dim must be "
                        "in [0, 1)"));
}

// ------------------------------------------------------------------------------------- shapes

TEST(ShapeErrors, ShapesDoNotBroadcast) {
  Program p("p");
  const Expr a = p.input(F32, {"B", "H"}, Replicated, "a");
  const Expr b = p.input(F32, {"B"}, Replicated, "b");
  EXPECT_THAT(
      user_error_of([&] { a + b; }),
      AllOf(HasSubstr("shapes a: f32[B, H] Replicated; b: f32[B] Replicated do not broadcast"),
            HasSubstr("a suffix of the result's [B, H]")));
}

TEST(ShapeErrors, SlicedOperandMustNotBroadcast) {
  Program p("p");
  const Expr a = p.input(F32, {"B", "H"}, Replicated, "a");
  const Expr b = p.input(F32, {"H"}, Sliced(0), "b");
  EXPECT_THAT(user_error_of([&] { a + b; }),
              HasSubstr("Sliced operand b has shape [H], but the result has shape [B, H]; a Sliced "
                        "operand must have "
                        "the result's full shape"));
}

TEST(ShapeErrors, Matmul) {
  Program p("p");
  const Expr v = p.input(F32, {"K"}, Replicated, "v");
  const Expr a = p.input(F32, {"M", "K"}, Replicated, "a");
  const Expr b = p.input(F32, {"J", "N"}, Replicated, "b");
  const Expr c = p.input(F32, {2, "M", "K"}, Replicated, "c");
  const Expr d = p.input(F32, {3, "K", "N"}, Replicated, "d");
  EXPECT_THAT(user_error_of([&] { matmul(v, a); }),
              HasSubstr("matmul needs operands of rank 2 or more"));
  EXPECT_THAT(user_error_of([&] { matmul(a, b); }),
              HasSubstr("contraction dims differ: A's last dim is K and B's second-to-last is J"));
  EXPECT_THAT(user_error_of([&] { matmul(c, d); }), HasSubstr("batch dims differ"));
}

TEST(LayoutErrors, MatmulLayoutsWithoutARule) {
  Program p("p");
  const Expr l = p.input(F32, {4, 4}, Local, "l");
  const Expr r = p.input(F32, {4, 4}, Replicated, "r");
  const Expr s0 = p.input(F32, {4, 4}, Sliced(0), "s0");
  EXPECT_THAT(user_error_of([&] { matmul(l, r); }),
              AllOf(HasSubstr("operand layouts Local x Replicated (l: f32[4, 4] Local; r: f32[4, "
                              "4] Replicated) have no "
                              "matmul rule"),
                    HasSubstr("a sliced contraction dim"), HasSubstr("-> Partial")));
  // Rows of A sliced and the contraction dim of B sliced: each rank would need all of B's rows.
  EXPECT_THAT(user_error_of([&] { matmul(s0, s0); }),
              HasSubstr("operand layouts Sliced(0) x Sliced(0)"));
}

TEST(ShapeErrors, ReduceDim) {
  Program p("p");
  const Expr a = p.input(F32, {2, 3}, Replicated, "a");
  EXPECT_THAT(user_error_of([&] { reduce(Sum, a, 2); }),
              HasSubstr("reduce over dim 2 of a: f32[2, 3] Replicated: the dim must be in [0, 2)"));
}

TEST(ShapeErrors, UnboundSymbol) {
  const Program p = workloads::megatron_layer();
  EXPECT_THAT(
      user_error_of([&] {
        p.resolve_shapes({{"B", 2}, {"H", 3}});
      }),
      HasSubstr(
          "program 'megatron_layer': symbol 'K' (in the shape of input 'x' [B, K]) is not bound"));
}

// -------------------------------------------------------------------------------------- dtypes

TEST(DtypeErrors, MixWithoutCast) {
  Program p("adam");
  const Expr g = p.input(BF16, {"N"}, Replicated, "g1");
  const Expr m = p.input(F32, {"N"}, Replicated, "m");
  EXPECT_THAT(user_error_of([&] { m + g; }),
              AllOf(HasSubstr("stage %2 = add(m, g1)"),
                    HasSubstr("operands mix dtypes: m: f32[N] Replicated; g1: bf16[N] "
                              "Replicated"),
                    HasSubstr("cast(x, f32)")));
  const Expr x = p.input(F16, {4, 4}, Replicated, "x");
  const Expr y = p.input(F32, {4, 4}, Replicated, "y");
  EXPECT_THAT(user_error_of([&] { matmul(x, y); }), HasSubstr("operands mix dtypes"));
  const Expr h = p.scalar(BF16, "h");
  const Expr k = p.scalar("k");
  EXPECT_THAT(user_error_of([&] { h* k; }),
              HasSubstr("operands mix dtypes"));  // two scalars must agree
}

// -------------------------------------------------------------------------------------- update

TEST(UpdateErrors, TargetMustBeAnInput) {
  Program p("p");
  const Expr w = p.input(F32, {"N"}, Replicated, "w");
  const Expr w2 = (w * 2).named("w2");
  EXPECT_THAT(user_error_of([&] { update(w2, w); }),
              AllOf(HasSubstr("the target w2: f32[N] Replicated is not an input"),
                    HasSubstr("output(expr, name)")));
}

TEST(UpdateErrors, UpdatedTwice) {
  Program p("p");
  const Expr w = p.input(F32, {"N"}, Replicated, "w");
  const Expr k = p.scalar("k");
  update(w, k * w).named("w1");
  EXPECT_THAT(user_error_of([&] { update(w, k + 1); }),
              HasSubstr("input 'w' is already updated by w1; an input is updated at most once"));
}

TEST(UpdateErrors, ReadAfterUpdate) {
  Program p("p");
  const Expr w = p.input(F32, {"N"}, Replicated, "w");
  update(w, w * 0.5).named("w1");
  EXPECT_THAT(user_error_of([&] { w + 1; }),
              AllOf(HasSubstr("reads input 'w' after w1 overwrote it in place"),
                    HasSubstr("use the update's result")));
  EXPECT_THAT(user_error_of([&] { p.output(w, "old"); }),
              HasSubstr("output 'old' reads input 'w', which w1 overwrites in place"));
}

TEST(UpdateErrors, OutputThenUpdate) {
  Program p("p");
  const Expr w = p.input(F32, {"N"}, Replicated, "w");
  p.output(w, "w_out");
  EXPECT_THAT(user_error_of([&] { update(w, w * 0.5); }),
              HasSubstr("input 'w' is declared output 'w_out', which would read its old value "
                        "after this update"));
}

TEST(UpdateErrors, ValueMustMatchTheInput) {
  Program p("p");
  const Expr w = p.input(F32, {"N"}, Replicated, "w");
  const Expr h = p.input(BF16, {"N"}, Replicated, "h");
  const Expr s = p.input(F32, {"N"}, Sliced(0), "s");
  const Expr t = p.input(F32, {"M"}, Replicated, "t");
  EXPECT_THAT(user_error_of([&] { update(w, h); }),
              HasSubstr("the value has dtype bf16, the input f32: w: f32[N] Replicated; h: bf16[N] "
                        "Replicated. Convert it "
                        "with cast(value, f32)"));
  EXPECT_THAT(user_error_of([&] { update(w, t); }),
              HasSubstr("the value's shape [M] differs from the input's [N]"));
  EXPECT_THAT(user_error_of([&] { update(w, s); }),
              AllOf(HasSubstr("the value's layout Sliced(0) differs from the input's Replicated"),
                    HasSubstr("AllGather the value first")));
}

// ------------------------------------------------------------------------ groups, send, recv

TEST(GroupErrors, OperandsFromDifferentGroups) {
  Program p("pipe", 2);
  const Expr a = p.input(F32, {"N"}, Replicated, "a", 0);
  const Expr b = p.input(F32, {"N"}, Replicated, "b", 1);
  EXPECT_THAT(
      user_error_of([&] { a + b; }),
      AllOf(HasSubstr("operands live in different groups: a is computed by group 0, b by group 1"),
            HasSubstr("Send(x, group) and Recv there"), HasSubstr("a: f32[N] Replicated @0")));
}

TEST(GroupErrors, InputGroupOutOfRange) {
  Program p("pipe", 2);
  EXPECT_THAT(user_error_of([&] { p.input(F32, {"N"}, Replicated, "a", 2); }),
              HasSubstr("input in group 2, but the program has 2 group(s), numbered 0 to 1"));
  EXPECT_THAT(user_error_of([] { Program q("q", 0); }), HasSubstr("program 'q': 0 groups"));
}

TEST(GroupErrors, SendRules) {
  Program one("single");
  const Expr x1 = one.input(F32, {"N"}, Replicated, "x");
  EXPECT_THAT(user_error_of([&] { Send(x1, 1); }),
              HasSubstr("Send needs a program of 2 or more groups"));

  Program p("pipe", 2);
  const Expr x = p.input(F32, {"N"}, Replicated, "x", 0);
  const Expr k = p.scalar("k");
  EXPECT_THAT(user_error_of([&] { Send(x, 0); }), HasSubstr("Send from group 0 to itself"));
  EXPECT_THAT(user_error_of([&] { Send(x, 5); }),
              HasSubstr("Send to group 5, but the program has groups 0 to 1"));
  EXPECT_THAT(user_error_of([&] { Send(k, 1); }),
              HasSubstr("exists on every rank (a scalar or constant)"));
  const Expr s = Send(x, 1).named("s");
  EXPECT_THAT(user_error_of([&] { s + 1; }),
              HasSubstr("operand s is a send, which holds no value; use the Recv(...) of it in "
                        "group 1"));
  EXPECT_THAT(user_error_of([&] { p.output(s, "s"); }),
              HasSubstr("output 's' names s = send(x) to=@1"));
  EXPECT_THAT(user_error_of([&] { Recv(x); }),
              HasSubstr("Recv takes the Send(...) it pairs with, not x"));
  const Expr r = Recv(s).named("r");
  EXPECT_THAT(user_error_of([&] { Recv(s); }), HasSubstr("s is already received by r"));
  (void)r;
}

TEST(GroupErrors, SendNeverReceived) {
  Program p("pipe", 2);
  const Expr x = p.input(F32, {"N"}, Replicated, "x", 0);
  p.output(x * 2, "y");
  Send(x, 1).named("lost");
  EXPECT_THAT(user_error_of([&] { p.validate(); }),
              HasSubstr("lost = send(x) to=@1 : f32[N] Replicated @0 is received 0 times; each "
                        "send pairs with exactly one "
                        "recv in group 1"));
}

// ---------------------------------------------------------------------------- construction

TEST(BuildErrors, ExprsOfTwoPrograms) {
  Program a("a");
  Program b("b");
  const Expr x = a.input(F32, {4}, Replicated, "x");
  const Expr y = b.input(F32, {4}, Replicated, "y");
  EXPECT_THAT(user_error_of([&] { x + y; }),
              HasSubstr("add: operands come from different programs, 'a' (x) and 'b' (y)"));
  EXPECT_THAT(user_error_of([&] { b.output(x, "x"); }),
              HasSubstr("output 'x' is stage x of another program, 'a'"));
}

TEST(BuildErrors, UndefinedExpr) {
  Program p("p");
  const Expr x = p.input(F32, {4}, Replicated, "x");
  Expr nothing;
  EXPECT_THAT(user_error_of([&] { x* nothing; }),
              HasSubstr("mul: an operand is an undefined Expr"));
  EXPECT_THAT(user_error_of([&] { nothing + 1.0; }),
              HasSubstr("add: an operand is an undefined Expr"));
}

TEST(BuildErrors, UndefinedExprNamedOrOutput) {
  Program p("p");
  Expr nothing;
  EXPECT_THAT(user_error_of([&] { nothing.named("x"); }),
              HasSubstr("cannot name an undefined Expr 'x'"));
  EXPECT_THAT(user_error_of([&] { nothing.type(); }), HasSubstr("use of an undefined Expr"));
  EXPECT_THAT(user_error_of([&] { p.output(nothing, "y"); }),
              HasSubstr("program 'p': output 'y' is an undefined Expr"));
}

TEST(BuildErrors, Names) {
  Program p("p");
  const Expr x = p.input(F32, {4}, Replicated, "x");
  EXPECT_THAT(
      user_error_of([&] { p.input(F32, {4}, Replicated, "x"); }),
      HasSubstr(
          "the name 'x' is taken by stage x = input : f32[4] Replicated; names must be unique"));
  EXPECT_THAT(user_error_of([&] { (x + 1).named("2x"); }),
              HasSubstr("'2x' is not a valid stage name"));
  EXPECT_THAT(user_error_of([&] { p.input(F32, {4}, Replicated, ""); }),
              HasSubstr("an input needs a name"));
  EXPECT_THAT(user_error_of([&] { p.scalar(""); }), HasSubstr("a scalar needs a name"));
  p.output(x, "y");
  EXPECT_THAT(user_error_of([&] { p.output(x, "y"); }), HasSubstr("output 'y' is declared twice"));
  EXPECT_THAT(user_error_of([&] { p.output(x, "a b"); }),
              HasSubstr("'a b' is not a valid output name"));
}

TEST(BuildErrors, Inputs) {
  Program p("p");
  EXPECT_THAT(
      user_error_of([&] {
        p.input(F32, {4, 2}, Sliced(2), "x");
      }),
      HasSubstr("layout Sliced(2) of an input of shape [4, 2]: the sliced dim must be in [0, 2)"));
  EXPECT_THAT(user_error_of([&] { p.input(F32, {}, Sliced(0), "s"); }),
              HasSubstr("the sliced dim must be in [0, 0)"));
  EXPECT_THAT(user_error_of([&] { p.input(F32, {4}, Partial, "x"); }),
              HasSubstr("an input is Local, Replicated or Sliced(dim), not Partial"));
  EXPECT_THAT(user_error_of([&] { p.input(F32, {-3}, Local, "x"); }),
              HasSubstr("input shape [-3] has a negative extent"));
}

TEST(BuildErrors, Dropout) {
  Program p("p");
  const Expr x = p.input(F32, {4}, Replicated, "x");
  const Expr seed = p.scalar("seed");
  EXPECT_THAT(user_error_of([&] { dropout(x, 1.0, seed); }),
              HasSubstr("dropout probability 1 is outside [0, 1)"));
  EXPECT_THAT(user_error_of([&] { dropout(x, 0.1, seed + 1); }),
              HasSubstr("is computed; a dropout seed is a scalar bound at run time"));
  EXPECT_THAT(user_error_of([&] { dropout(x, 0.1, p.constant(1.5)); }),
              HasSubstr("the seed 1.5 is not an integer in [0, 2^53)"));
}

TEST(BuildErrors, RawStagesAreChecked) {
  Program p("p");
  const Expr x = p.input(F32, {4}, Replicated, "x");
  EXPECT_THAT(user_error_of([&] { p.add(Op::Add, {x.id()}); }),
              HasSubstr("add takes 2 operand(s), given 1"));
  EXPECT_THAT(user_error_of([&] { p.add(Op::Neg, {7}); }),
              HasSubstr("operand %7 does not exist yet"));
  EXPECT_THAT(user_error_of([&] { p.stage(9); }),
              HasSubstr("program 'p' has no stage %9 (it has 1 stages)"));
}

// ---------------------------------------------------------------------------- whole program

TEST(ProgramErrors, Cycle) {
  // The builder cannot make a cycle; a program assembled from stages by hand or by a pass can.
  Program p("loop");
  const Expr x = p.input(F32, {4}, Replicated, "x");
  const Expr a = (x + 1).named("a");
  const Expr b = (a * 2).named("b");
  p.output(b, "b");
  std::vector<Stage> stages = p.stages();
  stages[static_cast<size_t>(a.id())].args[0] = b.id();  // a = b + 1, b = a * 2
  EXPECT_THAT(user_error_of([&] { Program::assemble("loop", 1, stages, p.outputs()); }),
              AllOf(HasSubstr("program 'loop': cycle a -> b -> a (each stage uses the next)"),
                    HasSubstr("a DAG")));
}

TEST(ProgramErrors, OutOfOrder) {
  Program p("order");
  const Expr x = p.input(F32, {4}, Replicated, "x");
  const Expr y = (x + 1).named("y");
  const Expr z = (x * 2).named("z");
  p.output(y, "y");
  std::vector<Stage> stages = p.stages();
  stages[static_cast<size_t>(y.id())].args[0] =
      z.id();  // y uses z, which comes later, without a cycle
  EXPECT_THAT(
      user_error_of([&] { Program::assemble("order", 1, stages, p.outputs()); }),
      HasSubstr("stage y uses z, which comes after it; stages must be in dependency order"));
}

TEST(ProgramErrors, OperandThatDoesNotExist) {
  Program p("p");
  const Expr x = p.input(F32, {4}, Replicated, "x");
  p.output((x + 1).named("y"), "y");
  std::vector<Stage> stages = p.stages();
  stages.back().args[0] = 42;
  EXPECT_THAT(user_error_of([&] { Program::assemble("p", 1, stages, p.outputs()); }),
              HasSubstr("stage y uses %42, which does not exist (the program has 3 stages)"));
}

TEST(ProgramErrors, OutputNotProduced) {
  Program p("p");
  const Expr x = p.input(F32, {4}, Replicated, "x");
  p.output(x * 2, "y");
  EXPECT_THAT(user_error_of([&] {
                Program::assemble("p", 1, p.stages(), {{"y", 17}});
              }),
              HasSubstr("output 'y' is not produced by any stage (it refers to %17, and the "
                        "program has 3 stages)"));
}

TEST(ProgramErrors, ProducesNothing) {
  Program p("idle");
  const Expr x = p.input(F32, {4}, Replicated, "x");
  x + 1;
  EXPECT_THAT(user_error_of([&] { p.validate(); }),
              HasSubstr("program 'idle' produces nothing: declare a result with output(expr, name) "
                        "or write an input with "
                        "update(input, expr)"));
}

TEST(ProgramErrors, UnknownWorkload) {
  EXPECT_THAT(user_error_of([] { workloads::by_name("adamw"); }),
              HasSubstr("unknown workload 'adamw'; the workloads are: adam, lamb, megatron_layer, "
                        "pipeline_stage"));
}

}  // namespace
}  // namespace tandem::dsl
