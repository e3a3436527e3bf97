// The DSL's IR: type, shape and layout inference under ir.h's layout rules, Program::str() golden
// text, validation, shape resolution, and the visitor and mutator bases.
#include <gtest/gtest.h>

#include <map>

#include "tandem/dsl/dsl.h"

namespace tandem::dsl {
namespace {

// ------------------------------------------------------------------------------- golden text

TEST(ProgramStr, SmallProgramOneStageALine) {
  Program p("axpy");
  const Expr a = p.scalar("a");
  const Expr x = p.input(F32, {"N"}, Sliced(0), "x");
  const Expr y = p.input(BF16, {"N"}, Replicated, "y");
  const Expr ax = a * x;
  const Expr yw = cast(y, F32);
  const Expr s = (ax + yw).named("s");
  p.output(AllGather(s).named("s_all"), "result");
  EXPECT_EQ(p.str(),
            "program axpy\n"
            "  a = scalar : f32[] Replicated\n"
            "  x = input : f32[N] Sliced(0)\n"
            "  y = input : bf16[N] Replicated\n"
            "  %3 = mul(a, x) : f32[N] Sliced(0)\n"
            "  %4 = cast(y) : f32[N] Replicated\n"
            "  s = add(%3, %4) : f32[N] Sliced(0)\n"
            "  s_all = allgather(s) : f32[N] Replicated\n"
            "  output result = s_all\n");
}

TEST(ProgramStr, AttributesArePrinted) {
  Program p("attrs");
  const Expr x = p.input(F16, {4, "M"}, Local, "x");
  const Expr r = reduce(Max, x, 1);
  const Expr rs = ReduceScatter(Sum, x, 1);
  const Expr b = Broadcast(x, 1);
  const Expr sc = scatter(b, 0);
  const Expr d = dropout(sc, 0.25, uint64_t{7});
  p.output(r, "r");
  p.output(rs, "rs");
  p.output(d, "d");
  EXPECT_EQ(p.str(),
            "program attrs\n"
            "  x = input : f16[4, M] Local\n"
            "  %1 = reduce.max(x) dim=1 : f16[4] Local\n"
            "  %2 = reduce_scatter.sum(x) dim=1 : f16[4, M] Sliced(1)\n"
            "  %3 = broadcast(x) root=1 : f16[4, M] Replicated\n"
            "  %4 = scatter(%3) dim=0 : f16[4, M] Sliced(0)\n"
            "  %5 = const 7 : f32[] Replicated\n"
            "  %6 = dropout(%4, %5) p=0.25 : f16[4, M] Sliced(0)\n"
            "  output r = %1\n"
            "  output rs = %2\n"
            "  output d = %6\n");
}

TEST(ProgramStr, KvRing) {
  EXPECT_EQ(workloads::kv_ring().str(),
            "program kv_ring\n"
            "  kv = input : f32[N] Local\n"
            "  kv_next = shift(kv) : f32[N] Local\n"
            "  output kv_next = kv_next\n");
}

TEST(ProgramStr, MegatronLayer) {
  EXPECT_EQ(workloads::megatron_layer().str(),
            "program megatron_layer\n"
            "  x = input : f32[B, K] Sliced(1)\n"
            "  w = input : f32[K, H] Sliced(0)\n"
            "  bias = input : f32[H] Replicated\n"
            "  residual = input : f32[B, H] Replicated\n"
            "  seed = scalar : f32[] Replicated\n"
            "  y = matmul(x, w) : f32[B, H] Partial\n"
            "  z = allreduce.sum(y) : f32[B, H] Replicated\n"
            "  a = add(z, bias) : f32[B, H] Replicated\n"
            "  d = dropout(a, seed) p=0.1 : f32[B, H] Replicated\n"
            "  out = add(d, residual) : f32[B, H] Replicated\n"
            "  output out = out\n");
}

TEST(ProgramStr, PipelineStageShowsGroups) {
  const std::string s = workloads::pipeline_stage().str();
  EXPECT_NE(s.find("program pipeline_stage (2 groups)\n"), std::string::npos) << s;
  EXPECT_NE(s.find("  x = input : f32[B, K] Sliced(1) @0\n"), std::string::npos) << s;
  EXPECT_NE(s.find("  seed = scalar : f32[] Replicated\n"), std::string::npos) << s;  // every group
  EXPECT_NE(s.find("  out_to_next = send(out) to=@1 : f32[B, H] Replicated @0\n"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("  h = recv(out_to_next) : f32[B, H] Replicated @1\n"), std::string::npos) << s;
  EXPECT_NE(s.find("  output h = h\n"), std::string::npos) << s;
}

TEST(ProgramStr, AdamGolden) {
  EXPECT_EQ(workloads::adam().str(),
            "program adam\n"
            "  lr = scalar : f32[] Replicated\n"
            "  beta1 = scalar : f32[] Replicated\n"
            "  beta2 = scalar : f32[] Replicated\n"
            "  eps = scalar : f32[] Replicated\n"
            "  weight_decay = scalar : f32[] Replicated\n"
            "  step = scalar : f32[] Replicated\n"
            "  grad_scale = scalar : f32[] Replicated\n"
            "  g = input : bf16[N] Local\n"
            "  w = input : f32[N] Replicated\n"
            "  m = input : f32[N] Replicated\n"
            "  v = input : f32[N] Replicated\n"
            "  g_sum = allreduce.sum(g) : bf16[N] Replicated\n"
            "  %12 = cast(g_sum) : f32[N] Replicated\n"
            "  g1 = mul(grad_scale, %12) : f32[N] Replicated\n"
            "  %14 = mul(beta1, m) : f32[N] Replicated\n"
            "  %15 = const 1 : f32[] Replicated\n"
            "  %16 = sub(%15, beta1) : f32[] Replicated\n"
            "  %17 = mul(%16, g1) : f32[N] Replicated\n"
            "  %18 = add(%14, %17) : f32[N] Replicated\n"
            "  m1 = update(m, %18) : f32[N] Replicated\n"
            "  %20 = mul(beta2, v) : f32[N] Replicated\n"
            "  %21 = const 1 : f32[] Replicated\n"
            "  %22 = sub(%21, beta2) : f32[] Replicated\n"
            "  %23 = mul(%22, g1) : f32[N] Replicated\n"
            "  %24 = mul(%23, g1) : f32[N] Replicated\n"
            "  %25 = add(%20, %24) : f32[N] Replicated\n"
            "  v1 = update(v, %25) : f32[N] Replicated\n"
            "  %27 = pow(beta1, step) : f32[] Replicated\n"
            "  %28 = const 1 : f32[] Replicated\n"
            "  bc1 = sub(%28, %27) : f32[] Replicated\n"
            "  %30 = pow(beta2, step) : f32[] Replicated\n"
            "  %31 = const 1 : f32[] Replicated\n"
            "  bc2 = sub(%31, %30) : f32[] Replicated\n"
            "  mhat = div(m1, bc1) : f32[N] Replicated\n"
            "  vhat = div(v1, bc2) : f32[N] Replicated\n"
            "  %35 = mul(weight_decay, w) : f32[N] Replicated\n"
            "  %36 = sqrt(vhat) : f32[N] Replicated\n"
            "  %37 = add(%36, eps) : f32[N] Replicated\n"
            "  %38 = div(mhat, %37) : f32[N] Replicated\n"
            "  r = add(%38, %35) : f32[N] Replicated\n"
            "  %40 = mul(lr, r) : f32[N] Replicated\n"
            "  %41 = sub(w, %40) : f32[N] Replicated\n"
            "  w1 = update(w, %41) : f32[N] Replicated\n");
}

TEST(Workloads, AllValidateAndLambUsesNorms) {
  for (std::string_view name : workloads::names()) {
    SCOPED_TRACE(name);
    const Program p = workloads::by_name(name);
    EXPECT_NO_THROW(p.validate());
  }
  const Program lamb = workloads::lamb(F16);
  EXPECT_EQ(lamb.stage(*lamb.find("g")).type.dtype, F16);
  EXPECT_TRUE(lamb.stage(*lamb.find("w_norm")).type.is_scalar());
  EXPECT_TRUE(lamb.stage(*lamb.find("trust")).type.is_scalar());
  EXPECT_EQ(workloads::adam(F32).stage(*workloads::adam(F32).find("g1")).type.dtype, F32);
}

TEST(Workloads, LlamasLayersHaveNoBias) {
  for (const char* name : {"megatron_layer_no_bias", "pipeline_stage_no_bias"}) {
    SCOPED_TRACE(name);
    const Program p = workloads::by_name(name);
    EXPECT_EQ(p.name(), name);
    EXPECT_NO_THROW(p.validate());
    EXPECT_FALSE(p.find("bias").has_value());
    EXPECT_FALSE(p.find("a").has_value());  // the sum goes straight to the dropout
    EXPECT_TRUE(p.find("residual").has_value());
  }
  EXPECT_TRUE(workloads::megatron_layer().find("bias").has_value());
}

// --------------------------------------------------------------------------------- inference

TEST(Infer, ElementwiseLayouts) {
  Program p("t");
  const Expr s = p.input(F32, {"B", "H"}, Sliced(0), "s");
  const Expr r = p.input(F32, {"B", "H"}, Replicated, "r");
  const Expr l = p.input(F32, {"B", "H"}, Local, "l");
  const Expr bias = p.input(F32, {"H"}, Replicated, "bias");
  const Expr k = p.scalar("k");
  EXPECT_EQ((s + r).type().layout, Sliced(0));
  EXPECT_EQ((r + s).type().layout, Sliced(0));
  EXPECT_EQ((s * bias).type().layout,
            Sliced(0));  // bias read at the slice (whole: dim 0 is not its)
  EXPECT_EQ((s * bias).type().shape, (SymShape{"B", "H"}));
  EXPECT_EQ((l * k).type().layout, Local);  // scalars go with any layout
  EXPECT_EQ((l + l).type().layout, Local);
  EXPECT_EQ((r + bias).type().layout, Replicated);
  EXPECT_EQ((k * 2).type(), (Type{F32, {}, Replicated, kAllGroups}));
  EXPECT_EQ(select(s > r, s, r).type().layout, Sliced(0));
  EXPECT_EQ(gelu(relu(-s)).type().layout, Sliced(0));
}

TEST(Infer, DtypesAndScalarsAdapt) {
  Program p("t");
  const Expr h = p.input(BF16, {8}, Replicated, "h");
  const Expr f = p.input(F32, {8}, Replicated, "f");
  const Expr k = p.scalar("k");
  EXPECT_EQ((h * k).type().dtype, BF16);  // the f32 scalar adapts
  EXPECT_EQ((h * 0.5).type().dtype, BF16);
  EXPECT_EQ((cast(h, F32) + f).type().dtype, F32);
  EXPECT_EQ(cast(f, F16).type().dtype, F16);
  EXPECT_EQ(select(f > 0, h, h).type().dtype, BF16);  // a condition may have any dtype
  EXPECT_EQ(norm(h).type().dtype, F32);
  EXPECT_EQ(reduce(Sum, h).type().dtype, BF16);
}

TEST(Infer, ReductionsOverSlicedIncludeTheCrossRankReduction) {
  Program p("t");
  const Expr s = p.input(F32, {"A", "B", "C"}, Sliced(1), "s");
  const Expr l = p.input(F32, {"A", "B"}, Local, "l");
  EXPECT_EQ(norm(s).type(), (Type{F32, {}, Replicated, 0}));
  EXPECT_EQ(norm(l).type(), (Type{F32, {}, Local, 0}));
  EXPECT_EQ(reduce(Sum, s).type().layout, Replicated);
  EXPECT_EQ(reduce(Max, s, 1).type(), (Type{F32, {"A", "C"}, Replicated, 0}));
  EXPECT_EQ(reduce(Sum, s, 0).type(), (Type{F32, {"B", "C"}, Sliced(0), 0}));
  EXPECT_EQ(reduce(Sum, s, 2).type(), (Type{F32, {"A", "B"}, Sliced(1), 0}));
  EXPECT_EQ(reduce(Min, l, 0).type(), (Type{F32, {"B"}, Local, 0}));
}

struct MatmulCase {
  Layout a, b;
  SymShape sa, sb;
  Layout want;
  SymShape want_shape;
};

TEST(Infer, MatmulLayoutRules) {
  const std::vector<MatmulCase> cases = {
      {Replicated, Replicated, {"M", "K"}, {"K", "N"}, Replicated, {"M", "N"}},
      {Local, Local, {"M", "K"}, {"K", "N"}, Local, {"M", "N"}},
      {Sliced(1), Sliced(0), {"M", "K"}, {"K", "N"}, Partial, {"M", "N"}},  // row-parallel
      {Sliced(1), Replicated, {"M", "K"}, {"K", "N"}, Partial, {"M", "N"}},
      {Replicated, Sliced(0), {"M", "K"}, {"K", "N"}, Partial, {"M", "N"}},
      {Sliced(0), Replicated, {"M", "K"}, {"K", "N"}, Sliced(0), {"M", "N"}},  // sliced rows
      {Replicated, Sliced(1), {"M", "K"}, {"K", "N"}, Sliced(1), {"M", "N"}},  // column-parallel
      {Sliced(0),
       Sliced(0),
       {"Z", "M", "K"},
       {"Z", "K", "N"},
       Sliced(0),
       {"Z", "M", "N"}},  // batch
      {Sliced(0), Replicated, {"Z", "M", "K"}, {"K", "N"}, Sliced(0), {"Z", "M", "N"}},
      {Sliced(1), Replicated, {"Z", "M", "K"}, {"K", "N"}, Sliced(1), {"Z", "M", "N"}},
      {Replicated, Sliced(1), {"M", "K"}, {"Z", "K", "N"}, Partial, {"Z", "M", "N"}},
      {Replicated, Sliced(2), {"M", "K"}, {"Z", "K", "N"}, Sliced(2), {"Z", "M", "N"}},
  };
  for (const MatmulCase& c : cases) {
    Program p("mm");
    const Expr a = p.input(F32, c.sa, c.a, "a");
    const Expr b = p.input(F32, c.sb, c.b, "b");
    const Expr y = matmul(a, b);
    SCOPED_TRACE(p.str());
    EXPECT_EQ(y.type().layout, c.want);
    EXPECT_EQ(y.type().shape, c.want_shape);
  }
}

TEST(Infer, CollectivesAndScatter) {
  Program p("t");
  const Expr l = p.input(F16, {5, 3}, Local, "l");
  EXPECT_EQ(AllReduce(Max, l).type(), (Type{F16, {5, 3}, Replicated, 0}));
  EXPECT_EQ(ReduceScatter(Sum, l, 1).type().layout, Sliced(1));
  EXPECT_EQ(AllGather(ReduceScatter(Sum, l)).type().layout, Replicated);
  EXPECT_EQ(Broadcast(l, 0).type().layout, Replicated);
  EXPECT_EQ(Shift(l).type(), (Type{F16, {5, 3}, Local, 0}));
  EXPECT_EQ(scatter(AllReduce(Sum, l), 1).type().layout, Sliced(1));
  const Expr a = p.input(F32, {4, 6}, Sliced(1), "a");
  const Expr b = p.input(F32, {6, 2}, Sliced(0), "b");
  EXPECT_EQ(ReduceScatter(Sum, matmul(a, b), 0).type().layout, Sliced(0));  // Partial accepted
}

TEST(Infer, GroupsFollowOperandsAndRecvMovesToTheDestination) {
  Program p("pipe", 3);
  const Expr x = p.input(F32, {"N"}, Replicated, "x", 1);
  const Expr k = p.scalar("k");
  const Expr y = x * k;
  EXPECT_EQ(y.type().group, 1);
  EXPECT_EQ((k + 1).type().group, kAllGroups);
  const Expr sent = Send(y, 2);
  EXPECT_EQ(sent.type().group, 1);
  const Expr got = Recv(sent);
  EXPECT_EQ(got.type(), (Type{F32, {"N"}, Replicated, 2}));
  const Expr z = p.input(F32, {"N"}, Sliced(0), "z", 2);
  EXPECT_EQ((got + z).type().group, 2);
  p.output(got + z, "out");
  EXPECT_NO_THROW(p.validate());
}

TEST(Infer, UpdateReturnsTheInputsType) {
  Program p("t");
  const Expr m = p.input(F32, {"N"}, Sliced(0), "m");
  const Expr m1 = update(m, m * 0.5);
  EXPECT_EQ(m1.type(), m.type());
  EXPECT_EQ(p.updater(m.id()), m1.id());
  EXPECT_NO_THROW(p.validate());  // an update alone is a result
}

// ----------------------------------------------------------------------- lookups and shapes

TEST(Program, LookupsAndSymbols) {
  const Program p = workloads::megatron_layer();
  EXPECT_EQ(p.symbols(), (std::vector<std::string>{"B", "H", "K"}));
  EXPECT_EQ(p.inputs().size(), 4u);
  EXPECT_EQ(p.scalars().size(), 1u);
  EXPECT_EQ(p.users(*p.find("z")), (std::vector<int>{*p.find("a")}));
  EXPECT_EQ(p.display_name(*p.find("z")), "z");
  EXPECT_FALSE(p.find("nope").has_value());
}

TEST(Program, ResolveShapes) {
  const Program p = workloads::megatron_layer();
  const auto shapes = p.resolve_shapes({{"B", 3}, {"K", 5}, {"H", 7}});
  EXPECT_EQ(shapes[static_cast<size_t>(*p.find("y"))], (Shape{3, 7}));
  EXPECT_EQ(shapes[static_cast<size_t>(*p.find("bias"))], (Shape{7}));
  EXPECT_EQ(shapes[static_cast<size_t>(*p.find("seed"))], (Shape{}));
}

TEST(Layout, LocalShapesFollowThePartition) {
  // 10 rows over 4 ranks: 3, 3, 2, 2.
  EXPECT_EQ(local_shape(Shape{10, 2}, Sliced(0), 4, 0), (Shape{3, 2}));
  EXPECT_EQ(local_shape(Shape{10, 2}, Sliced(0), 4, 3), (Shape{2, 2}));
  EXPECT_EQ(local_shape(Shape{2, 10}, Sliced(1), 4, 1), (Shape{2, 3}));
  EXPECT_EQ(local_shape(Shape{2, 3}, Sliced(1), 4, 3), (Shape{2, 0}));  // fewer elements than ranks
  EXPECT_EQ(local_shape(Shape{10, 2}, Replicated, 4, 2), (Shape{10, 2}));
  int64_t total = 0;
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(part_offset(10, 4, r), total);
    total += part_count(10, 4, r);
  }
  EXPECT_EQ(total, 10);
  EXPECT_EQ(Layout::sliced(2).str(), "Sliced(2)");
  EXPECT_EQ(Partial.str(), "Partial");
}

// --------------------------------------------------------------------------- visitor, mutator

class KindCounter : public Visitor {
 public:
  std::map<std::string, int> counts;

