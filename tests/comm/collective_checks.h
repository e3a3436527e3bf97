// One checked run of each collective, the same for every backend: each builds its inputs from the
// rank and the element index, runs the collective, and returns "" or a labelled report of what
// differs from the closed-form result. Thread suites call these on every rank of run_ranks; the
// mpi suite calls them on every process.
#pragma once

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "comm/testing.h"

namespace tandem::comm::testing {

// Buffers come from the communicator's allocator (shared memory where it has some, so that the
// Direct algorithms run), unless a ScopedHostBuffers on this thread asks for the host heap.
inline thread_local bool t_host_buffers = false;
struct ScopedHostBuffers {
  ScopedHostBuffers() { t_host_buffers = true; }
  ~ScopedHostBuffers() { t_host_buffers = false; }
};
inline Allocator& buffers_of(const Communicator& c) {
  return t_host_buffers ? host_allocator() : c.allocator();
}

inline std::string label_of(const Communicator& c, CollectiveAlgo algo, std::string_view what,
                            DType t, int64_t n, std::string_view extra = "") {
  return fmt::format("{} {} {} rank {} of {} {}[{}]{}", backend_name(c.backend()),
                     collective_algo_name(algo), what, c.rank(), c.size(), dtype_name(t), n, extra);
}

// The hook's calls must tile this rank's part exactly once, in ascending order, each call no
// longer than a chunk.
inline std::string check_coverage(const std::string& label,
                                  const std::vector<std::pair<int64_t, int64_t>>& calls,
                                  int64_t offset, int64_t count, DType t) {
  const int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>(chunk_bytes() / dtype_size(t)));
  int64_t next = offset;
  for (const auto& [off, len] : calls) {
    if (off != next || len <= 0 || len > chunk)
      return fmt::format("{}: hook saw [{}, {}) where [{}, ...) of at most {} elements was due\n",
                         label, off, off + len, next, chunk);
    next = off + len;
  }
  if (next != offset + count)
    return fmt::format("{}: hook covered [{}, {}) but the part is [{}, {})\n", label, offset, next,
                       offset, offset + count);
  return "";
}

// A hook that checks each chunk it gets is fully reduced, records where it was called, and
// halves the chunk (exact in every dtype), so the result shows the hook ran once per element.
struct HalvingHook {
  ReduceOp op;
  int p;
  std::string label;
  std::string errors{};
  std::vector<std::pair<int64_t, int64_t>> calls{};

  ChunkHook fn() {
    return [this](const Tensor& chunk, int64_t offset) {
      calls.emplace_back(offset, chunk.numel());
      if (errors.size() < 1000)  // the first few bad chunks tell the story
        errors += check(label + " (as the hook saw it)", chunk, offset,
                        [&](int64_t i) { return expected_value(op, p, i); });
      for (int64_t k = 0; k < chunk.numel(); ++k) chunk.set(k, chunk.get(k) * 0.5f);
    };
  }
};

inline std::string all_reduce_case(Communicator& c, CollectiveAlgo algo, DType t, int64_t n,
                                   ReduceOp op, bool with_hook) {
  const int p = c.size(), r = c.rank();
  const std::string label = label_of(c, algo, fmt::format("all_reduce {}", reduce_op_name(op)), t,
                                     n, with_hook ? " with hook" : "");
  Tensor buf = Tensor::empty(t, {n}, buffers_of(c));
  fill(buf, 0, [&](int64_t i) { return input_value(op, r, i); });
  HalvingHook hook{op, p, label};
  all_reduce(c, algo, buf, op, with_hook ? hook.fn() : ChunkHook{});
  const double scale = with_hook ? 0.5 : 1.0;
  std::string err = hook.errors;
  err += check(label, buf, 0, [&](int64_t i) { return scale * expected_value(op, p, i); });
  if (with_hook)
    err += check_coverage(label, hook.calls, fx::part_offset(n, p, r), fx::part_count(n, p, r), t);
  return err;
}

