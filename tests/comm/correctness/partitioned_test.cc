// Partitioned collectives on the thread backend: all_reduce (with the hook), reduce_scatter (into
// a packed part, a whole-shaped buffer and in place; with and without the hook) and all_gather
// (from a packed part and in place) over [outer, rows, inner] partitions (one outer block and
// several, rows that do not divide by the ranks, fewer rows than ranks, inner > 1, nothing at all),
// on 1-4 ranks, by the direct, ring and hierarchical algorithms, against a naive element-by-element
// reference of who owns what; the hook must see each element of this rank's part once, in chunks
// that never leave a run of the part.
#include <gtest/gtest.h>

#include <ostream>
#include <vector>

#include "comm/collective_checks.h"
#include "tandem/comm/thread.h"

namespace tandem::comm::testing {
namespace {

// How the case runs: an algorithm by name, or Auto on ranks grouped into nodes of `per_node`
// (the hierarchical algorithms).
struct PartCase {
  CollectiveAlgo algo;
  int ranks;
  int per_node;  // 0: one node
  DType dtype;
};

std::string part_case_string(const PartCase& c) {
  return fmt::format(
      "{}_p{}{}_{}", c.per_node > 0 ? "hierarchical" : std::string(collective_algo_name(c.algo)),
      c.ranks, c.per_node > 0 ? fmt::format("_nodes_of_{}", c.per_node) : "", dtype_name(c.dtype));
}
std::string part_case_name(const ::testing::TestParamInfo<PartCase>& info) {
  return part_case_string(info.param);
}
void PrintTo(const PartCase& c, std::ostream* os) { *os << part_case_string(c); }

class PartitionedCollectives : public ::testing::TestWithParam<PartCase> {
 protected:
  // 64-byte chunks: the runs of the larger shapes take several.
  PartitionedCollectives()
      : nodes_(GetParam().per_node > 0 ? GetParam().per_node : -1), chunk_(64) {}

  ScopedRanksPerNode nodes_;
  ScopedChunkBytes chunk_;
};

TEST_P(PartitionedCollectives, EveryKindAndShapeAgainstTheReference) {
  const PartCase& c = GetParam();
  std::vector<std::string> errors(c.ranks);
  with_deadline(120, "partitioned collective", [&] {
    run_ranks(c.ranks, [&](Communicator& comm) {
      errors[comm.rank()] = partitioned_cases(comm, c.algo, c.dtype);
    });
  });
  for (int r = 0; r < c.ranks; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

std::vector<PartCase> part_cases() {
  std::vector<PartCase> cases;
  for (CollectiveAlgo algo : {CollectiveAlgo::Direct, CollectiveAlgo::Ring})
    for (int ranks = 1; ranks <= 4; ++ranks)
      for (DType t : {DType::F32, DType::BF16}) cases.push_back({algo, ranks, 0, t});
  for (DType t : {DType::F32, DType::BF16}) {
    cases.push_back({CollectiveAlgo::Auto, 4, 2, t});
    cases.push_back({CollectiveAlgo::Auto, 6, 3, t});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Comm, PartitionedCollectives, ::testing::ValuesIn(part_cases()),
                         part_case_name);

// The public methods carry the partition too, and a partitioned call between flat ones leaves
// the group in step.
TEST(PartitionedCollectivesAuto, PublicMethodsTakeThePartition) {
  ScopedChunkBytes chunk(64);
  const PartitionDesc d{3, 5, 2};
  std::vector<std::string> errors(3);
  run_ranks(3, [&](Communicator& comm) {
    const int p = comm.size(), r = comm.rank();
    const std::vector<int64_t> mine = part_elements(d, p, r);
    std::string& err = errors[static_cast<size_t>(r)];
    Tensor in = Tensor::empty(DType::F32, {30}),
           out = Tensor::empty(DType::F32, {static_cast<int64_t>(mine.size())});
    fill(in, 0, [&](int64_t i) { return input_value(ReduceOp::Sum, r, i); });
    std::vector<std::pair<int64_t, int64_t>> calls;
    comm.reduce_scatter(
        in, out, ReduceOp::Sum,
        [&](const Tensor& ch, int64_t off) { calls.emplace_back(off, ch.numel()); }, d);
    err += check("reduce_scatter", out, 0,
                 [&](int64_t k) { return expected_value(ReduceOp::Sum, p, mine[k]); });
    err += check_part_coverage("reduce_scatter", calls, d, p, r, DType::F32);
    err += all_reduce_case(comm, CollectiveAlgo::Auto, DType::F32, 77, ReduceOp::Sum, true);
    Tensor whole = Tensor::empty(DType::F32, {30});
    comm.all_gather(out, whole, d);
    err += check("all_gather", whole, 0,
                 [&](int64_t i) { return expected_value(ReduceOp::Sum, p, i); });
    calls.clear();
    comm.all_reduce(
        in, ReduceOp::Sum,
        [&](const Tensor& ch, int64_t off) { calls.emplace_back(off, ch.numel()); }, d);
    err += check_part_coverage("all_reduce", calls, d, p, r, DType::F32);
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
}

}  // namespace
}  // namespace tandem::comm::testing
