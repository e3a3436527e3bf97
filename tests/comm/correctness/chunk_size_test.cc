// A collective's own chunk size (CollectiveDesc::chunk_bytes) on the thread backend: all_reduce
// and reduce_scatter with a hook, and all_gather, flat and partitioned, over sizes that do not
// divide by the ranks, on 1-4 ranks, by the direct, ring and hierarchical algorithms, give bitwise
// the results of the same size set process-wide (set_chunk_bytes), with the hook called on the same
// chunks, none longer than the call's size, while the process-wide value is another.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <ostream>
#include <utility>
#include <vector>

#include "comm/collective_checks.h"
#include "tandem/comm/thread.h"

namespace tandem::comm::testing {
namespace {

struct ChunkCase {
  CollectiveAlgo algo;
  int ranks;
  int per_node;  // > 0: Auto on ranks grouped into nodes of this many (the hierarchical algorithms)
  DType dtype;
};

std::string chunk_case_string(const ChunkCase& c) {
  return fmt::format("{}_p{}_{}",
                     c.per_node > 0 ? "hierarchical" : std::string(collective_algo_name(c.algo)),
                     c.ranks, dtype_name(c.dtype));
}
std::string chunk_case_name(const ::testing::TestParamInfo<ChunkCase>& info) {
  return chunk_case_string(info.param);
}
void PrintTo(const ChunkCase& c, std::ostream* os) { *os << chunk_case_string(c); }

// What one rank's calls left: each output's bytes, and each hook's calls as (offset, length).
struct Outcome {
  std::vector<std::vector<char>> outputs;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> hooks;
};

std::vector<char> bytes_of(const Tensor& t) {
  std::vector<char> b(t.nbytes());
  if (!b.empty()) std::memcpy(b.data(), t.data(), b.size());
  return b;
}

// Every call of the case on this rank, each desc naming `chunk` bytes (0: the process's).
Outcome run_calls(Communicator& c, CollectiveAlgo algo, DType t, size_t chunk) {
  const int p = c.size(), r = c.rank();
  Outcome o;
  // Flat sizes (1, primes, not a multiple of the ranks) and partitions with several runs a rank.
  const std::pair<int64_t, PartitionDesc> shapes[] = {
      {1, {}}, {7, {}}, {13, {}}, {1000, {}}, {4099, {}}, {840, {3, 40, 7}}, {66, {6, 11, 1}}};
  uint64_t seed = 11;
  for (const auto& [n, part] : shapes) {
    const int64_t count = part.rows < 0 ? fx::part_count(n, p, r)
                                        : part.outer * fx::part_count(part.rows, p, r) * part.inner;
    auto hook = [](std::vector<std::pair<int64_t, int64_t>>& calls) {
      return [&calls](const Tensor& chunk, int64_t offset) {
        calls.emplace_back(offset, chunk.numel());
        for (int64_t k = 0; k < chunk.numel(); ++k) chunk.set(k, chunk.get(k) * 0.5f);
      };
    };

    Tensor buf = Tensor::empty(t, {n}, c.allocator());
    fill(buf, 0, [&](int64_t i) { return random_value(seed, r, i); });
    o.hooks.emplace_back();
    all_reduce(c, algo, buf, ReduceOp::Sum, hook(o.hooks.back()), part, chunk);
    o.outputs.push_back(bytes_of(buf));

    Tensor in = Tensor::empty(t, {n}, c.allocator()),
           out = Tensor::empty(t, {count}, c.allocator());
    fill(in, 0, [&](int64_t i) { return random_value(seed + 1, r, i); });
    o.hooks.emplace_back();
    reduce_scatter(c, algo, in, out, ReduceOp::Sum, hook(o.hooks.back()), part, chunk);
    o.outputs.push_back(bytes_of(out));

    Tensor whole = Tensor::empty(t, {n}, c.allocator());
    whole.fill(-99.0f);
    all_gather(c, algo, out, whole, part, chunk);
    o.outputs.push_back(bytes_of(whole));
    seed += 2;
  }
  return o;
}

class ChunkSize : public ::testing::TestWithParam<ChunkCase> {
 protected:
  ChunkSize() : nodes_(GetParam().per_node > 0 ? GetParam().per_node : -1) {}

  // Every rank's outcome of run_calls at `desc_chunk`, with the process-wide size `process_chunk`.
  std::vector<Outcome> on_every_rank(size_t process_chunk, size_t desc_chunk) {
    const ChunkCase& c = GetParam();
    ScopedChunkBytes process(process_chunk);
    std::vector<Outcome> out(static_cast<size_t>(c.ranks));
    with_deadline(120, "collective with its own chunk size", [&] {
      run_ranks(c.ranks, [&](Communicator& comm) {
        out[static_cast<size_t>(comm.rank())] = run_calls(comm, c.algo, c.dtype, desc_chunk);
      });
    });
    return out;
  }

  ScopedRanksPerNode nodes_;
};

TEST_P(ChunkSize, PerCallSizeActsAsTheProcessWideOne) {
  const ChunkCase& c = GetParam();
  const size_t kOther =
      size_t{1} << 20;  // one chunk for every buffer here, if the call's size were ignored
  for (size_t chunk : {size_t{8}, size_t{100}, size_t{1024}}) {
    SCOPED_TRACE(fmt::format("chunk_bytes {}", chunk));
    const std::vector<Outcome> per_call = on_every_rank(kOther, chunk);
    const std::vector<Outcome> process = on_every_rank(chunk, 0);
    const int64_t ce = std::max<int64_t>(1, static_cast<int64_t>(chunk / dtype_size(c.dtype)));
    for (int r = 0; r < c.ranks; ++r) {
      const Outcome& a = per_call[static_cast<size_t>(r)];
      const Outcome& b = process[static_cast<size_t>(r)];
      ASSERT_EQ(a.outputs.size(), b.outputs.size());
      for (size_t k = 0; k < a.outputs.size(); ++k)
        EXPECT_TRUE(a.outputs[k] == b.outputs[k]) << "rank " << r << ": output " << k << " differs";
      for (size_t k = 0; k < a.hooks.size(); ++k)
        EXPECT_TRUE(a.hooks[k] == b.hooks[k])
            << "rank " << r << ": hook " << k << " saw other chunks";
      int64_t longest = 0;
      for (const auto& calls : a.hooks)
        for (const auto& [offset, n] : calls) longest = std::max(longest, n);
      // Every rank's part of the 4099-element buffer is longer than a chunk: the hook sees full
      // ones.
      EXPECT_EQ(longest, ce) << "rank " << r << ": the longest chunk the hook saw";
    }
  }
}

std::vector<ChunkCase> chunk_cases() {
  std::vector<ChunkCase> cases;
  for (CollectiveAlgo algo : {CollectiveAlgo::Direct, CollectiveAlgo::Ring})
    for (int ranks = 1; ranks <= 4; ++ranks)
      for (DType t : {DType::F32, DType::BF16}) cases.push_back({algo, ranks, 0, t});
  for (DType t : {DType::F32, DType::BF16}) cases.push_back({CollectiveAlgo::Auto, 4, 2, t});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Comm, ChunkSize, ::testing::ValuesIn(chunk_cases()), chunk_case_name);

}  // namespace
}  // namespace tandem::comm::testing