inline std::string reduce_scatter_case(Communicator& c, CollectiveAlgo algo, DType t, int64_t n,
                                       ReduceOp op, bool with_hook, bool in_place) {
  const int p = c.size(), r = c.rank();
  const int64_t off = fx::part_offset(n, p, r), count = fx::part_count(n, p, r);
  const std::string label =
      label_of(c, algo, fmt::format("reduce_scatter {}", reduce_op_name(op)), t, n,
               fmt::format("{}{}", with_hook ? " with hook" : "", in_place ? " in place" : ""));
  Tensor in = Tensor::empty(t, {n}, buffers_of(c));
  fill(in, 0, [&](int64_t i) { return input_value(op, r, i); });
  Tensor out = in_place ? in.flat_slice(off, count) : Tensor::empty(t, {count}, buffers_of(c));
  if (!in_place) out.fill(-99.0f);
  HalvingHook hook{op, p, label};
  reduce_scatter(c, algo, in, out, op, with_hook ? hook.fn() : ChunkHook{});
  const double scale = with_hook ? 0.5 : 1.0;
  std::string err = hook.errors;
  err += check(label, out, off, [&](int64_t i) { return scale * expected_value(op, p, i); });
  // The input is not touched (apart from this rank's part, when that is the output).
  err += check(label + " input afterwards", in.flat_slice(0, off), 0,
               [&](int64_t i) { return input_value(op, r, i); });
  if (!in_place)
    err += check(label + " input afterwards", in.flat_slice(off, count), off,
                 [&](int64_t i) { return input_value(op, r, i); });
  err += check(label + " input afterwards", in.flat_slice(off + count, n - off - count),
               off + count, [&](int64_t i) { return input_value(op, r, i); });
  if (with_hook) err += check_coverage(label, hook.calls, off, count, t);
  return err;
}

// The rank whose part of an n-element buffer holds element i.
inline int owner_of(int64_t n, int p, int64_t i) {
  int q = 0;
  while (i >= fx::part_offset(n, p, q) + fx::part_count(n, p, q)) ++q;
  return q;
}

inline std::string all_gather_case(Communicator& c, CollectiveAlgo algo, DType t, int64_t n,
                                   bool in_place) {
  const int p = c.size(), r = c.rank();
  const int64_t off = fx::part_offset(n, p, r), count = fx::part_count(n, p, r);
  const std::string label = label_of(c, algo, "all_gather", t, n, in_place ? " in place" : "");
  Tensor out = Tensor::empty(t, {n}, buffers_of(c));
  out.fill(-99.0f);
  Tensor in = in_place ? out.flat_slice(off, count) : Tensor::empty(t, {count}, buffers_of(c));
  fill(in, off, [&](int64_t i) { return gather_value(r, i); });
  all_gather(c, algo, in, out);
  return check(label, out, 0, [&](int64_t i) { return gather_value(owner_of(n, p, i), i); });
}

// all_reduce (with the halving hook) and reduce_scatter of random integers against the reference:
// the sum over every rank's input, regenerated here.
inline std::string random_case(Communicator& c, DType t, int64_t n, uint64_t seed) {
  const int p = c.size(), r = c.rank();
  const int64_t off = fx::part_offset(n, p, r), count = fx::part_count(n, p, r);
  const std::string label =
      label_of(c, CollectiveAlgo::Auto, fmt::format("random seed {}", seed), t, n);
  auto want = [&](int64_t i) {
    double s = 0;
    for (int q = 0; q < p; ++q) s += random_value(seed, q, i);
    return s;
  };
  Tensor buf = Tensor::empty(t, {n}, buffers_of(c));
  fill(buf, 0, [&](int64_t i) { return random_value(seed, r, i); });
  std::vector<std::pair<int64_t, int64_t>> calls;
  c.all_reduce(buf, ReduceOp::Sum, [&](const Tensor& chunk, int64_t offset) {
    calls.emplace_back(offset, chunk.numel());
    for (int64_t k = 0; k < chunk.numel(); ++k) chunk.set(k, chunk.get(k) * 0.5f);
  });
  std::string err = check(label + " all_reduce", buf, 0, [&](int64_t i) { return 0.5 * want(i); });
  err += check_coverage(label + " all_reduce", calls, off, count, t);
  Tensor in = Tensor::empty(t, {n}, buffers_of(c)), out = Tensor::empty(t, {count}, buffers_of(c));
  fill(in, 0, [&](int64_t i) { return random_value(seed + 1, r, i); });
  c.reduce_scatter(in, out, ReduceOp::Sum);
  err += check(label + " reduce_scatter", out, off, [&](int64_t i) {
    double s = 0;
    for (int q = 0; q < p; ++q) s += random_value(seed + 1, q, i);
    return s;
  });
  return err;
}

inline std::string broadcast_case(Communicator& c, CollectiveAlgo algo, DType t, int64_t n,
                                  int root) {
  const std::string label = label_of(c, algo, fmt::format("broadcast from {}", root), t, n);
  Tensor buf = Tensor::empty(t, {n}, buffers_of(c));
  if (c.rank() == root) {
    fill(buf, 0, [&](int64_t i) { return gather_value(root, i); });
  } else {
    buf.fill(-99.0f);
  }
  broadcast(c, algo, buf, root);
  return check(label, buf, 0, [&](int64_t i) { return gather_value(root, i); });
}

