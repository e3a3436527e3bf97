// A property test of the compiler: random small programs (random elementwise DAGs around one
// AllReduce, with broadcasts, dropout, 16-bit round trips and an in-place update), every schedule
// enumerate_schedules finds for each (split, reorder, fuse, as_slice), compiled and run on 1 to 4
// in-process ranks with shapes that do not divide by the rank count, equal to the reference
// interpreter on the unscheduled program, bitwise.
#include <gtest/gtest.h>

#include <mutex>
#include <random>

#include "exec/compiled_checks.h"
#include "tandem/comm/thread.h"

namespace tandem::codegen::testing {
namespace {

using namespace tandem::dsl;  // NOLINT: the builder's vocabulary reads best unqualified

// The program of `seed`: inputs g (each rank's own, in a random dtype), x, bias (a row vector
// broadcast over the rows) and w (updated in place); the sum of g over the ranks, then 4 to 9
// random stages, each reading earlier values; w takes the last one; two values are outputs.
Program random_program(uint32_t seed) {
  std::mt19937 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
  Program p(fmt::format("random{}", seed));
  const DType dg =
      std::vector<DType>{DType::F32, DType::BF16, DType::F16}[static_cast<size_t>(pick(3))];
  const Expr g = p.input(dg, {"R", "C"}, Local, "g");
  const Expr x = p.input(F32, {"R", "C"}, Replicated, "x");
  const Expr bias = p.input(BF16, {"C"}, Replicated, "bias");
  const Expr w = p.input(F32, {"R", "C"}, Replicated, "w");
  const Expr s = p.scalar("s");
  const Expr key = p.scalar("seed");
  const Expr sum = AllReduce(Sum, g).named("sum");
  const Expr first = dg == F32 ? sum : cast(sum, F32);
  std::vector<Expr> pool = {first, x, cast(bias, F32)};
  const int stages = 4 + pick(6);
  for (int i = 0; i < stages; ++i) {
    // The first stage reads the sum, so that the AllReduce is never dead.
    const Expr a = i == 0 ? first : pool[static_cast<size_t>(pick(static_cast<int>(pool.size())))];
    const Expr b = pool[static_cast<size_t>(pick(static_cast<int>(pool.size())))];
    Expr e;
    switch (pick(12)) {
      case 0:
        e = a + b;
        break;
      case 1:
        e = a - b;
        break;
      case 2:
        e = a * b;
        break;
      case 3:
        e = a / (abs(b) + 1.0);
        break;
      case 4:
        e = max(a, b);
        break;
      case 5:
        e = select(a < b, a, b * s);
        break;
      case 6:
        e = tanh(a) + relu(b);
        break;
      case 7:
        e = sqrt(abs(a)) * gelu(b);
        break;
      case 8:
        e = dropout(a, 0.25, key);
        break;
      case 9:
        e = exp(min(a, 3.0)) - s;
        break;
      case 10: {
        // A 16-bit round trip: the narrow intermediates are rounded in registers too.
        const DType t = pick(2) == 0 ? BF16 : F16;
        e = cast(cast(a, t) * cast(b, t), F32);
        break;
      }
      default:
        e = a * s + 0.5;
        break;
    }
    pool.push_back(e.named(fmt::format("v{}", i)));
  }
  const Expr last = pool.back();
  update(w, w - s * last).named("w1");
  p.output(pool[3 + static_cast<size_t>(pick(stages))], "o1");
  p.output(pool[static_cast<size_t>(pick(static_cast<int>(pool.size())))], "o2");
  return p;
}

TEST(CompiledRandom, EverySchedulePerProgramBitwise) {
  comm::set_chunk_bytes(64);
  int schedules = 0;
  for (uint32_t seed : {11u, 12u, 13u}) {
    const Program p = random_program(seed);
    const Schedules all = compile_all(p);
    schedules += static_cast<int>(all.plans.size());
    for (const auto& [r, c] : {std::pair<int64_t, int64_t>{5, 3}, {8, 4}}) {
      const Case cs{fmt::format("{} R={} C={}", p.name(), r, c),
                    p,
                    {{"R", r}, {"C", c}},
                    {{"s", 0.375}, {"seed", 99}},
                    1};
      for (int ranks = 1; ranks <= 4; ++ranks) {
        std::mutex mu;
        std::string failures;
        int bitwise = 0, ran = 0;
        comm::run_ranks(ranks, [&](comm::Communicator& comm) {
          const Outcome o = check_compiled(cs, all, comm);
          std::lock_guard<std::mutex> lock(mu);
          failures += o.failures;
          if (comm.rank() == 0) {
            bitwise = o.bitwise;
            ran = o.schedules;
          }
        });
        EXPECT_EQ(failures, "") << cs.label << " on " << ranks << " ranks";
        EXPECT_EQ(ran, static_cast<int>(all.plans.size())) << cs.label;
        EXPECT_EQ(bitwise, ran) << cs.label << ": elementwise programs keep the reference's order";
      }
    }
  }
  EXPECT_GE(schedules, 15) << "the random programs have several schedules each";
  comm::set_chunk_bytes(0);
}

}  // namespace
}  // namespace tandem::codegen::testing
