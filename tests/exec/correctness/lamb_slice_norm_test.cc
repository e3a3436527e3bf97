// LAMB's ||w|| from this rank's slice of w: in every schedule of every LAMB program (lamb,
// lamb_bucket, lamb_update, lamb_bucket_update) the plan folds ||w|| from the slice and sums it
// across the ranks, and in the ZeRO-1 schedules nothing of a rank's copy of w outside its slice
// reaches the step: with that part overwritten by garbage on every rank, each executor gives
// bitwise the weights of a clean run (the AllGather overwrites the garbage with the peers' new
// slices). Both fail on a program that takes ||w|| over the whole w.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "support/schedules.h"
#include "tandem/comm/thread.h"
#include "tandem/dsl/workloads.h"
#include "tandem/exec/runner.h"
#include "tandem/schedule/enumerate.h"

namespace tandem::exec {
namespace {

using schedule::Plan;
using schedule::Step;
using schedule::StepKind;
using schedule::Storage;
using tandem::testing::plan_named;

struct Lamb {
  std::string name;
  std::function<dsl::Program(DType)> make;
};

std::vector<Lamb> lamb_programs() {
  return {{"lamb", [](DType g) { return dsl::workloads::lamb(g); }},
          {"lamb_bucket", [](DType g) { return dsl::workloads::lamb_bucket(g); }},
          {"lamb_update", [](DType g) { return dsl::workloads::lamb_update(g); }},
          {"lamb_bucket_update", [](DType g) { return dsl::workloads::lamb_bucket_update(g); }}};
}

// Every step of the plan, those inside a Pipeline's body included.
void each_step(const std::vector<Step>& steps, const std::function<void(const Step&)>& f) {
  for (const Step& s : steps) {
    f(s);
    each_step(s.pipeline.body, f);
  }
}

// How the plan computes w_norm: "" when it folds the squares of this rank's stored slice (a loop
// or a collective's hook accumulating it, or a segment norm's reduce step) and then sums the
// ranks' partials; else what it does instead.
std::string how_w_norm_is_taken(const Plan& plan) {
  const int id = *plan.program.find("w_norm");
  const int operand = plan.program.stage(id).args[0];
  const Storage stored = plan.values[static_cast<size_t>(operand)].storage;
  std::string out;
  if (stored != Storage::Slice)
    out += "its operand " + plan.program.display_name(operand) + " is stored " +
           std::string(schedule::storage_name(stored)) + ", not as this rank's slice; ";
  bool across = false;
  each_step(plan.steps, [&](const Step& s) {
    across |= s.kind == StepKind::Finish && s.finish.stage == id && s.finish.across_ranks;
    across |= s.kind == StepKind::Reduce && s.reduce.stage == id && s.reduce.across_ranks;
  });
  if (!across) out += "no step sums it across the ranks";
  return out;
}

TEST(LambSliceNorm, EveryScheduleTakesTheNormOfWFromThisRanksSlice) {
  for (const Lamb& l : lamb_programs())
    for (DType g : {DType::F32, DType::BF16}) {
      const dsl::Program program = l.make(g);
      int schedules = 0;
      for (const schedule::NamedSchedule& ns : schedule::enumerate_schedules(program)) {
        ++schedules;
        EXPECT_EQ(how_w_norm_is_taken(ns.schedule.lower()), "")
            << l.name << " g " << dtype_name(g) << " " << ns.name;
      }
      EXPECT_GE(schedules, 2) << l.name;
    }
}

// The schedule every rank's one-program step runs in the trainer (ZeRO-1), and the one whose
// update is a loop after the ReduceScatter: ||w|| in the hook, and in a loop.
TEST(LambSliceNorm, TheZero1HookFoldsTheNormOfWInTheSamePassAsTheDirection) {
  const Plan plan = plan_named(dsl::workloads::lamb(DType::F32), "fused(RS-C-AG)+slice(m,v)");
  const int w_norm = *plan.program.find("w_norm"), r_norm = *plan.program.find("r_norm");
  bool together = false;
  for (const Step& s : plan.steps)
    if (s.kind == StepKind::Collective && s.collective.fused) {
      const std::vector<int>& acc = s.collective.fused->accumulates;
      together |= std::find(acc.begin(), acc.end(), w_norm) != acc.end() &&
                  std::find(acc.begin(), acc.end(), r_norm) != acc.end();
    }
  EXPECT_TRUE(together) << "the ReduceScatter's hook accumulates both norms:\n" << plan.str();
}

// ------------------------------------------------------------------------------- garbage in w

constexpr int64_t kSliceN = 1013;

float slice_weight_at(int64_t i) {
  return static_cast<float>(0.5 * std::sin(0.37 * static_cast<double>(i) + 0.1));
}
float slice_grad_at(int rank, int64_t i) {
  return static_cast<float>(0.06 * std::cos(0.71 * static_cast<double>(i) + 1.3 * rank));
}

struct SliceNormCase {
  std::string label;
  Plan step;
  bool clipped = false;    // grad_reduce, then the update program
  dsl::Segments segments;  // for a bucket program
};

// Every rank's w after one step from slice_weight_at, with this rank's copy of w outside its own
// slice set to 1e3 first when `garbage`.
std::vector<std::vector<float>> weights_after_a_step(const SliceNormCase& c, RunnerKind kind,
                                                     int ranks, bool garbage) {
  const Plan reduce = plan_named(dsl::workloads::grad_reduce(DType::F32), "C");
  std::vector<std::vector<float>> out(static_cast<size_t>(ranks));
  comm::run_ranks(ranks, [&](comm::Communicator& comm) {
    dsl::SymbolMap symbols{{"N", kSliceN}};
    RunnerOptions options;
    std::unique_ptr<Runner> reducer;
    if (c.clipped) {
      reducer = make_runner(kind, reduce, comm, symbols);
      options.bound = {"g_sum"};
    }
    if (!c.segments.empty()) {
      symbols["S"] = static_cast<int64_t>(c.segments.size()) - 1;
      options.segments = c.segments;
    }
    std::unique_ptr<Runner> step = make_runner(kind, c.step, comm, symbols, options);
    if (c.clipped) step->bind("g_sum", reducer->output("g_sum"));
    const int64_t begin = dsl::part_offset(kSliceN, ranks, comm.rank()),
                  end = begin + dsl::part_count(kSliceN, ranks, comm.rank());
    const Tensor w = step->input("w");
    for (int64_t i = 0; i < kSliceN; ++i)
      w.set(i, garbage && (i < begin || i >= end) ? 1e3f : slice_weight_at(i));
    step->input("m").fill(0.0f);
    step->input("v").fill(0.0f);
    Runner& g_runner = c.clipped ? *reducer : *step;
    const Tensor g = g_runner.input("g");
    for (int64_t i = 0; i < kSliceN; ++i) g.set(i, slice_grad_at(comm.rank(), i));
    if (c.clipped) g_runner.run();
    for (const auto& [name, v] : {std::pair<const char*, double>{"lr", 0.01},
                                  {"beta1", 0.9},
                                  {"beta2", 0.999},
                                  {"eps", 1e-8},
                                  {"weight_decay", 0.1},
                                  {"step", 1.0}})
      step->set_scalar(name, v);
    step->set_scalar("grad_scale", 1.0 / ranks);
    if (c.clipped) step->set_scalar("clip", 0.5);
    step->run();
    std::vector<float>& mine = out[static_cast<size_t>(comm.rank())];
    for (int64_t i = 0; i < kSliceN; ++i) mine.push_back(w.get(i));
  });
  return out;
}

std::vector<SliceNormCase> zero1_cases() {
  const DType g = DType::F32;
  const dsl::Segments segments = {0, 300, 301, 818, 1013};
  const auto lamb = [&](const char* schedule) {
    return SliceNormCase{
        std::string("lamb ") + schedule, plan_named(dsl::workloads::lamb(g), schedule), false, {}};
  };
  return {
      lamb("fused(RS-C-AG)+slice(m,v)"),
      lamb("RS-fused(C)-AG+slice(m,v)"),
      lamb("RS-C-AG"),
      {"lamb_bucket fused(RS-C-AG)+slice(m,v)",
       plan_named(dsl::workloads::lamb_bucket(g), "fused(RS-C-AG)+slice(m,v)"), false, segments},
      {"lamb_update fused(C)", plan_named(dsl::workloads::lamb_update(g), "fused(C)"), true, {}},
      {"lamb_bucket_update fused(C)", plan_named(dsl::workloads::lamb_bucket_update(g), "fused(C)"),
       true, segments}};
}

class LambSliceNormRun : public ::testing::TestWithParam<RunnerKind> {};

TEST_P(LambSliceNormRun, GarbageOutsideThisRanksSliceOfWChangesNothing) {
  for (const SliceNormCase& c : zero1_cases())
    for (int ranks : {2, 3}) {
      const auto clean = weights_after_a_step(c, GetParam(), ranks, false);
      const auto dirty = weights_after_a_step(c, GetParam(), ranks, true);
      for (int r = 0; r < ranks; ++r) {
        const std::vector<float>& want = clean[static_cast<size_t>(r)];
        const std::vector<float>& got = dirty[static_cast<size_t>(r)];
        ASSERT_EQ(got.size(), want.size());
        int64_t differ = 0, first = -1;
        for (size_t i = 0; i < got.size(); ++i)
          if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && differ++ == 0)
            first = static_cast<int64_t>(i);
        EXPECT_EQ(differ, 0) << c.label << " on " << ranks << " ranks, rank " << r << ": " << differ
                             << " of " << kSliceN << " weights differ, the first w[" << first
                             << "] = " << (first >= 0 ? got[static_cast<size_t>(first)] : 0.0f)
                             << ", clean "
                             << (first >= 0 ? want[static_cast<size_t>(first)] : 0.0f);
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Executors, LambSliceNormRun,
                         ::testing::Values(RunnerKind::Compiled, RunnerKind::Plan,
                                           RunnerKind::Reference),
                         [](const auto& info) {
                           return std::string(runner_kind_name(info.param));
                         });

}  // namespace
}  // namespace tandem::exec
