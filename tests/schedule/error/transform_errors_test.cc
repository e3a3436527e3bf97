// Every misuse of a transformation is a UserError that names the transformation, the stage and the
// rule it breaks; these tests check the messages a user reads, and that a refused request leaves
// the schedule unchanged.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/dsl/dsl.h"
#include "tandem/schedule/transforms.h"

namespace tandem::schedule {
namespace {

using namespace tandem::dsl;  // NOLINT: the builder's vocabulary

// Runs `f` on `s`, expects a UserError whose message contains every one of `parts`, and checks that
// the schedule is unchanged.
void expect_error(Schedule& s, const std::function<void(Schedule&)>& f,
                  const std::vector<std::string>& parts) {
  const std::string before = s.program().str();
  const size_t fused = s.fused().size(), overlaps = s.overlaps().size(),
               history = s.history().size();
  try {
    f(s);
    ADD_FAILURE() << "no error; expected one containing '" << parts.front() << "'";
  } catch (const UserError& e) {
    const std::string what = e.what();
    for (const std::string& p : parts)
      EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' not in: " << what;
  }
  EXPECT_EQ(s.program().str(), before);
  EXPECT_EQ(s.fused().size(), fused);
  EXPECT_EQ(s.overlaps().size(), overlaps);
  EXPECT_EQ(s.history().size(), history);
}

// --------------------------------------------------------------------------------------- split

TEST(SplitErrors, NotAnAllReduce) {
  Schedule s(workloads::adam());
  expect_error(s, [](Schedule& x) { x.split("g1"); }, {"split(g1)", "mul", "not an AllReduce"});
}

TEST(SplitErrors, ScalarHasNoParts) {
  Program p("scalar_ar");
  const Expr g = p.input(F32, {}, Local, "g");
  p.output(AllReduce(Sum, g).named("total"), "total");
  Schedule s(p);
  expect_error(s, [](Schedule& x) { x.split("total"); },
               {"split(total)", "shape [] (a scalar)", "no parts"});
}

TEST(SplitErrors, AfterFusing) {
  Schedule s(workloads::megatron_layer());
  s.fuse({"z", "a", "d", "out"});
  expect_error(s, [](Schedule& x) { x.split("z"); },
               {"split(z)", "already fused", "before fuse and overlap"});
}

TEST(SplitErrors, UnknownStage) {
  Schedule s(workloads::adam());
  expect_error(s, [](Schedule& x) { x.split("nope"); },
               {"split", "no stage named 'nope'", "g_sum"});
  expect_error(s, [](Schedule& x) { x.split(999); }, {"split", "no stage %999"});
}

// ------------------------------------------------------------------------------------- reorder

TEST(ReorderErrors, NotAnAllGather) {
  Schedule s(workloads::adam());
  // g is the Local gradient: there is no gather to move.
  expect_error(s, [](Schedule& x) { x.reorder("g", {"g1"}); },
               {"reorder(g", "input", "not an AllGather", "split"});
}

TEST(ReorderErrors, StageDoesNotConsumeTheGather) {
  Schedule s(workloads::adam());
  const auto [rs, ag] = s.split("g_sum");
  (void)rs;
  expect_error(s, [ag = ag](Schedule& x) { x.reorder(ag, {"bc1"}); },
               {"reorder(g_sum.ag", "bc1 does not use g_sum.ag", "consume"});
}

TEST(ReorderErrors, ScalarTarget) {
  Schedule s(workloads::lamb());
  s.split("g_sum");
  expect_error(s, [](Schedule& x) { x.reorder("g_sum.ag", {"trust"}); },
               {"trust is scalar arithmetic", "no slice"});
}

TEST(ReorderErrors, PastAMatmul) {
  Program p("gather_then_matmul");
  const Expr g = p.input(F32, {"M", "K"}, Local, "g");
  const Expr w = p.input(F32, {"K", "N"}, Replicated, "w");
  const Expr a = AllReduce(Sum, g).named("a");
  p.output(matmul(a, w).named("y"), "y");
  Schedule s(p);
  s.split("a");
  expect_error(s, [](Schedule& x) { x.reorder("a.ag", {"y"}); }, {"y is a matmul", "element-wise"});
}

TEST(ReorderErrors, ShapeOfTheSlice) {
  Program p("broadcast_consumer");
  const Expr g = p.input(F32, {"N"}, Local, "g");
  const Expr x = p.input(F32, {"B", "N"}, Replicated, "x");
  const Expr a = AllReduce(Sum, g).named("a");
  p.output((x * a).named("y"), "y");
  Schedule s(p);
  s.split("a");
  expect_error(s, [](Schedule& q) { q.reorder("a.ag", {"y"}); },
               {"y has shape [B, N]", "a.ag has shape [N]", "must have its shape"});
}

TEST(ReorderErrors, SliceAlongAnotherDim) {
  Program p("two_slicings");
  const Expr g = p.input(F32, {"B", "N"}, Local, "g");
  const Expr x = p.input(F32, {"B", "N"}, Sliced(1), "x");
  const Expr a = AllReduce(Sum, g).named("a");
  p.output(AllGather((a + x).named("y")).named("y_all"), "y");
  Schedule s(p);
  s.split("a");
  expect_error(s, [](Schedule& q) { q.reorder("a.ag", {"y"}); },
               {"y reads x, which is Sliced(1)", "along dim 0"});
}

TEST(ReorderErrors, AfterFusing) {
  Schedule s(workloads::adam());
  s.split("g_sum");
  s.fuse({"g1", "m1"});
  expect_error(s,
               [](Schedule& x) {
                 x.reorder("g_sum.ag", {"m1", "v1", "w1"});
               },
               {"already fused", "before fuse"});
}

// ---------------------------------------------------------------------------------------- fuse

TEST(FuseErrors, TwoCollectives) {
  Program p("two_allreduces");
  const Expr g = p.input(F32, {"N"}, Local, "g");
  const Expr h = p.input(F32, {"N"}, Local, "h");
  const Expr a = AllReduce(Sum, g).named("a");
  const Expr b = AllReduce(Sum, h).named("b");
  p.output((a + b).named("c"), "c");
  Schedule s(p);
  expect_error(s,
               [](Schedule& x) {
                 x.fuse({"a", "b", "c"});
               },
               {"fuse(", "a and b are both collectives", "at most one collective"});
}

TEST(FuseErrors, WhatCannotBeFused) {
  Schedule m(workloads::megatron_layer());
  expect_error(m, [](Schedule& x) { x.fuse({"y", "z"}); }, {"y is a matmul", "overlap"});
  expect_error(m, [](Schedule& x) { x.fuse({"bias", "a"}); }, {"bias is an input"});
  Schedule a(workloads::adam());
  expect_error(a,
               [](Schedule& x) {
                 x.fuse({"bc1", "mhat"});
               },
               {"bc1 is scalar arithmetic", "outside every loop"});
  expect_error(a, [](Schedule& x) { x.fuse({"r"}); }, {"at least two stages"});
  Schedule p(workloads::pipeline_stage());
  expect_error(p,
               [](Schedule& x) {
                 x.fuse({"out", "out_to_next"});
               },
               {"out_to_next is a send", "overlap"});
}

TEST(FuseErrors, Cycle) {
  // LAMB's update needs the trust ratio, which needs ||r||, which the fused loop would compute.
  Schedule s(workloads::lamb());
  expect_error(s,
               [](Schedule& x) {
                 x.fuse({"r", "w1"});
               },
               {"fuse({r and w1})", "would make a cycle", "trust",
                "nothing outside it may both need and feed it"});
}

TEST(FuseErrors, NormUsedInItsOwnLoop) {
  Program p("norm_then_scale");
  const Expr x = p.input(F32, {"N"}, Replicated, "x");
  const Expr n = norm(x).named("n");
  p.output((x * n).named("y"), "y");
  Schedule s(p);
  expect_error(
      s,
      [](Schedule& q) {
        q.fuse({"n", "y"});
      },
      {"y uses n, which the same fused stage accumulates", "complete only after the loop"});
}

TEST(FuseErrors, InputOfTheCollective) {
  Program p("scaled_allreduce");
  const Expr g = p.input(F32, {"N"}, Local, "g");
  const Expr h = (g * 2.0).named("h");
  const Expr a = AllReduce(Sum, h).named("a");
  p.output((a + 1.0).named("b"), "b");
  Schedule s(p);
  expect_error(s,
               [](Schedule& x) {
                 x.fuse({"h", "a", "b"});
               },
               {"h computes the input of a", "only computations on a collective's result"});
}

TEST(FuseErrors, DomainsDiffer) {
  Program p("two_shapes");
  const Expr x = p.input(F32, {"N"}, Replicated, "x");
  const Expr y = p.input(F32, {"M"}, Replicated, "y");
  p.output((x * 2.0).named("a"), "a");
  p.output((y * 2.0).named("b"), "b");
  Schedule s(p);
  expect_error(s, [](Schedule& q) { q.fuse({"a", "b"}); }, {"b has shape [M]", "runs over [N]"});
}

TEST(FuseErrors, GatherWithoutItsScatter) {
  Schedule s(workloads::adam());
  s.split("g_sum");
  expect_error(s,
               [](Schedule& x) {
                 x.fuse({"g_sum.ag", "g1"});
               },
               {"g_sum.ag is an AllGather", "only with the ReduceScatter"});
}

TEST(FuseErrors, ScatterAlongAnInnerDim) {
  Program p("rs_dim1");
  const Expr g = p.input(F32, {"B", "N"}, Local, "g");
  const Expr r = ReduceScatter(Sum, g, 1).named("r");
  p.output(AllGather((r * 2.0).named("s")).named("t"), "t");
  Schedule s(p);
  expect_error(s, [](Schedule& x) { x.fuse({"r", "s"}); }, {"r scatters along dim 1", "dim 0"});
}

TEST(FuseErrors, FusedTwice) {
  Schedule s(workloads::adam());
  s.fuse({"g_sum", "g1", "m1"});
  expect_error(s, [](Schedule& x) { x.fuse({"m1", "v1"}); }, {"m1 is already in fused stage #0"});
}

// ------------------------------------------------------------------------------------- overlap

TEST(OverlapErrors, NeedsAProducerAndItsConsumer) {
  Schedule s(workloads::megatron_layer());
  expect_error(s, [](Schedule& x) { x.overlap({"y"}); }, {"overlap({y})", "at least two stages"});
  expect_error(s,
               [](Schedule& x) {
                 x.overlap({"z", "y"});
               },
               {"y does not use z", "must consume the one before it"});
  expect_error(s, [](Schedule& x) { x.overlap({"y", "z"}, 0); }, {"0 blocks", "at least 1"});
}

// A Shift moves whole pieces between ranks: no per-chunk hook to fuse into, no row blocks.
TEST(OverlapErrors, AShiftIsNeitherFusedNorOverlapped) {
  Program p("ring");
  const Expr x = p.input(F32, {"N", "C"}, Local, "x");
  const Expr y = (x * 2.0).named("y");
  const Expr s = Shift(y).named("s");
  p.output((s + 1.0).named("z"), "z");
  Schedule sch(p);
  expect_error(sch,
               [](Schedule& q) {
                 q.fuse({"s", "z"});
               },
               {"s is a Shift, which has no per-chunk hook"});
  expect_error(sch,
               [](Schedule& q) {
                 q.overlap({"y", "s"});
               },
               {"overlap({y and s})", "s is a Shift (shift)", "run block by block"});
}

TEST(OverlapErrors, SliceLeavesTheOverlap) {
  Schedule s(workloads::megatron_layer());
  s.split("z");
  s.reorder("z.ag", {"out"});
  expect_error(s,
               [](Schedule& x) {
                 x.overlap({"y", "z.rs"});
               },
               {"z.rs is Sliced and used by a outside the overlapped stages",
                "split among the ranks separately"});
}

TEST(OverlapErrors, ReductionInside) {
  Program p("norm_after_allreduce");
  const Expr g = p.input(F32, {"N"}, Local, "g");
  const Expr a = AllReduce(Sum, g).named("a");
  const Expr n = norm(a).named("n");
  p.output(n, "n");
  Schedule s(p);
  expect_error(s, [](Schedule& x) { x.overlap({"a", "n"}); }, {"n", "not blockable"});
}

TEST(OverlapErrors, OverlappedTwice) {
  Schedule s(workloads::pipeline_stage());
  s.overlap({"y", "z"});
  expect_error(s, [](Schedule& x) { x.overlap({"z", "a"}); }, {"z is already overlapped"});
}

// ------------------------------------------------------------------------------------ as_slice

TEST(AsSliceErrors, NotAReplicatedInput) {
  Schedule s(workloads::adam());
  expect_error(s, [](Schedule& x) { x.as_slice("g1"); }, {"as_slice(g1)", "not an input"});
  expect_error(s, [](Schedule& x) { x.as_slice("g"); },
               {"input 'g' is Local", "only a Replicated input"});
}

TEST(AsSliceErrors, ReadWhole) {
  Schedule s(workloads::adam());
  expect_error(s, [](Schedule& x) { x.as_slice("m"); },
               {"as_slice(m)", "reads 'm' whole", "reorder the AllGather"});
}

TEST(AsSliceErrors, UpdateComputedWhole) {
  Program p("whole_update");
  const Expr m = p.input(F32, {"N"}, Replicated, "m");
  const Expr w = p.input(F32, {"N"}, Replicated, "w");
  const Expr part = (scatter(m, 0) * 2.0).named("part");
  p.output(AllGather(part).named("all"), "all");
  update(m, (w * 3.0).named("fresh")).named("m1");
  Schedule s(p);
  expect_error(s, [](Schedule& x) { x.as_slice("m"); },
               {"its update m1 writes fresh", "computed whole"});
}

TEST(AsSliceErrors, ScalarInput) {
  Program p("scalar_state");
  const Expr c = p.input(F32, {}, Replicated, "c");
  p.output((c * 2.0).named("d"), "d");
  Schedule s(p);
  expect_error(s, [](Schedule& x) { x.as_slice("c"); }, {"has shape [], which has no slice"});
}

}  // namespace
}  // namespace tandem::schedule
