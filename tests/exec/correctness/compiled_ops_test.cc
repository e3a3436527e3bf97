// The compiled code op by op and layout by layout: every elementwise op in every dtype on special
// values (zeros of both signs, infinities, NaNs, subnormals, halfway cases), unfused and fused
// into one loop with its intermediates in registers, bitwise equal to the reference interpreter;
// and a program that exercises what the workloads do not: slices along an inner dim, broadcasts
// over a slice, reductions over one dim with and without their cross-rank step, norms of slices,
// batched and row-sliced matmuls in bf16, a broadcast and a gather along an inner dim.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>

#include "exec/compiled_checks.h"
#include "tandem/comm/thread.h"
#include "tandem/schedule/transforms.h"

namespace tandem::codegen::testing {
namespace {

using namespace tandem::dsl;  // NOLINT: the builder's vocabulary reads best unqualified

// Special f32 values and a spread of ordinary ones, in an order that depends on the seed, so that
// each input pairs the special values of the others with different values.
std::vector<float> special_values(int64_t n, uint32_t seed) {
  std::vector<float> v = {0.0f,        -0.0f,     1.0f,       -1.0f,    0.5f,    -2.5f,
                          INFINITY,    -INFINITY, NAN,        -NAN,     1e-45f,  -3e-39f,
                          1.17e-38f,   65504.0f,  65520.0f,   65519.0f, 6.0e-8f, 2.98023224e-8f,
                          1.00390625f, 3.0e38f,   1e-3f,      -7.0f,    0.1f,    100.0f,
                          88.7f,       -103.9f,   1.0000001f, 2.0f};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  const std::vector<float> specials = v;
  while (static_cast<int64_t>(v.size()) < n) {
    // Specials again among the ordinary values: more pairings with the other inputs.
    v.push_back(v.size() % 3 == 0 ? specials[v.size() % specials.size()] : u(rng));
  }
  v.resize(static_cast<size_t>(n));
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

// Bitwise, except that any two NaNs are equal (their payloads are not the formulas' business).
std::string same_bits(const std::string& label, const Tensor& got, const Tensor& want) {
  if (got.dtype() != want.dtype() || !(got.shape() == want.shape()))
    return fmt::format("{}: got {}, want {}\n", label, got.str(), want.str());
  const size_t es = dtype_size(got.dtype());
  int64_t bad = 0;
  std::string first;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const float g = got.get(i), w = want.get(i);
    if (std::isnan(g) && std::isnan(w)) continue;
    if (std::memcmp(static_cast<const char*>(got.data()) + static_cast<size_t>(i) * es,
                    static_cast<const char*>(want.data()) + static_cast<size_t>(i) * es, es) == 0)
      continue;
    if (++bad <= 4) first += fmt::format(" [{}] got {:a} want {:a};", i, g, w);
  }
  return bad == 0 ? "" : fmt::format("{}: {} of {} differ:{}\n", label, bad, got.numel(), first);
}

// Every elementwise op, in f32 and in the 16-bit dtypes, with chains whose intermediates a fused
// loop keeps in registers.
Program ops_program() {
  Program p("ops");
  const Expr a = p.input(F32, {"N"}, Replicated, "a");
  const Expr b = p.input(F32, {"N"}, Replicated, "b");
  const Expr c = p.input(F32, {"N"}, Replicated, "c");
  const Expr ab = p.input(BF16, {"N"}, Replicated, "ab");
  const Expr bb = p.input(BF16, {"N"}, Replicated, "bb");
  const Expr ah = p.input(F16, {"N"}, Replicated, "ah");
  const Expr bh = p.input(F16, {"N"}, Replicated, "bh");
  const Expr s = p.scalar("s");
  const Expr seed = p.scalar("seed");
  int k = 0;
  auto out = [&](const Expr& e) { p.output(e, fmt::format("o{}", k++)); };
  for (const Expr& x : {a, ab, ah}) {
    out(neg(x));
    out(abs(x));
    out(sqrt(x));
    out(rsqrt(x));
    out(exp(x));
    out(log(x));
    out(tanh(x));
    out(gelu(x));
    out(relu(x));
  }
  for (const auto& [x, y] : {std::pair{a, b}, std::pair{ab, bb}, std::pair{ah, bh}}) {
    out(x + y);
    out(x - y);
    out(x * y);
    out(x / y);
    out(pow(x, y));
    out(max(x, y));
    out(min(x, y));
    out(x < y);
    out(x <= y);
    out(x > y);
    out(x >= y);
    out(eq(x, y));
    out(ne(x, y));
    out(x * s);
    out(0.3 - x);
  }
  out(a * -2.0);
  out(a + neg(p.constant(-1.5)));  // a negative literal under a negation
  out(select(c, a, b));
  out(select(ab > bb, ab, 2.0));
  out(dropout(a, 0.3, seed));
  out(dropout(ah, 0.5, uint64_t{77}));
  out(cast(a, BF16));
  out(cast(a, F16));
  out(cast(ab, F32));
  out(cast(ah, F32));
  out(cast(ab, F16));
  // Chains: every intermediate rounded to its dtype, in a register when fused.
  const Expr t1 = ab * bb;
  const Expr t2 = t1 + s;
  out(cast(t2, F32) * a);
  const Expr u1 = ah / bh;
  const Expr u2 = exp(u1);
  out(cast(u2, BF16) - ab);
  const Expr v1 = a * b;
  const Expr v2 = v1 - c;
  out(max(v2, 0.0) + a);
  return p;
}

TEST(CompiledOps, EveryOpEveryDtypeBitwise) {
  const Program p = ops_program();
  const int64_t n = 301;
  // Unscheduled (one loop per stage, every result stored) and all fused into one loop.
  std::vector<schedule::Plan> plans;
  plans.push_back(schedule::Schedule(p).lower());
  {
    schedule::Schedule s(p);
    std::vector<schedule::StageRef> all;
    for (const Stage& st : p.stages())
      if (op_kind(st.op) == OpKind::Elementwise && st.type.shape.rank() > 0) all.push_back(st.id);
    s.fuse(all);
    plans.push_back(s.lower());
    // One loop over N; the scalar stages (a negated literal) come before it as scalar code.
    ASSERT_EQ(plans.back().steps.back().loop.shape.rank(), 1) << plans.back().str();
    for (size_t i = 0; i + 1 < plans.back().steps.size(); ++i)
      ASSERT_EQ(plans.back().steps[i].loop.shape.rank(), 0) << plans.back().str();
  }
  exec::TensorMap inputs;
  uint32_t seed = 1;
  for (const char* name : {"a", "b", "c", "ab", "bb", "ah", "bh"}) {
    const Stage& st = p.stage(*p.find(name));
    const std::vector<float> v = special_values(n, seed++);
    Tensor t = Tensor::empty(st.type.dtype, Shape{n});
    for (int64_t i = 0; i < n; ++i) t.set(i, v[static_cast<size_t>(i)]);
    inputs[name] = t;
  }
  const exec::ScalarMap scalars = {{"s", 0.1}, {"seed", 4242}};
  for (const schedule::Plan& plan : plans) {
    auto compiled_plan = compiled(plan);
    std::string failures;
    comm::run_ranks(1, [&](comm::Communicator& comm) {
      exec::RunArgs args{{{"N", n}}, scalars, {}};
      for (const auto& [name, t] : inputs) args.inputs[name] = t.clone();
      const exec::TensorMap want = exec::run_reference(p, comm, args);
      exec::CompiledRunner runner(compiled_plan, comm, {{"N", n}});
      for (const auto& [name, v] : scalars) runner.set_scalar(name, v);
      for (const auto& [name, t] : inputs) runner.load(name, t);
      runner.run();
      for (const auto& [name, w] : want)
        failures += same_bits(fmt::format("{} {}", plan.name, name), runner.output(name), w);
    });
    EXPECT_EQ(failures, "");
  }
}

// Slices along an inner dim and everything around them.
Program layouts_program() {
  Program p("layouts");
  const Expr u = p.input(F32, {"R", "C"}, Sliced(1), "u");  // this rank's columns
  const Expr x = p.input(F32, {"R", "C"}, Replicated, "x");
  const Expr bias = p.input(BF16, {"C"}, Replicated, "bias");
  const Expr t = p.input(BF16, {"R", "C"}, Local, "t");
  const Expr a3 = p.input(BF16, {2, "R", "C"}, Replicated, "a3");
  const Expr w = p.input(BF16, {"C", 3}, Replicated, "w");
  const Expr s = p.scalar("s");
  const Expr ux = u * x;                              // x read at this rank's columns
  const Expr y = (ux + cast(bias, F32)).named("y");   // bias broadcast over the rows of the slice
  p.output(norm(y).named("n"), "n");                  // per slice, then across ranks
  p.output(reduce(Sum, y, 0).named("rows"), "rows");  // over rows: stays sliced
  p.output(reduce(Max, y, 1).named("cols"), "cols");  // over the sliced dim: across ranks
  p.output(AllGather(y).named("yg"), "yg");           // along dim 1: not the flat split
  p.output(Broadcast(t, 0).named("tb"), "tb");
  const Expr ts =
      ReduceScatter(Sum, cast(t, F32), 1).named("ts");  // along dim 1: a part of every row
  p.output((ts * s).named("tss"), "tss");               // in the scatter's hook, fused
  const Expr xs = scatter(x, 0);                        // this rank's rows, no communication
  p.output((xs * s).named("xs"), "xs");
  p.output(matmul(a3, w).named("mm3"), "mm3");                         // batched, bf16
  p.output(matmul(scatter(cast(x, BF16), 0), w).named("mmr"), "mmr");  // row-sliced A
  return p;
}

TEST(CompiledLayouts, InnerSlicesReductionsGathersAndMatmuls) {
  comm::set_chunk_bytes(64);
  const Program p = layouts_program();
  const Schedules all = compile_all(p);
  ASSERT_GE(all.plans.size(), 1u);
  for (const auto& [r, c] : {std::pair<int64_t, int64_t>{5, 7}, {3, 2}, {1, 9}}) {
    const Case cs{
        fmt::format("layouts R={} C={}", r, c), p, {{"R", r}, {"C", c}}, {{"s", 0.75}}, 1};
    for (int ranks = 1; ranks <= 4; ++ranks) {
      std::mutex mu;
      std::string failures;
      comm::run_ranks(ranks, [&](comm::Communicator& comm) {
        const Outcome o = check_compiled(cs, all, comm);
        std::lock_guard<std::mutex> lock(mu);
        failures += o.failures;
        if (comm.rank() == 0) {
          EXPECT_EQ(o.bitwise, o.schedules) << cs.label;
        }
      });
      EXPECT_EQ(failures, "") << cs.label << " on " << ranks << " ranks";
    }
  }
  comm::set_chunk_bytes(0);
}

}  // namespace
}  // namespace tandem::codegen::testing
