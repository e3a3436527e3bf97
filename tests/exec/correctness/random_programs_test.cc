// Property: random small programs (random element-wise DAGs around one AllReduce, built with the
// DSL builder), scheduled by random sequences of transformations (each request either legal and
// applied, or refused with a UserError and the schedule left as it was), compute what the
// reference interpreter computes on the unscheduled program, on 1 to 4 thread ranks.
#include <gtest/gtest.h>

#include <mutex>
#include <random>

#include "exec/schedule_checks.h"
#include "tandem/comm/thread.h"
#include "tandem/core/error.h"

namespace tandem::schedule::testing {
namespace {

using namespace tandem::dsl;  // NOLINT: the builder's vocabulary

int pick(std::mt19937& rng, int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); }

// A random program: a Local gradient-like input reduced by one AllReduce, with element-wise work
// before it (on the Local value) and a random DAG after it over the result, Replicated inputs,
// scalars and constants; maybe a norm feeding back as a scalar; one or two outputs; maybe an
// in-place update of a Replicated input.
Program random_program(std::mt19937& rng, int index) {
  Program p(fmt::format("random{}", index));
  const Expr s1 = p.scalar("s1");
  const Expr s2 = p.scalar("s2");
  const Expr seed = p.scalar("seed");
  const DType gdt = pick(rng, 2) == 0 ? F32 : BF16;
  Expr x = p.input(gdt, {"N"}, Local, "g");
  std::vector<Expr> reps;
  const int nrep = 1 + pick(rng, 3);
  for (int i = 0; i < nrep; ++i)
    reps.push_back(p.input(F32, {"N"}, Replicated, fmt::format("r{}", i)));

  for (int i = pick(rng, 3); i > 0; --i) {
    switch (pick(rng, 3)) {
      case 0:
        x = x * s1;
        break;
      case 1:
        x = abs(x) + 0.5;
        break;
      default:
        x = tanh(x);
        break;
    }
  }
  const Expr y = AllReduce(Sum, x).named("y");
  std::vector<Expr> pool{gdt == F32 ? y : cast(y, F32)};
  pool.insert(pool.end(), reps.begin(), reps.end());
  std::vector<Expr> scalars{s1, s2};
  auto any = [&]() { return pool[static_cast<size_t>(pick(rng, static_cast<int>(pool.size())))]; };
  // Prefer recent nodes so that the DAG grows deep as well as wide.
  auto recent = [&]() {
    return pool[pool.size() - 1 -
                static_cast<size_t>(pick(rng, std::min<int>(3, static_cast<int>(pool.size()))))];
  };
  const int nodes = 3 + pick(rng, 7);
  for (int i = 0; i < nodes; ++i) {
    const Expr a = recent();
    const Expr b = any();
    Expr r;
    switch (pick(rng, 12)) {
      case 0:
        r = a + b;
        break;
      case 1:
        r = a - b;
        break;
      case 2:
        r = a * b;
        break;
      case 3:
        r = a / (abs(b) + 1.0);
        break;
      case 4:
        r = max(a, b);
        break;
      case 5:
        r = tanh(a) * scalars[static_cast<size_t>(pick(rng, static_cast<int>(scalars.size())))];
        break;
      case 6:
        r = sqrt(abs(a));
        break;
      case 7:
        r = select(a > b, a, b);
        break;
      case 8:
        r = dropout(a, 0.25, seed);
        break;
      case 9:
        r = gelu(a) + scalars[static_cast<size_t>(pick(rng, static_cast<int>(scalars.size())))];
        break;
      case 10: {
        // A whole-tensor norm, used as a scalar downstream.
        const Expr n = norm(a);
        scalars.push_back(n / (n + 1.0));
        r = a * scalars.back();
        break;
      }
      default:
        r = exp(-abs(a));
        break;
    }
    pool.push_back(r);
  }
  p.output(pool.back(), "out");
  if (pick(rng, 2) == 0) p.output(pool[pool.size() / 2 + 1], "mid");
  if (pick(rng, 2) == 0) update(reps[0], pool[pool.size() - 2]).named("r0_new");
  return p;
}

// The stages of `p` reachable from `from` through users, and their count.
std::vector<int> reachable(const Program& p, int from) {
  std::vector<char> seen(p.stages().size(), 0);
  std::vector<int> out, stack{from};
  while (!stack.empty()) {
    const int x = stack.back();
    stack.pop_back();
    for (int u : p.users(x))
      if (!seen[static_cast<size_t>(u)]) {
        seen[static_cast<size_t>(u)] = 1;
        out.push_back(u);
        stack.push_back(u);
      }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int> subset(std::mt19937& rng, const std::vector<int>& from, int max_size) {
  std::vector<int> out;
  for (int x : from)
    if (pick(rng, 2) == 0 && static_cast<int>(out.size()) < max_size) out.push_back(x);
  if (out.empty() && !from.empty())
    out.push_back(from[static_cast<size_t>(pick(rng, static_cast<int>(from.size())))]);
  return out;
}

struct Applied {
  Schedule schedule;
  int applied = 0, refused = 0;
};

// A random sequence of transformation requests; illegal ones are refused and change nothing.
Applied random_schedule(std::mt19937& rng, const Program& p) {
  Applied a{Schedule(p), 0, 0};
  Schedule& s = a.schedule;
  const int steps = 2 + pick(rng, 6);
  // Most sequences begin by splitting and reordering (the interesting rewrites); the rest of the
  // requests are drawn at random.
  const bool lead = pick(rng, 3) != 0;
  for (int i = 0; i < steps; ++i) {
    const int kind = lead && i < 2 ? i : pick(rng, 6);
    const Program& cur = s.program();
    const std::string before = cur.str();
    const size_t fused_before = s.fused().size();
    std::vector<int> ars, ags, comps, inputs;
    for (const Stage& st : cur.stages()) {
      if (st.op == Op::AllReduce) ars.push_back(st.id);
      if (st.op == Op::AllGather) ags.push_back(st.id);
      if (st.op == Op::Input) inputs.push_back(st.id);
      if (op_kind(st.op) == OpKind::Elementwise || st.op == Op::Update || st.op == Op::Norm ||
          st.op == Op::AllReduce || st.op == Op::ReduceScatter || st.op == Op::AllGather)
        comps.push_back(st.id);
    }
    try {
      switch (kind) {
        case 0:
          if (ars.empty()) continue;
          s.split(ars[static_cast<size_t>(pick(rng, static_cast<int>(ars.size())))]);
          break;
        case 1: {
          if (ags.empty()) continue;
          const int ag = ags[static_cast<size_t>(pick(rng, static_cast<int>(ags.size())))];
          const std::vector<int> t = subset(rng, reachable(cur, ag), 3);
          if (t.empty()) continue;
          s.reorder(ag, std::vector<StageRef>(t.begin(), t.end()));
          break;
        }
        case 2:
        case 3: {
          // A collective with some of what follows it, or any few computations.
          std::vector<int> f;
          std::vector<int> colls;
          for (int c : comps)
            if (cur.stage(c).op == Op::AllReduce || cur.stage(c).op == Op::ReduceScatter)
              colls.push_back(c);
          if (!colls.empty() && pick(rng, 2) == 0) {
            const int c = colls[static_cast<size_t>(pick(rng, static_cast<int>(colls.size())))];
            f = subset(rng, reachable(cur, c), 6);
            f.push_back(c);
          } else {
            f = subset(rng, comps, 4);
          }
          s.fuse(std::vector<StageRef>(f.begin(), f.end()));
          break;
        }
        case 4:
          s.as_slice(inputs[static_cast<size_t>(pick(rng, static_cast<int>(inputs.size())))]);
          break;
        default:
          s.eliminate_dead_stages();
          break;
      }
      ++a.applied;
    } catch (const UserError&) {
      ++a.refused;
      // A refused request leaves the schedule exactly as it was.
      EXPECT_EQ(s.program().str(), before);
      EXPECT_EQ(s.fused().size(), fused_before);
    }
  }
  return a;
}

TEST(RandomPrograms, RandomTransformationSequencesKeepMeaning) {
  comm::set_chunk_bytes(32);
  std::mt19937 rng(20261122);
  int applied = 0, refused = 0, runs = 0, split_reordered = 0;
  for (int prog = 0; prog < 100; ++prog) {
    const Program p = random_program(rng, prog);
    for (int k = 0; k < 3; ++k) {
      Applied a = random_schedule(rng, p);
      applied += a.applied;
      refused += a.refused;
      const Plan plan = a.schedule.lower();
      const int ranks = 1 + pick(rng, 4);
      const int64_t n = 1 + pick(rng, 60);
      const Case c{fmt::format("{} N={}", p.name(), n),
                   p,
                   {{"N", n}},
                   {{"s1", 0.75}, {"s2", -0.25}, {"seed", 99}},
                   1};
      bool reordered = false;
      for (const std::string& h : a.schedule.history()) reordered |= h.rfind("reorder", 0) == 0;
      split_reordered += reordered ? 1 : 0;
      std::mutex mu;
      std::string failures;
      comm::run_ranks(ranks, [&](comm::Communicator& comm) {
        Outcome o;
        const Reference ref = run_reference(c, comm);
        check_plan(c, plan, a.schedule.name(), comm, ref, o);
        std::lock_guard<std::mutex> lock(mu);
        failures += o.failures;
      });
      ++runs;
      EXPECT_EQ(failures, "") << p.str() << plan.str();
    }
  }
  comm::set_chunk_bytes(0);
  // The property is only as good as the schedules it tried: most sequences must do something.
  EXPECT_GT(applied, runs);
  EXPECT_GT(split_reordered, runs / 6);
  EXPECT_GT(refused, 0);
  std::fprintf(stderr, "%d runs: %d transformations applied, %d refused, %d schedules reordered\n",
               runs, applied, refused, split_reordered);
}

}  // namespace
}  // namespace tandem::schedule::testing
