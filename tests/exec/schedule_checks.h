// Shared helpers of the suites that run schedules: the four workloads with bound sizes and scalars,
// inputs derived from the element index (and the rank, for Local values), and the check that runs
// every enumerated schedule through the plan runner and compares it with the reference interpreter
// on the unscheduled program.
//
// Equality. A schedule is compared bitwise when it keeps the order of every floating-point
// operation of the reference; the plan runner computes each element with the reference's formulas
// and rounding, so only a changed reduction order can change a result. Three things change it:
// (1) a norm or reduction the program computes over a whole tensor that the schedule accumulates
//     per slice or per part and then combines across ranks (LAMB's ||r|| in a sliced schedule):
//     whole-tensor sums are exact-order double lanes keyed by the global index (dsl/elementwise.h,
//     SumLanes), so only the rounding of each rank's partial to f32 and their f32 combination
//     differ, a few 2^-24 relative (a Max or Min reduction is exact in any order);
// (2) a collective split into row blocks under the ring algorithm on 3 or more ranks: the ring
//     adds the ranks' contributions in an order that depends on which part an element falls in,
//     and blocks move the part boundaries (with 2 ranks a + b == b + a, and the direct algorithm
//     of the thread backend, and of MPI ranks on one node, adds in rank order whatever the part;
//     the check stays conservative for MPI, whose collectives may take the ring);
// (3) a matmul overlapped in row blocks: BLAS may round a row of a few-row block differently from
//     the same row of the whole product the reference computes (OpenBLAS's Haswell kernels do).
// Such schedules are compared with a relative tolerance of 1e-5 (abs 1e-6): an f32 sum of n terms
// reordered differs by at most about n * 2^-24 relative to the sum of magnitudes, under 1e-5 for
// the tensors here (n <= 1013, positive terms); everything downstream of a changed norm moves
// by the same relative amount.
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "schedule/testing.h"
#include "tandem/comm/communicator.h"
#include "tandem/dsl/dsl.h"
#include "tandem/exec/plan_runner.h"
#include "tandem/exec/reference.h"
#include "tandem/schedule/transforms.h"