// Rank r's input is gather_value(r, i); its output must be the previous rank's, and its input
// must be left as it was.
inline std::string shift_case(Communicator& c, CollectiveAlgo algo, DType t, int64_t n) {
  const int p = c.size(), r = c.rank(), left = (r + p - 1) % p;
  const std::string label = label_of(c, algo, "shift", t, n);
  Tensor in = Tensor::empty(t, {n}, buffers_of(c));
  fill(in, 0, [&](int64_t i) { return gather_value(r, i); });
  Tensor out = Tensor::empty(t, {n}, buffers_of(c));
  out.fill(-99.0f);
  shift(c, algo, in, out);
  return check(label, out, 0, [&](int64_t i) { return gather_value(left, i); }) +
         check(label + " input afterwards", in, 0, [&](int64_t i) { return gather_value(r, i); });
}

// ---- Partitioned collectives ------------------------------------------------------------------

// The [outer, rows, inner] shapes the partitioned cases run: one outer block and several, rows
// that do not divide by the rank count, rows fewer than the ranks (some ranks own none), a single
// row, runs longer than a 64-byte chunk, and nothing at all.
inline std::vector<PartitionDesc> partition_shapes() {
  return {{1, 7, 1},  {1, 7, 3}, {3, 5, 2}, {4, 2, 3}, {5, 1, 4},
          {3, 40, 7}, {2, 0, 3}, {0, 3, 2}, {6, 11, 1}};
}

inline std::string partition_str(const PartitionDesc& d) {
  return fmt::format(" partition [{}, {}, {}]", d.outer, d.rows, d.inner);
}

// The rank owning element i of the whole buffer, and rank r's part as runs (whole index,
// length), computed naively element by element.
inline int part_owner(const PartitionDesc& d, int p, int64_t i) {
  return owner_of(d.rows, p, (i / d.inner) % d.rows);
}
inline std::vector<std::pair<int64_t, int64_t>> part_runs(const PartitionDesc& d, int p, int r) {
  std::vector<std::pair<int64_t, int64_t>> runs;
  const int64_t n = d.outer * d.rows * d.inner;
  for (int64_t i = 0; i < n; ++i) {
    if (part_owner(d, p, i) != r) continue;
    const bool same_block = !runs.empty() && (i - 1) / (d.rows * d.inner) == i / (d.rows * d.inner);
    if (!runs.empty() && runs.back().first + runs.back().second == i && same_block)
      ++runs.back().second;
    else
      runs.emplace_back(i, 1);
  }
  return runs;
}
// Rank r's part, packed: the whole index of each of its elements in order.
inline std::vector<int64_t> part_elements(const PartitionDesc& d, int p, int r) {
  std::vector<int64_t> out;
  for (const auto& [at, len] : part_runs(d, p, r))
    for (int64_t k = 0; k < len; ++k) out.push_back(at + k);
  return out;
}

// The hook's calls must tile this rank's part exactly once, in ascending order, each call no
// longer than a chunk and inside one run of the part.
inline std::string check_part_coverage(const std::string& label,
                                       const std::vector<std::pair<int64_t, int64_t>>& calls,
                                       const PartitionDesc& d, int p, int r, DType t) {
  const int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>(chunk_bytes() / dtype_size(t)));
  const auto runs = part_runs(d, p, r);
  size_t run = 0;
  int64_t next = runs.empty() ? 0 : runs[0].first;
  for (const auto& [off, len] : calls) {
    if (run == runs.size() || off != next || len <= 0 || len > chunk ||
        off + len > runs[run].first + runs[run].second)
      return fmt::format(
          "{}: hook saw [{}, {}) where [{}, ...) of at most {} elements, inside run {} of the "
          "part, "
          "was due\n",
          label, off, off + len, next, chunk, run);
    next = off + len;
    if (next == runs[run].first + runs[run].second && ++run < runs.size()) next = runs[run].first;
  }
  if (run != runs.size())
    return fmt::format("{}: hook stopped at {}, in run {} of the part's {}\n", label, next, run,
                       runs.size());
  return "";
}

// Where a partitioned reduce_scatter's output goes: a packed buffer of the part, a buffer shaped
// as the whole, or the input itself.
enum class PartOut : uint8_t { Packed, Whole, InPlace };

