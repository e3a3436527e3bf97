// Every collective on the thread backend, both algorithms (direct shared memory and the ring over
// point-to-point), across ranks 1-4 x sizes 0, 1, 7, 1000 x f32/bf16/f16 x every op, with and
// without the fused hook, in place and not, against closed-form results; and 2^20+3 elements
// (f32, 2-4 ranks, a subset of ops and variants, to stay quick under the sanitizers).
#include <gtest/gtest.h>

#include <ostream>
#include <vector>

#include "comm/collective_checks.h"
#include "tandem/comm/thread.h"

namespace tandem::comm::testing {
namespace {

// A case: algorithm x ranks x dtype, over the small sizes (0, 1, 7, 1000) or the large one.
struct Case {
  CollectiveAlgo algo;
  int ranks;
  DType dtype;
  bool large;
};

constexpr int64_t kLarge = (int64_t{1} << 20) + 3;

std::string case_string(const Case& c) {
  return fmt::format("{}_p{}_{}_{}", collective_algo_name(c.algo), c.ranks, dtype_name(c.dtype),
                     c.large ? "n1048579" : "small");
}
std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return case_string(info.param);
}
// How GoogleTest (and so each CTest test's name) prints a case.
void PrintTo(const Case& c, std::ostream* os) { *os << case_string(c); }

class ThreadCollectives : public ::testing::TestWithParam<Case> {
 protected:
  // Small inputs get a 64-byte chunk (16 f32 elements) so that every multi-chunk path runs; the
  // large one keeps the default chunk size.
  ThreadCollectives() : chunk_(GetParam().large ? 0 : 64) {}

  std::vector<int64_t> sizes() const {
    if (GetParam().large) return {kLarge};
    return {0, 1, 7, 1000};
  }

  // The ops a case runs: all of them, except on the large size (time under the sanitizers).
  std::vector<ReduceOp> ops() const {
    if (GetParam().large) return {ReduceOp::Sum, ReduceOp::Max};
    return {std::begin(kAllOps), std::end(kAllOps)};
  }