namespace tandem::schedule::testing {

struct Case {
  std::string label;
  dsl::Program program{""};
  dsl::SymbolMap symbols;
  exec::ScalarMap scalars;
  int min_ranks = 1;  // a program of G groups needs a multiple of G ranks
};

inline exec::ScalarMap optimizer_scalars() {
  return {{"lr", 0.01},           {"beta1", 0.9}, {"beta2", 0.999},   {"eps", 1e-8},
          {"weight_decay", 0.01}, {"step", 3.0},  {"grad_scale", 0.5}};
}

inline Case adam_case(DType grad, int64_t n) {
  return {fmt::format("adam {} N={}", dtype_name(grad), n),
          dsl::workloads::adam(grad),
          {{"N", n}},
          optimizer_scalars(),
          1};
}
inline Case lamb_case(DType grad, int64_t n) {
  return {fmt::format("lamb {} N={}", dtype_name(grad), n),
          dsl::workloads::lamb(grad),
          {{"N", n}},
          optimizer_scalars(),
          1};
}
// " wire bf16" for a layer whose x, w, product and all-reduce are of another type than the rest.
inline std::string wire_label(std::optional<DType> wire) {
  return wire ? fmt::format(" wire {}", dtype_name(*wire)) : "";
}
// " no bias" for Llama's layer.
inline std::string bias_label(dsl::workloads::Bias bias) {
  return bias == dsl::workloads::Bias::Without ? " no bias" : "";
}
inline Case megatron_case(DType t, int64_t b, int64_t k, int64_t h,
                          std::optional<DType> wire = std::nullopt,
                          dsl::workloads::Bias bias = dsl::workloads::Bias::With) {
  return {fmt::format("megatron {}{}{} B={} K={} H={}", dtype_name(t), wire_label(wire),
                      bias_label(bias), b, k, h),
          dsl::workloads::megatron_layer(t, 0.1, wire, bias),
          {{"B", b}, {"K", k}, {"H", h}},
          {{"seed", 1234}},
          1};
}
inline Case pipeline_case(DType t, int64_t b, int64_t k, int64_t h,
                          std::optional<DType> wire = std::nullopt,
                          dsl::workloads::Bias bias = dsl::workloads::Bias::With) {
  return {fmt::format("pipeline {}{}{} B={} K={} H={}", dtype_name(t), wire_label(wire),
                      bias_label(bias), b, k, h),
          dsl::workloads::pipeline_stage(t, 0.1, wire, bias),
          {{"B", b}, {"K", k}, {"H", h}},
          {{"seed", 77}},
          2};
}
inline Case sum_in_place_case(DType wire, int64_t n) {
  return {fmt::format("sum_in_place wire {} N={}", dtype_name(wire), n),
          dsl::workloads::sum_in_place(wire),
          {{"N", n}},
          {},
          1};
}

inline Case two_collectives_case(int64_t n, int64_t b, int64_t k, int64_t h) {
  return {fmt::format("two_collectives N={} B={} K={} H={}", n, b, k, h),
          two_collectives(),
          {{"N", n}, {"B", b}, {"K", k}, {"H", h}},
          {{"lr", 0.01}},
          1};
}

inline Case kv_ring_case(int64_t n) {
  return {fmt::format("kv_ring N={}", n), dsl::workloads::kv_ring(), {{"N", n}}, {}, 1};
}

inline Case ring_step_case(DType t, int64_t r, int64_t c) {
  return {fmt::format("ring_step {} R={} C={}", dtype_name(t), r, c),
          ring_step(t),
          {{"R", r}, {"C", c}},
          {{"a", 0.75}},
          1};
}

// Element i of input `name` (rank `rank`'s own value for a Local input): a value in [0.05, 1.05)
// from a hash of the name, the index and the rank, so that every rank count sees the same whole
// tensors and the expected results do not depend on how they are split.
inline float input_value(const std::string& name, int64_t i, int rank) {
  uint64_t h = 1469598103934665603ull;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  h ^= static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull +
       static_cast<uint64_t>(rank + 1) * 0xC2B2AE3D27D4EB4Full;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return 0.05f + static_cast<float>(h % 1000003) / 1000003.0f;
}

// This rank's piece of every input of its group, for `program` as written.
inline exec::TensorMap make_inputs(const dsl::Program& program, const dsl::SymbolMap& symbols,
                                   const comm::Communicator& comm) {
  const exec::Placement pl = exec::placement(program, comm);
  const std::vector<Shape> shapes = program.resolve_shapes(symbols);
  exec::TensorMap out;
  for (int id : program.inputs()) {
    const dsl::Stage& s = program.stage(id);
    if (!pl.holds(s)) continue;
    Tensor whole = Tensor::empty(s.type.dtype, shapes[static_cast<size_t>(id)]);
    const int rank = s.type.layout.is_local() ? comm.rank() : -1;
    for (int64_t i = 0; i < whole.numel(); ++i) whole.set(i, input_value(s.name, i, rank));
    out[s.name] = exec::piece_of(whole, s.type.layout, pl.group_size, pl.index).clone();
  }
  return out;
}

// Compares got with want element by element: bitwise (NaNs of the same bits equal), or within
// |got - want| <= 1e-6 + 1e-5 |want|. "" when they agree, else a labelled report with the number
// of differing elements, the largest difference and the first few.
inline std::string compare(const std::string& label, const Tensor& got, const Tensor& want,
                           bool bitwise) {
  if (got.dtype() != want.dtype() || !(got.shape() == want.shape()))
    return fmt::format("{}: got {}, want {}\n", label, got.str(), want.str());
  int64_t bad = 0;
  double max_diff = 0;
  std::string first;
  const size_t es = dtype_size(got.dtype());
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.get(i), w = want.get(i);
    bool same;
    if (bitwise) {
      same =
          std::memcmp(static_cast<const char*>(got.data()) + static_cast<size_t>(i) * es,
                      static_cast<const char*>(want.data()) + static_cast<size_t>(i) * es, es) == 0;
    } else {
      same = (std::isnan(g) && std::isnan(w)) || std::abs(g - w) <= 1e-6 + 1e-5 * std::abs(w);
    }
    if (same) continue;
    max_diff = std::max(max_diff, std::abs(g - w));
    if (++bad <= 4) first += fmt::format(" [{}]={:.9g} (want {:.9g})", i, g, w);
  }
  if (bad == 0) return "";
  return fmt::format("{}: {} of {} elements differ ({}), max |diff| {:.3g}:{}\n", label, bad,
                     got.numel(), bitwise ? "bitwise" : "tolerance 1e-5", max_diff, first);
}

