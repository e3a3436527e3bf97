// LAMB over a bucket of tensors (lamb_bucket, lamb_bucket_update: segment_norm and segment_scale)
// against LAMB per tensor (lamb, lamb_update) run on each segment alone: one segment is bitwise the
// one-tensor program; many segments are bitwise per-tensor LAMB on 1 rank, and within a stated
// bound on more (only the cross-rank cut of each ||w|| and ||r|| differs); every executor and
// both ZeRO-1 schedules give bitwise the reference interpreter's weights. 1-4 ranks, uneven
// segments, a segment smaller than the rank count, three steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "support/schedules.h"
#include "tandem/comm/thread.h"
#include "tandem/core/error.h"
#include "tandem/dsl/workloads.h"
#include "tandem/exec/runner.h"

namespace tandem::exec {
namespace {

using tandem::testing::plan_named;

// Tensor sizes of a bucket: uneven, two smaller than 3 and 4 ranks, one of a single element.
const std::vector<int64_t> kSizes = {300, 2, 1, 517, 64, 3, 113};
constexpr int kSteps = 3;
const char* const kZero1 = "fused(RS-C-AG)+slice(m,v)";

dsl::Segments bounds_of(const std::vector<int64_t>& sizes) {
  dsl::Segments b = {0};
  for (int64_t n : sizes) b.push_back(b.back() + n);
  return b;
}

float weight_at(int64_t i) {
  return static_cast<float>(0.5 * std::sin(0.37 * static_cast<double>(i) + 0.1));
}
float bucket_grad_at(int rank, int step, int64_t i) {
  return static_cast<float>(0.06 *
                            std::cos(0.71 * static_cast<double>(i) + 1.3 * rank + 0.5 * step));
}

void set_bucket_hyper(Runner& r, int step, int ranks) {
  for (const auto& [name, v] : {std::pair<const char*, double>{"lr", 0.01},
                                {"beta1", 0.9},
                                {"beta2", 0.999},
                                {"eps", 1e-8},
                                {"weight_decay", 0.1}})
    r.set_scalar(name, v);
  r.set_scalar("step", step);
  r.set_scalar("grad_scale", 1.0 / ranks);
}

// One optimizer over [offset, offset + n) of the model: the one-program step, or with `clipped`
// grad_reduce then the update (clip 1/2).
struct Stepper {
  std::unique_ptr<Runner> step, reduce;
  int64_t offset = 0, n = 0;
};

struct Setup {
  RunnerKind kind;
  bool clipped;
  const schedule::Plan* one;     // the one-program step (unclipped)
  const schedule::Plan* reduce;  // grad_reduce (clipped)
  const schedule::Plan* update;  // the update (clipped)
};

Stepper make_stepper(const Setup& s, comm::Communicator& comm, int64_t offset,
                     const dsl::Segments& segments) {
  Stepper st;
  st.offset = offset;
  st.n = segments.back();
  dsl::SymbolMap symbols{{"N", st.n}};
  RunnerOptions options;
  if (s.clipped) {
    st.reduce = make_runner(s.kind, *s.reduce, comm, symbols);
    options.bound = {"g_sum"};
  }
  const schedule::Plan& plan = s.clipped ? *s.update : *s.one;
  if (!plan.program.segment_stages().empty()) {
    symbols["S"] = static_cast<int64_t>(segments.size()) - 1;
    options.segments = segments;
  }
  st.step = make_runner(s.kind, plan, comm, symbols, options);
  if (s.clipped) st.step->bind("g_sum", st.reduce->output("g_sum"));
  Runner& u = *st.step;
  for (int64_t i = 0; i < st.n; ++i) u.input("w").set(i, weight_at(offset + i));
  u.input("m").fill(0.0f);
  u.input("v").fill(0.0f);
  return st;
}

void run_step(Stepper& st, int rank, int step, int ranks, bool clipped) {
  Runner& g_runner = clipped ? *st.reduce : *st.step;
  const Tensor g = g_runner.input("g");
  for (int64_t i = 0; i < st.n; ++i) g.set(i, bucket_grad_at(rank, step, st.offset + i));
  if (clipped) g_runner.run();
  set_bucket_hyper(*st.step, step, ranks);
  if (clipped) st.step->set_scalar("clip", 0.5);
  st.step->run();
}

struct Plans {
  schedule::Plan one, reduce, update;
};

Plans plans(bool bucket, const std::string& schedule = kZero1) {
  const DType g = DType::F32;
  return {
      plan_named(bucket ? dsl::workloads::lamb_bucket(g) : dsl::workloads::lamb(g), schedule),
      plan_named(dsl::workloads::grad_reduce(g), "C"),
      plan_named(bucket ? dsl::workloads::lamb_bucket_update(g) : dsl::workloads::lamb_update(g),
                 "fused(C)")};
}

// The weights after kSteps steps on every rank: one program over the whole bucket, or one per
// tensor (`per_tensor`). Rank 0's copy (every rank holds the same).
std::vector<float> weights_after(const Plans& pl, RunnerKind kind, bool clipped, int ranks,
                                 const std::vector<int64_t>& sizes, bool per_tensor) {
  std::vector<float> out;
  comm::run_ranks(ranks, [&](comm::Communicator& comm) {
    const Setup s{kind, clipped, &pl.one, &pl.reduce, &pl.update};
    std::vector<Stepper> steppers;
    if (per_tensor) {
      int64_t offset = 0;
      for (int64_t n : sizes) {
        steppers.push_back(make_stepper(s, comm, offset, {0, n}));
        offset += n;
      }
    } else {
      steppers.push_back(make_stepper(s, comm, 0, bounds_of(sizes)));
    }
    for (int step = 1; step <= kSteps; ++step)
      for (Stepper& st : steppers) run_step(st, comm.rank(), step, ranks, clipped);
    std::vector<float> w;
    for (Stepper& st : steppers) {
      const Tensor t = st.step->input("w");
      for (int64_t i = 0; i < st.n; ++i) w.push_back(t.get(i));
    }
    if (comm.rank() == 0) out = w;
  });
  return out;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The largest |a - b| relative to the L2 norm of b's tensor (segment), over every tensor, and
// where: a weight near zero says nothing by itself, so the error is measured against its tensor.
std::pair<double, size_t> max_normwise_error(const std::vector<float>& a,
                                             const std::vector<float>& b,
                                             const std::vector<int64_t>& sizes) {
  double worst = 0;
  size_t at = 0, begin = 0;
  for (int64_t n : sizes) {
    double norm = 0;
    for (size_t i = begin; i < begin + static_cast<size_t>(n); ++i)
      norm += static_cast<double>(b[i]) * b[i];
    norm = std::sqrt(norm);
    for (size_t i = begin; i < begin + static_cast<size_t>(n); ++i) {
      const double e = std::abs(static_cast<double>(a[i]) - b[i]) / norm;
      if (e > worst) {
        worst = e;
        at = i;
      }
    }
    begin += static_cast<size_t>(n);
  }
  return {worst, at};
}

class LambBucket : public ::testing::TestWithParam<RunnerKind> {};

// With one segment the bucket program is the one-tensor program, operation for operation.
TEST_P(LambBucket, OneSegmentIsTheOneTensorProgram) {
  const Plans bucket = plans(true), tensor = plans(false);
  for (bool clipped : {false, true})
    for (int ranks = 1; ranks <= 4; ++ranks) {
      const std::vector<int64_t> one = {1001};
      EXPECT_TRUE(bitwise_equal(weights_after(bucket, GetParam(), clipped, ranks, one, false),
                                weights_after(tensor, GetParam(), clipped, ranks, one, false)))
          << "clipped " << clipped << ", " << ranks << " ranks";
    }
}

// The bound. ||w||^2 and ||r||^2 are each an f32 sum over p ranks of f32-rounded partial sums of
// the ranks' slices (lanes keyed by the index within the segment), each program's within
// (2p - 1) 2^-24 relative of the exact sum, but the bucket's slices cut a tensor elsewhere than
// the tensor's own: each pair of norms differs by at most about 2p 2^-24 relative, so the trust
// ratios by about 4p 2^-24 (1e-6 at p = 4). A weight moves by lr * trust * r_i per step, and
// |trust * r_i| <= ||w||, so each step adds at most lr * 1e-6 * ||w|| = 1e-8 ||w|| (lr 0.01) to
// the difference: after three steps every |w_bucket - w_tensor| <= 1e-7 ||w|| of its tensor (the
// feedback through the next steps' norms is of second order). On 1 rank nothing is cut: bitwise.
TEST_P(LambBucket, EachSegmentIsItsTensorWithinTheBound) {
  const Plans bucket = plans(true), tensor = plans(false);
  for (bool clipped : {false, true})
    for (int ranks = 1; ranks <= 4; ++ranks) {
      const std::vector<float> got =
          weights_after(bucket, GetParam(), clipped, ranks, kSizes, false);
      const std::vector<float> want =
          weights_after(tensor, GetParam(), clipped, ranks, kSizes, true);
      ASSERT_EQ(got.size(), want.size());
      if (ranks == 1) {
        EXPECT_TRUE(bitwise_equal(got, want)) << "clipped " << clipped << " on 1 rank";
        continue;
      }
      const auto [err, at] = max_normwise_error(got, want, kSizes);
      EXPECT_LE(err, 1e-7) << "clipped " << clipped << ", " << ranks << " ranks: element " << at
                           << " is " << got[at] << ", per tensor " << want[at]
                           << " (|difference| / ||w|| of its tensor)";
      if (::testing::Test::HasFailure()) return;
      std::fprintf(
          stderr, "lamb_bucket vs lamb per tensor, clipped %d, %d ranks: max |dw| / ||w|| = %.3g\n",
          clipped ? 1 : 0, ranks, err);
    }
}

// The compiled executor and the plan runner compute bitwise what the reference interpreter does,
// and the unfused ZeRO-1 schedule what the fused one does (the same operations in the same order).
TEST_P(LambBucket, BitwiseTheReferenceInterpreter) {
  const Plans fused = plans(true), unfused = plans(true, "RS-C-AG+slice(m,v)");
  for (bool clipped : {false, true})
    for (int ranks = 1; ranks <= 4; ++ranks) {
      const std::vector<float> want =
          weights_after(fused, RunnerKind::Reference, clipped, ranks, kSizes, false);
      EXPECT_TRUE(
          bitwise_equal(weights_after(fused, GetParam(), clipped, ranks, kSizes, false), want))
          << kZero1 << ", clipped " << clipped << ", " << ranks << " ranks";
      if (!clipped) {
        EXPECT_TRUE(
            bitwise_equal(weights_after(unfused, GetParam(), clipped, ranks, kSizes, false), want))
            << "RS-C-AG+slice(m,v), " << ranks << " ranks";
      }
    }
}

// Communication per program under ZeRO-1, counted in the plans: AdamW reduce-scatters and
// gathers; LAMB adds two all-reduces, one for ||r|| and one for ||w|| (each rank sums the squares
// of its slice of w only), per tensor before buckets, per bucket of any number of tensors now.
int collectives(const schedule::Plan& plan) {
  int n = 0;
  for (const schedule::Step& s : plan.steps)
    n += s.kind == schedule::StepKind::Collective ||
         (s.kind == schedule::StepKind::Reduce && s.reduce.across_ranks) ||
         (s.kind == schedule::StepKind::Finish && s.finish.across_ranks);
  return n;
}

TEST(LambBucketPlan, TwoAllReducesMoreThanAdamForAWholeBucket) {
  const DType g = DType::F32;
  EXPECT_EQ(collectives(plan_named(dsl::workloads::adam(g), kZero1)), 2);
  EXPECT_EQ(collectives(plan_named(dsl::workloads::lamb(g), kZero1)), 4);
  EXPECT_EQ(collectives(plan_named(dsl::workloads::lamb_bucket(g), kZero1)), 4);
  EXPECT_EQ(collectives(plan_named(dsl::workloads::adam_update(g), "fused(C)")), 1);
  EXPECT_EQ(collectives(plan_named(dsl::workloads::lamb_bucket_update(g), "fused(C)")), 3);
}

INSTANTIATE_TEST_SUITE_P(Executors, LambBucket,
                         ::testing::Values(RunnerKind::Compiled, RunnerKind::Plan,
                                           RunnerKind::Reference),
                         [](const auto& info) {
                           return std::string(runner_kind_name(info.param));
                         });

}  // namespace
}  // namespace tandem::exec