 protected:
  void visit_source(const Program&, const Stage&) override { ++counts["source"]; }
  void visit_elementwise(const Program&, const Stage&) override { ++counts["elementwise"]; }
  void visit_reduction(const Program&, const Stage&) override { ++counts["reduction"]; }
  void visit_matmul(const Program&, const Stage&) override { ++counts["matmul"]; }
  void visit_update(const Program&, const Stage&) override { ++counts["update"]; }
  void visit_collective(const Program&, const Stage&) override { ++counts["collective"]; }
  void visit_transfer(const Program&, const Stage&) override { ++counts["transfer"]; }
};

TEST(Visitor, SeesEveryStageByFamily) {
  KindCounter lamb;
  lamb.visit(workloads::lamb());
  EXPECT_EQ(lamb.counts["reduction"], 2);
  EXPECT_EQ(lamb.counts["update"], 3);
  EXPECT_EQ(lamb.counts["collective"], 1);
  KindCounter pipe;
  pipe.visit(workloads::pipeline_stage());
  EXPECT_EQ(pipe.counts["transfer"], 2);
  EXPECT_EQ(pipe.counts["matmul"], 1);
  EXPECT_EQ(pipe.counts["source"], 5);
}

TEST(Mutator, IdentityReproducesTheProgram) {
  for (std::string_view name : workloads::names()) {
    const Program p = workloads::by_name(name);
    Mutator identity;
    EXPECT_EQ(identity.mutate(p).str(), p.str());
  }
}

// What the schedules engineer's split pass looks like over this IR: AllReduce becomes
// ReduceScatter + AllGather, and every use follows the new value.
class SplitAllReduce : public Mutator {
 protected:
  int mutate_collective(const Stage& s) override {
    if (s.op != Op::AllReduce) return copy(s);
    Attrs rs = s.attrs;
    rs.dim = 0;
    const int scattered = out().add(Op::ReduceScatter, {mapped(s.args[0])}, rs, s.name + ".rs");
    return out().add(Op::AllGather, {scattered}, {}, s.name);
  }
};

TEST(Mutator, ASplitPassRewritesUses) {
  SplitAllReduce split;
  const Program p = split.mutate(workloads::megatron_layer());
  const std::string s = p.str();
  EXPECT_NE(s.find("  z.rs = reduce_scatter.sum(y) dim=0 : f32[B, H] Sliced(0)\n"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("  z = allgather(z.rs) : f32[B, H] Replicated\n"), std::string::npos) << s;
  EXPECT_NE(s.find("  a = add(z, bias) : f32[B, H] Replicated\n"), std::string::npos) << s;
  EXPECT_NO_THROW(p.validate());
}

TEST(Program, AssembleRebuildsAndReinfers) {
  const Program p = workloads::megatron_layer();
  std::vector<Stage> stages = p.stages();
  for (Stage& s : stages) s.type = {};  // assemble infers again
  const Program q = Program::assemble(p.name(), p.groups(), stages, p.outputs());
  EXPECT_EQ(q.str(), p.str());
}

}  // namespace
}  // namespace tandem::dsl
