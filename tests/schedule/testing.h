// Shared helpers of the schedule suites: a program with two collectives of different kinds, so
// that per-collective recipes differ (the suites that run schedules add exec/schedule_checks.h).
#pragma once

#include <string>
#include <vector>

#include "tandem/dsl/dsl.h"
#include "tandem/schedule/recipe.h"

namespace tandem::schedule::testing {

// A program with two collectives of different kinds, so that per-collective recipes differ: an
// SGD-with-momentum update after AllReduce g_sum (splittable, reorderable, fusable, its momentum m
// sliceable) and a row-parallel layer's AllReduce z of a matmul (overlappable with it).
inline dsl::Program two_collectives() {
  using namespace tandem::dsl;  // NOLINT: the builder's vocabulary
  Program p("two_collectives");
  const Expr lr = p.scalar("lr");
  const Expr g = p.input(F32, {"N"}, Local, "g");
  const Expr w = p.input(F32, {"N"}, Replicated, "w");
  const Expr m = p.input(F32, {"N"}, Replicated, "m");
  const Expr g_sum = AllReduce(Sum, g).named("g_sum");
  const Expr m_decayed = 0.9 * m;
  const Expr m1 = update(m, m_decayed + g_sum).named("m1");
  update(w, w - lr * m1).named("w1");
  const Expr x = p.input(F32, {"B", "K"}, Sliced(1), "x");
  const Expr wt = p.input(F32, {"K", "H"}, Sliced(0), "wt");
  const Expr bias = p.input(F32, {"H"}, Replicated, "bias");
  const Expr z = AllReduce(Sum, matmul(x, wt).named("y")).named("z");
  const Expr a = (z + bias).named("a");
  p.output((a * a).named("out"), "out");
  return p;
}

// A ring step with computation around it: a Shift of a computed Local value (stored for it, so
// loop fusion changes where it is made), read again after the shift next to the value it came
// from, summed across the ranks (an AllReduce the recipes split, reorder and fuse), and a block
// replaced by its neighbour's in place, as ring attention passes its keys and values on.
inline dsl::Program ring_step(DType dtype = DType::BF16) {
  using namespace tandem::dsl;  // NOLINT: the builder's vocabulary
  Program p("ring_step");
  const Expr a = p.scalar("a");
  const Expr x = p.input(dtype, {"R", "C"}, Local, "x");
  const Expr b = p.input(F32, {"R", "C"}, Local, "b");
  const Expr y = (cast(x, F32) * a).named("y");
  const Expr s = Shift(y).named("s");
  p.output((s - y).named("z"), "z");
  const Expr g = AllReduce(Sum, s).named("g");
  p.output((g * 0.5).named("h"), "h");
  update(b, Shift(b).named("b_next")).named("b1");
  return p;
}

// The schedules' names, in order.
inline std::vector<std::string> names_of(const std::vector<NamedSchedule>& all) {
  std::vector<std::string> out;
  for (const NamedSchedule& ns : all) out.push_back(ns.name);
  return out;
}

}  // namespace tandem::schedule::testing
