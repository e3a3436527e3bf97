// Whole-tensor sums and norms (dsl/elementwise.h's SumLanes: 8 double lanes keyed by the global
// flat index, rounded to f32 once): a large norm whose f32 sequential sum is visibly wrong
// matches a double-precision sum closely on the reference interpreter, the plan runner and the
// compiled code, on 1 to 4 thread ranks and under every schedule (sliced and fused ones
// included); and the compiled result does not depend on the collectives' chunk size.
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>

#include "exec/compiled_checks.h"
#include "tandem/comm/thread.h"
#include "tandem/exec/plan_runner.h"
#include "tandem/exec/reference.h"
#include "tandem/schedule/enumerate.h"

namespace tandem::codegen::testing {
namespace {

using namespace tandem::dsl;  // NOLINT: the builder's vocabulary reads best unqualified

constexpr int64_t kN = (int64_t{1} << 22) + 3;

// Element i of the whole tensor: 4096 first (its square is 2^24), then values in [0.25, 0.75),
// whose squares are each below half an ulp of 2^24: an f32 running sum of squares never moves
// after the first element and ends about 6% short.
float value(int64_t i) {
  if (i == 0) return 4096.0f;
  uint64_t h = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;
  h ^= h >> 31;
  return 0.25f + static_cast<float>(h % 65536) / 131072.0f;
}

struct Exact {
  double sum = 0, sumsq = 0;
  float f32_sumsq = 0;  // the old semantics: f32, element order
};

const Exact& exact() {
  static const Exact e = [] {
    Exact x;
    for (int64_t i = 0; i < kN; ++i) {
      const double v = value(i);
      x.sum += v;
      x.sumsq += v * v;
      x.f32_sumsq += value(i) * value(i);
    }
    return x;
  }();
  return e;
}

// The gradient of rank r of p: element i when i % p == r, else 0, so that the all-reduce is exact
// and its result is value(i) whatever the rank count.
Program allreduce_program() {
  Program p("sum_lanes_ar");
  const Expr g = p.input(F32, {"N"}, Local, "g");
  const Expr s = AllReduce(ReduceOp::Sum, g).named("s");
  p.output(norm(s).named("n"), "n");
  p.output(reduce(ReduceOp::Sum, s).named("t"), "t");
  p.output((s * 0.5).named("h"), "h");
  return p;
}

Program sliced_program() {
  Program p("sum_lanes_sliced");
  const Expr x = p.input(F32, {"N"}, Sliced(0), "x");
  p.output(norm(x).named("n"), "n");
  p.output(reduce(ReduceOp::Sum, x).named("t"), "t");
  return p;
}

// This rank's input for either program.
Tensor input_for(const Program& p, const comm::Communicator& c) {
  const bool local = p.name() == "sum_lanes_ar";
  Tensor whole = Tensor::empty(DType::F32, Shape{kN});
  float* w = whole.data_as<float>();
  for (int64_t i = 0; i < kN; ++i) w[i] = !local || i % c.size() == c.rank() ? value(i) : 0.0f;
  if (local) return whole;
  return exec::piece_of(whole, Layout::sliced(0), c.size(), c.rank()).clone();
}

std::string input_name(const Program& p) { return p.name() == "sum_lanes_ar" ? "g" : "x"; }

// n and t close to the double-precision results. The sums are rounded to f32 (2^-24), each
// rank's partial once more, and their f32 combination across ranks at most 3 times: 1e-6
// relative has room; the norm's sqrt halves its error.
std::string check_close(const std::string& where, const exec::TensorMap& out) {
  std::string bad;
  const double n = out.at("n").get(0), t = out.at("t").get(0);
  const double want_n = std::sqrt(exact().sumsq), want_t = exact().sum;
  if (!(std::abs(n - want_n) <= 1e-6 * want_n))
    bad += fmt::format("{}: norm {} want {:.9g}\n", where, n, want_n);
  if (!(std::abs(t - want_t) <= 1e-6 * want_t))
    bad += fmt::format("{}: sum {} want {:.9g}\n", where, t, want_t);
  return bad;
}

// Whether the plan sums the norm per slice and combines the ranks' partials (a sliced schedule).
bool sliced_norm(const schedule::Plan& plan) {
  bool sliced = false;
  std::function<void(const schedule::Step&)> visit = [&](const schedule::Step& s) {
    if (s.kind == schedule::StepKind::Finish && s.finish.across_ranks) sliced = true;
    for (const schedule::Step& b : s.pipeline.body) visit(b);
  };
  for (const schedule::Step& s : plan.steps) visit(s);
  return sliced;
}

std::string same_bytes(const std::string& where, const Tensor& got, const Tensor& want) {
  if (got.numel() != want.numel() || std::memcmp(got.data(), want.data(), got.nbytes()) != 0)
    return fmt::format("{}: got {:a}, want {:a} (bitwise)\n", where, got.get(0), want.get(0));
  return "";
}

TEST(SumLanes, TheOldF32SumIsVisiblyWrongOnTheseValues) {
  const double rel = std::abs(exact().f32_sumsq - exact().sumsq) / exact().sumsq;
  EXPECT_GT(rel, 1e-2) << "the test values no longer expose an f32 sequential sum";
}

TEST(SumLanes, LargeNormMatchesDoubleOnEveryExecutorAndSchedule) {
  for (const Program& program : {allreduce_program(), sliced_program()}) {
    const Schedules all = compile_all(program);
    std::vector<schedule::Plan> plans;
    for (const auto& c : all.plans) plans.push_back(c->plan());
    ASSERT_GE(plans.size(), 1u);
    // The plan runner, slow on 4Mi elements, runs the unscheduled program and the sliced
    // schedules (unfused, and fused into the reduce-scatter's chunks); the compiled code all.
    std::vector<bool> interpret(plans.size(), false);
    int sliced = 0;
    for (size_t k = 0; k < plans.size(); ++k) {
      interpret[k] = k == 0 || all.names[k] == "RS-C-AG" || all.names[k] == "fused(RS-C-AG)";
      sliced += interpret[k] && sliced_norm(plans[k]) ? 1 : 0;
    }
    if (program.name() == "sum_lanes_ar") {
      ASSERT_EQ(sliced, 2) << fmt::format("{}", fmt::join(all.names, ", "));
    }
    for (int ranks = 1; ranks <= 4; ++ranks) {
      std::mutex mu;
      std::string failures;
      comm::run_ranks(ranks, [&](comm::Communicator& comm) {
        std::string bad;
        const std::string name = input_name(program);
        const Tensor in = input_for(program, comm);
        const SymbolMap sym = {{"N", kN}};
        const std::string at =
            fmt::format("{} on {} ranks, rank {}", program.name(), ranks, comm.rank());
        exec::RunArgs ra{sym, {}, {{name, in.clone()}}};
        const exec::TensorMap ref = exec::run_reference(program, comm, ra);
        bad += check_close("reference, " + at, ref);
        for (size_t k = 0; k < plans.size(); ++k) {
          const std::string where = fmt::format("{} / {}", all.names[k], at);
          exec::TensorMap planned;
          if (interpret[k]) {
            exec::RunArgs pa{sym, {}, {{name, in.clone()}}};
            planned = exec::run_plan(plans[k], comm, pa);
            bad += check_close("plan runner, " + where, planned);
          }
          exec::CompiledRunner runner(all.plans[k], comm, sym);
          runner.load(name, in);
          runner.run();
          exec::TensorMap compiled = {{"n", runner.output("n").clone()},
                                      {"t", runner.output("t").clone()}};
          bad += check_close("compiled, " + where, compiled);
          // The compiled code folds exactly as the plan runner does.
          for (const char* o : {"n", "t"}) {
            if (!interpret[k]) continue;
            bad += same_bytes(fmt::format("compiled vs plan runner {}, {}", o, where),
                              compiled.at(o), planned.at(o));
          }
        }
        std::lock_guard<std::mutex> lock(mu);
        failures += bad;
      });
      EXPECT_EQ(failures, "") << program.name() << " on " << ranks << " ranks";
    }
  }
}

TEST(SumLanes, ChunkingDoesNotChangeTheCompiledResult) {
  const Program program = allreduce_program();
  const Schedules all = compile_all(program);
  ASSERT_GE(all.plans.size(), 2u);  // fused schedules fold chunk by chunk inside the collective
  const SymbolMap sym = {{"N", kN}};
  // Chunk sizes in bytes, odd ones included (chunks that cut the lanes' groups of 8 anywhere).
  const size_t chunks[] = {0, 4 * 1000 + 4 * 3, 4 * 64 * 1024 + 4 * 5, 4 * 8 * 1024};
  for (int ranks = 1; ranks <= 4; ++ranks) {
    std::vector<std::vector<std::pair<float, float>>> got(
        std::size(chunks));  // [chunk][plan] (n, t) of rank 0
    std::mutex mu;
    std::string failures;
    for (size_t c = 0; c < std::size(chunks); ++c) {
      comm::set_chunk_bytes(chunks[c]);
      comm::run_ranks(ranks, [&](comm::Communicator& comm) {
        const Tensor in = input_for(program, comm);
        std::vector<std::pair<float, float>> mine;
        for (size_t k = 0; k < all.plans.size(); ++k) {
          exec::CompiledRunner runner(all.plans[k], comm, sym);
          runner.load("g", in);
          runner.run();
          mine.emplace_back(runner.output("n").get(0), runner.output("t").get(0));
        }
        std::lock_guard<std::mutex> lock(mu);
        if (comm.rank() == 0) got[c] = mine;
      });
    }
    comm::set_chunk_bytes(0);
    for (size_t c = 1; c < std::size(chunks); ++c)
      for (size_t k = 0; k < all.plans.size(); ++k) {
        const auto [n0, t0] = got[0][k];
        const auto [n, t] = got[c][k];
        if (std::memcmp(&n, &n0, 4) != 0 || std::memcmp(&t, &t0, 4) != 0)
          failures += fmt::format(
              "{} on {} ranks, chunk {} bytes: n {:a} t {:a}, default chunk: n {:a} t {:a}\n",
              all.names[k], ranks, chunks[c], n, t, n0, t0);
      }
    EXPECT_EQ(failures, "");
  }
}

}  // namespace
}  // namespace tandem::codegen::testing