// Whether the plan keeps every floating-point operation of the reference in order (see the top).
inline bool keeps_order(const Plan& plan, const dsl::Program& original, comm::Backend backend,
                        int ranks) {
  bool keeps = true;
  std::function<void(const Step&)> visit = [&](const Step& s) {
    if (s.kind == StepKind::Finish && s.finish.across_ranks) {
      const std::string& name = plan.program.stage(s.finish.stage).name;
      const auto id = name.empty() ? std::nullopt : original.find(name);
      keeps &= id && original.stage(original.stage(*id).args[0]).type.layout.is_sliced();
    }
    if (s.kind == StepKind::Pipeline) {
      if (backend != comm::Backend::Thread && ranks / plan.program.groups() >= 3) keeps = false;
      for (const Step& b : s.pipeline.body) keeps &= b.kind != StepKind::Matmul;
      for (const Step& b : s.pipeline.body) visit(b);
    }
  };
  for (const Step& s : plan.steps) visit(s);
  return keeps;
}

struct Outcome {
  int schedules = 0;
  int bitwise = 0;
  std::string failures;
};

// The reference's results on the unscheduled program, for this rank.
struct Reference {
  exec::RunArgs args;  // the inputs it ran on (updated inputs hold their new values)
  exec::TensorMap outputs;
};

inline Reference run_reference(const Case& c, comm::Communicator& comm) {
  Reference r{exec::RunArgs{c.symbols, c.scalars, make_inputs(c.program, c.symbols, comm)}, {}};
  r.outputs = exec::run_reference(c.program, comm, r.args);
  return r;
}

// Runs one plan on fresh inputs and compares its outputs and updated inputs with the reference's;
// adds what differs to `out.failures`.
inline void check_plan(const Case& c, const Plan& plan, const std::string& name,
                       comm::Communicator& comm, const Reference& ref, Outcome& out) {
  const exec::Placement pl = exec::placement(c.program, comm);
  const bool bitwise = keeps_order(plan, c.program, comm.backend(), comm.size());
  exec::RunArgs args{c.symbols, c.scalars, make_inputs(c.program, c.symbols, comm)};
  const std::string where =
      fmt::format("{} / {} on rank {} of {}", c.label, name, comm.rank(), comm.size());
  exec::TensorMap got;
  try {
    got = exec::run_plan(plan, comm, args);
  } catch (const std::exception& e) {
    out.failures += fmt::format("{}: threw: {}\n", where, e.what());
    return;
  }
  ++out.schedules;
  out.bitwise += bitwise ? 1 : 0;
  for (const auto& [oname, want] : ref.outputs) {
    auto it = got.find(oname);
    if (it == got.end()) {
      out.failures += fmt::format("{}: output {} missing\n", where, oname);
      continue;
    }
    out.failures += compare(fmt::format("{}: output {}", where, oname), it->second, want, bitwise);
  }
  // Inputs updated in place: whole, or this rank's part where the schedule stores them sliced.
  for (int id : c.program.inputs()) {
    const dsl::Stage& s = c.program.stage(id);
    if (!pl.holds(s) || c.program.updater(id) < 0) continue;
    const Tensor& want = ref.args.inputs.at(s.name);
    const Tensor& have = args.inputs.at(s.name);
    const dsl::Stage& stored = plan.program.stage(*plan.program.find(s.name));
    if (stored.type.layout == s.type.layout) {
      out.failures += compare(fmt::format("{}: updated {}", where, s.name), have, want, bitwise);
    } else {
      out.failures +=
          compare(fmt::format("{}: updated {} (this rank's slice)", where, s.name),
                  exec::piece_of(have, stored.type.layout, pl.group_size, pl.index),
                  exec::piece_of(want, stored.type.layout, pl.group_size, pl.index), bitwise);
    }
  }
}

// Every schedule enumerate_schedules yields for the case's program, lowered (once, before the
// ranks start: every rank runs the same plans).
inline std::vector<Plan> all_plans(const Case& c) {
  std::vector<Plan> out;
  for (const NamedSchedule& ns : enumerate_schedules(c.program)) out.push_back(ns.schedule.lower());
  return out;
}

// Runs the reference on the unscheduled program, then every plan, on `comm` (every rank calls
// it); returns what this rank saw.
inline Outcome check_all_schedules(const Case& c, const std::vector<Plan>& plans,
                                   comm::Communicator& comm) {
  Outcome out;
  const Reference ref = run_reference(c, comm);
  for (const Plan& plan : plans) check_plan(c, plan, plan.name, comm, ref, out);
  return out;
}

}  // namespace tandem::schedule::testing