  // Runs body(comm, n) for every size on every rank and expects every rank's report to be empty.
  void on_every_rank(const std::function<std::string(Communicator&, int64_t)>& body) {
    const Case& c = GetParam();
    std::vector<std::string> errors(c.ranks);
    with_deadline(120, "thread collective", [&] {
      run_ranks(c.ranks, [&](Communicator& comm) {
        for (int64_t n : sizes()) errors[comm.rank()] += body(comm, n);
      });
    });
    for (int r = 0; r < c.ranks; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  }

  ScopedChunkBytes chunk_;
};

TEST_P(ThreadCollectives, AllReduce) {
  const Case& c = GetParam();
  on_every_rank([&](Communicator& comm, int64_t n) {
    std::string err;
    for (ReduceOp op : ops()) err += all_reduce_case(comm, c.algo, c.dtype, n, op, false);
    return err;
  });
}

TEST_P(ThreadCollectives, AllReduceWithHook) {
  const Case& c = GetParam();
  on_every_rank([&](Communicator& comm, int64_t n) {
    std::string err;
    for (ReduceOp op : ops()) {
      if (c.large && op != ReduceOp::Sum) continue;
      err += all_reduce_case(comm, c.algo, c.dtype, n, op, true);
    }
    return err;
  });
}

TEST_P(ThreadCollectives, ReduceScatter) {
  const Case& c = GetParam();
  on_every_rank([&](Communicator& comm, int64_t n) {
    std::string err;
    if (!c.large) {
      for (ReduceOp op : ops()) {
        err += reduce_scatter_case(comm, c.algo, c.dtype, n, op, false, false);
        err += reduce_scatter_case(comm, c.algo, c.dtype, n, op, false, true);
      }
    }
    err += reduce_scatter_case(comm, c.algo, c.dtype, n, ReduceOp::Sum, true, false);
    err += reduce_scatter_case(comm, c.algo, c.dtype, n, ReduceOp::Max, true, true);
    return err;
  });
}

TEST_P(ThreadCollectives, AllGather) {
  const Case& c = GetParam();
  on_every_rank([&](Communicator& comm, int64_t n) {
    return all_gather_case(comm, c.algo, c.dtype, n, false) +
           all_gather_case(comm, c.algo, c.dtype, n, true);
  });
}

TEST_P(ThreadCollectives, Broadcast) {
  const Case& c = GetParam();
  on_every_rank([&](Communicator& comm, int64_t n) {
    std::string err;
    // Every root on the small sizes; the last rank (the longest way round the ring) on the large.
    for (int root = c.large ? comm.size() - 1 : 0; root < comm.size(); ++root)
      err += broadcast_case(comm, c.algo, c.dtype, n, root);
    return err;
  });
}

TEST_P(ThreadCollectives, Shift) {
  const Case& c = GetParam();
  on_every_rank(
      [&](Communicator& comm, int64_t n) { return shift_case(comm, c.algo, c.dtype, n); });
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (CollectiveAlgo algo : {CollectiveAlgo::Direct, CollectiveAlgo::Ring})
    for (int ranks = 1; ranks <= 4; ++ranks) {
      for (DType t : kAllDTypes) cases.push_back({algo, ranks, t, false});
      // One rank moves nothing; the small sizes cover it.
      if (ranks > 1) cases.push_back({algo, ranks, DType::F32, true});
    }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Comm, ThreadCollectives, ::testing::ValuesIn(all_cases()), case_name);

// The default algorithm (Auto) is the direct one on threads; the public methods use it.
TEST(ThreadCollectivesAuto, PublicMethodsUseTheDefaultAlgorithm) {
  ScopedChunkBytes chunk(64);
  std::vector<std::string> errors(3);
  run_ranks(3, [&](Communicator& comm) {
    std::string& err = errors[comm.rank()];
    err += all_reduce_case(comm, CollectiveAlgo::Auto, DType::BF16, 1000, ReduceOp::Sum, true);
    err += reduce_scatter_case(comm, CollectiveAlgo::Auto, DType::F16, 999, ReduceOp::Min, true,
                               false);
    err += all_gather_case(comm, CollectiveAlgo::Auto, DType::F32, 1001, false);
    err += broadcast_case(comm, CollectiveAlgo::Auto, DType::F32, 77, 2);
    err += shift_case(comm, CollectiveAlgo::Auto, DType::BF16, 1001);
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// Many collectives back to back on one group, alternating kinds, ops and the hook: the slots'
// double buffering and the sequence numbers must keep consecutive calls apart.
TEST(ThreadCollectivesAuto, BackToBack) {
  ScopedChunkBytes chunk(64);
  for (CollectiveAlgo algo : {CollectiveAlgo::Direct, CollectiveAlgo::Ring}) {
    for (int ranks = 2; ranks <= 4; ++ranks) {
      std::vector<std::string> errors(ranks);
      run_ranks(ranks, [&](Communicator& comm) {
        std::string& err = errors[comm.rank()];
        for (int round = 0; round < 12; ++round) {
          const DType t = kAllDTypes[round % 3];
          err += all_reduce_case(comm, algo, t, 333, kAllOps[round % 4], round % 2 == 0);
          err += all_gather_case(comm, algo, t, 100 + round, round % 2 == 0);
          err += broadcast_case(comm, algo, t, 50, round % ranks);
          err += shift_case(comm, algo, t, 40 + round);
          comm.barrier();
        }
      });
      for (int r = 0; r < ranks; ++r)
        EXPECT_EQ(errors[r], "") << collective_algo_name(algo) << " " << ranks << " ranks, rank "
                                 << r;
    }
  }
}

// Multi-dimensional tensors are collectives over their flattened elements.
TEST(ThreadCollectivesAuto, MultiDimensionalTensorsAreFlattened) {
  std::vector<std::string> errors(2);
  run_ranks(2, [&](Communicator& comm) {
    Tensor t = Tensor::empty(DType::F32, {3, 5, 2});
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, static_cast<float>(i * (comm.rank() + 1)));
    comm.all_reduce(t, ReduceOp::Sum);
    errors[comm.rank()] = check("all_reduce f32[3, 5, 2]", t, 0, [](int64_t i) { return 3.0 * i; });
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

}  // namespace
}  // namespace tandem::comm::testing