inline std::string partitioned_reduce_scatter_case(Communicator& c, CollectiveAlgo algo, DType t,
                                                   const PartitionDesc& d, ReduceOp op,
                                                   bool with_hook, PartOut form) {
  const int p = c.size(), r = c.rank();
  const int64_t n = d.outer * d.rows * d.inner;
  const std::vector<int64_t> mine = part_elements(d, p, r);
  const std::string label =
      label_of(c, algo, fmt::format("reduce_scatter {}", reduce_op_name(op)), t, n,
               partition_str(d) + (with_hook ? " with hook" : "") +
                   (form == PartOut::Packed  ? " packed"
                    : form == PartOut::Whole ? " into a whole"
                                             : " in place"));
  Tensor in = Tensor::empty(t, {n}, buffers_of(c));
  fill(in, 0, [&](int64_t i) { return input_value(op, r, i); });
  Tensor out =
      form == PartOut::InPlace
          ? in
          : Tensor::empty(t, {form == PartOut::Whole ? n : static_cast<int64_t>(mine.size())},
                          buffers_of(c));
  if (form != PartOut::InPlace) out.fill(-99.0f);
  HalvingHook hook{op, p, label};
  reduce_scatter(c, algo, in, out, op, with_hook ? hook.fn() : ChunkHook{}, d);
  const double scale = with_hook ? 0.5 : 1.0;
  std::string err = hook.errors;
  // The part where it belongs; everything else as it was (the input, the rest of a whole output).
  Tensor want =
      Tensor::empty(DType::F32, {form == PartOut::Packed ? static_cast<int64_t>(mine.size()) : n});
  for (int64_t i = 0; i < want.numel(); ++i)
    want.set(i, form == PartOut::InPlace ? input_value(op, r, i) : -99.0f);
  for (size_t k = 0; k < mine.size(); ++k)
    want.set(form == PartOut::Packed ? static_cast<int64_t>(k) : mine[k],
             static_cast<float>(scale * expected_value(op, p, mine[k])));
  err += check(label, out, 0, [&](int64_t i) { return want.get(i); });
  if (form != PartOut::InPlace)
    err +=
        check(label + " input afterwards", in, 0, [&](int64_t i) { return input_value(op, r, i); });
  if (with_hook) err += check_part_coverage(label, hook.calls, d, p, r, t);
  return err;
}

inline std::string partitioned_all_reduce_case(Communicator& c, CollectiveAlgo algo, DType t,
                                               const PartitionDesc& d, ReduceOp op) {
  const int p = c.size(), r = c.rank();
  const int64_t n = d.outer * d.rows * d.inner;
  const std::string label = label_of(c, algo, fmt::format("all_reduce {}", reduce_op_name(op)), t,
                                     n, partition_str(d) + " with hook");
  Tensor buf = Tensor::empty(t, {n}, buffers_of(c));
  fill(buf, 0, [&](int64_t i) { return input_value(op, r, i); });
  HalvingHook hook{op, p, label};
  all_reduce(c, algo, buf, op, hook.fn(), d);
  // Every rank halved its own part: every element is halved exactly once, wherever it lies.
  std::string err = hook.errors;
  err += check(label, buf, 0, [&](int64_t i) { return 0.5 * expected_value(op, p, i); });
  err += check_part_coverage(label, hook.calls, d, p, r, t);
  return err;
}

inline std::string partitioned_all_gather_case(Communicator& c, CollectiveAlgo algo, DType t,
                                               const PartitionDesc& d, bool in_place) {
  const int p = c.size(), r = c.rank();
  const int64_t n = d.outer * d.rows * d.inner;
  const std::vector<int64_t> mine = part_elements(d, p, r);
  const std::string label =
      label_of(c, algo, "all_gather", t, n, partition_str(d) + (in_place ? " in place" : ""));
  Tensor out = Tensor::empty(t, {n}, buffers_of(c));
  out.fill(-99.0f);
  Tensor in = in_place ? out : Tensor::empty(t, {static_cast<int64_t>(mine.size())}, buffers_of(c));
  for (size_t k = 0; k < mine.size(); ++k)
    in.set(in_place ? mine[k] : static_cast<int64_t>(k), gather_value(r, mine[k]));
  all_gather(c, algo, in, out, d);
  return check(label, out, 0, [&](int64_t i) { return gather_value(part_owner(d, p, i), i); });
}

// Every partitioned case of one algorithm and dtype on this rank: each shape, each kind, the
// output forms, with and without the hook.
inline std::string partitioned_cases(Communicator& c, CollectiveAlgo algo, DType t) {
  std::string err;
  for (const PartitionDesc& d : partition_shapes()) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
      err += partitioned_all_reduce_case(c, algo, t, d, op);
      for (PartOut form : {PartOut::Packed, PartOut::Whole, PartOut::InPlace})
        err += partitioned_reduce_scatter_case(c, algo, t, d, op, op == ReduceOp::Sum, form);
    }
    err += partitioned_reduce_scatter_case(c, algo, t, d, ReduceOp::Prod, false, PartOut::Packed);
    err += partitioned_all_gather_case(c, algo, t, d, false);
    err += partitioned_all_gather_case(c, algo, t, d, true);
  }
  return err;
}

}  // namespace tandem::comm::testing
