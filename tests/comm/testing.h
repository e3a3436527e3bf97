// Shared helpers of the comm test suites: inputs with closed-form results that are exact in every
// dtype, a labelled checker, a scoped chunk size, and a deadline for tests that must not hang.
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "tandem/comm/communicator.h"
#include "tandem/core/formulas.h"
#include "tandem/core/tensor.h"

namespace tandem::comm::testing {

inline constexpr ReduceOp kAllOps[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min};

// Rank r's input at element i for `op`. Every value, and every partial result in any order of
// combination, is exact in bf16 and f16: small integers for sum (|total| <= 60 on 4 ranks),
// signed powers of two for prod, integers in [-20, 20] for max and min.
inline float input_value(ReduceOp op, int r, int64_t i) {
  switch (op) {
    case ReduceOp::Sum:
      return static_cast<float>((r + 1) * (i % 13 - 6));
    case ReduceOp::Prod: {
      const float mag = std::ldexp(1.0f, static_cast<int>((i + r) % 3) - 1);
      return (i + 2 * r) % 5 == 0 ? -mag : mag;
    }
    case ReduceOp::Max:
    case ReduceOp::Min:
      return static_cast<float>((i * 7 + r * 13) % 41 - 20);
  }
  return 0.0f;
}

// The reduction of input_value over ranks 0 .. p-1 at element i.
inline double expected_value(ReduceOp op, int p, int64_t i) {
  double acc = input_value(op, 0, i);
  for (int r = 1; r < p; ++r) {
    const double v = input_value(op, r, i);
    switch (op) {
      case ReduceOp::Sum:
        acc += v;
        break;
      case ReduceOp::Prod:
        acc *= v;
        break;
      case ReduceOp::Max:
        acc = std::max(acc, v);
        break;
      case ReduceOp::Min:
        acc = std::min(acc, v);
        break;
    }
  }
  return acc;
}

// What all_gather and broadcast move: any value exact in every dtype, distinct per source.
inline float gather_value(int source, int64_t i) {
  return static_cast<float>((i * 5 + source * 11) % 37 - 18);
}

// Fills elements [0, t.numel()) with f(offset + k).
inline void fill(const Tensor& t, int64_t offset, const std::function<float(int64_t)>& f) {
  for (int64_t k = 0; k < t.numel(); ++k) t.set(k, f(offset + k));
}

// Compares t[k] with want(offset + k); "" if all equal, else a labelled report with the count of
// differing elements, the largest difference and the first few differing elements.
inline std::string check(const std::string& label, const Tensor& t, int64_t offset,
                         const std::function<double(int64_t)>& want) {
  int64_t bad = 0;
  double max_diff = 0;
  std::string first;
  for (int64_t k = 0; k < t.numel(); ++k) {
    const double got = t.get(k), w = want(offset + k);
    const bool same = got == w || (std::isnan(got) && std::isnan(w));
    if (same) continue;
    max_diff = std::max(max_diff, std::abs(got - w));
    if (++bad <= 5) first += fmt::format(" [{}]={} (want {})", offset + k, got, w);
  }
  if (bad == 0) return "";
  return fmt::format("{}: {} of {} elements differ, max diff {};{}\n", label, bad, t.numel(),
                     max_diff, first);
}

// Sets chunk_bytes() for the scope, so small inputs take the multi-chunk paths.
class ScopedChunkBytes {
 public:
  explicit ScopedChunkBytes(size_t bytes) { set_chunk_bytes(bytes); }
  ~ScopedChunkBytes() { set_chunk_bytes(0); }
  ScopedChunkBytes(const ScopedChunkBytes&) = delete;
  ScopedChunkBytes& operator=(const ScopedChunkBytes&) = delete;
};

// Groups every k consecutive ranks as one node for the scope (TANDEM_RANKS_PER_NODE=k), so that
// collectives on 4 ranks take the hierarchical algorithms as 2 nodes of 2.
class ScopedRanksPerNode {
 public:
  explicit ScopedRanksPerNode(int k) { set_ranks_per_node(k); }
  ~ScopedRanksPerNode() { set_ranks_per_node(-1); }
  ScopedRanksPerNode(const ScopedRanksPerNode&) = delete;
  ScopedRanksPerNode& operator=(const ScopedRanksPerNode&) = delete;
};

// A pseudo-random integer in [-8, 8] for (seed, rank, element): sums over up to 6 ranks are exact
// in every dtype and in any order, so results compare bitwise with a reference.
inline float random_value(uint64_t seed, int r, int64_t i) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(r) * 0xBF58476D1CE4E5B9ull +
               static_cast<uint64_t>(i) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  x *= 0xD6E9F9D1B2A3C5E7ull;
  x ^= x >> 29;
  return static_cast<float>(static_cast<int64_t>(x % 17) - 8);
}

// Runs fn; if it has not returned within `seconds`, reports which test hung and aborts the
// process (a hang is the failure these tests exist to catch; ctest's own timeout is far longer).
inline void with_deadline(int seconds, const char* what, const std::function<void()>& fn) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, std::chrono::seconds(seconds), [&] { return done; })) {
      std::fprintf(stderr, "%s: still running after %d s; the ranks are hung\n", what, seconds);
      std::abort();
    }
  });
  try {
    fn();
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
    }
    cv.notify_all();
    watchdog.join();
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_all();
  watchdog.join();
}

// Collective calls with an explicit algorithm (the public methods use CollectiveAlgo::Auto) and
// chunk size (CollectiveDesc::chunk_bytes; 0: the process's).
inline void all_reduce(Communicator& c, CollectiveAlgo algo, const Tensor& buf, ReduceOp op,
                       const ChunkHook& hook = {}, const PartitionDesc& partition = {},
                       size_t chunk_bytes = 0) {
  CollectiveDesc d{CollectiveKind::AllReduce};
  d.op = op;
  d.send = buf;
  d.hook = hook;
  d.algo = algo;
  d.partition = partition;
  d.chunk_bytes = chunk_bytes;
  c.run(std::move(d));
}

inline void reduce_scatter(Communicator& c, CollectiveAlgo algo, const Tensor& in,
                           const Tensor& out, ReduceOp op, const ChunkHook& hook = {},
                           const PartitionDesc& partition = {}, size_t chunk_bytes = 0) {
  CollectiveDesc d{CollectiveKind::ReduceScatter};
  d.op = op;
  d.send = in;
  d.recv = out;
  d.hook = hook;
  d.algo = algo;
  d.partition = partition;
  d.chunk_bytes = chunk_bytes;
  c.run(std::move(d));
}

inline void all_gather(Communicator& c, CollectiveAlgo algo, const Tensor& in, const Tensor& out,
                       const PartitionDesc& partition = {}, size_t chunk_bytes = 0) {
  CollectiveDesc d{CollectiveKind::AllGather};
  d.send = in;
  d.recv = out;
  d.algo = algo;
  d.partition = partition;
  d.chunk_bytes = chunk_bytes;
  c.run(std::move(d));
}

inline void broadcast(Communicator& c, CollectiveAlgo algo, const Tensor& buf, int root) {
  CollectiveDesc d{CollectiveKind::Broadcast};
  d.send = buf;
  d.root = root;
  d.algo = algo;
  c.run(std::move(d));
}

inline void shift(Communicator& c, CollectiveAlgo algo, const Tensor& in, const Tensor& out) {
  CollectiveDesc d{CollectiveKind::Shift};
  d.send = in;
  d.recv = out;
  d.algo = algo;
  c.run(std::move(d));
}

}  // namespace tandem::comm::testing
