// Every collective of the MPI backend against MPI's own on random floating-point inputs: tandem's
// all_reduce (with and without the hook) against MPI_Allreduce, reduce_scatter against
// MPI_Reduce_scatter, all_gather against MPI_Allgatherv and broadcast against MPI_Bcast, f32, at
// sizes that do not divide by the rank count, whatever algorithm Auto picks (Direct on one node,
// hierarchical across nodes, real or forced). Sums may round differently in another order, so they
// are compared within a bound on that; everything else is bitwise.
//
// Every rank runs every case; nothing leaves early on one rank only (no ASSERT_*).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "comm/collective_checks.h"
#include "tandem/comm/mpi.h"

namespace tandem::comm::testing {
namespace {

// Uniform in [-1, 1), different on every rank and for every seed.
std::vector<float> random_floats(uint64_t seed, int rank, int64_t n) {
  std::mt19937_64 gen(seed * 1000003 + static_cast<uint64_t>(rank));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(gen);
  return v;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return MPI_SUM;
    case ReduceOp::Prod:
      return MPI_PROD;
    case ReduceOp::Max:
      return MPI_MAX;
    case ReduceOp::Min:
      return MPI_MIN;
  }
  return MPI_OP_NULL;
}

// `got` (a tandem result) against `want` (MPI's) at elements [offset, offset + got.numel()): a sum
// of p terms of magnitude < 1 rounded in any order is within (p - 1) * p * 2^-24 of the exact sum,
// so two orders differ by at most twice that; max and min are exact. (Products are left out: their
// rounding bound is relative, and the closed-form suites cover Prod.)
std::string compare(const std::string& label, const Tensor& got, const std::vector<float>& want,
                    int64_t offset, double tolerance) {
  const float* g = got.data_as<float>();
  int64_t bad = 0, first = -1;
  double max_diff = 0;
  for (int64_t k = 0; k < got.numel(); ++k) {
    const double d = std::fabs(static_cast<double>(g[k]) - want[static_cast<size_t>(offset + k)]);
    max_diff = std::max(max_diff, d);
    if (d > tolerance || std::isnan(g[k])) {
      if (first < 0) first = offset + k;
      ++bad;
    }
  }
  if (bad == 0) return "";
  return fmt::format(
      "{}: {} elements differ from MPI's (max difference {}, tolerance {}); first at "
      "{}: {} against {}\n",
      label, bad, max_diff, tolerance, first, g[first - offset], want[static_cast<size_t>(first)]);
}

std::string reference_case(Communicator& c, ReduceOp op, int64_t n, uint64_t seed, bool hook) {
  const int p = c.size(), r = c.rank();
  const int64_t off = fx::part_offset(n, p, r), count = fx::part_count(n, p, r);
  const double tolerance = op == ReduceOp::Sum ? 2.0 * (p - 1) * p * std::ldexp(1.0, -24) : 0.0;
  const std::string label = label_of(
      c, CollectiveAlgo::Auto, fmt::format("{} against MPI, seed {}", reduce_op_name(op), seed),
      DType::F32, n, hook ? " with hook" : "");
  const std::vector<float> mine = random_floats(seed, r, n);
  std::vector<int> counts(static_cast<size_t>(p)), offsets(static_cast<size_t>(p));
  for (int q = 0; q < p; ++q) {
    counts[static_cast<size_t>(q)] = static_cast<int>(fx::part_count(n, p, q));
    offsets[static_cast<size_t>(q)] = static_cast<int>(fx::part_offset(n, p, q));
  }

  // all_reduce: MPI_Allreduce's result, halved by the hook where there is one (exact).
  std::vector<float> want(static_cast<size_t>(n));
  MPI_Allreduce(mine.data(), want.data(), static_cast<int>(n), MPI_FLOAT, mpi_op(op),
                MPI_COMM_WORLD);
  Tensor buf = Tensor::empty(DType::F32, {n}, c.allocator());
  std::copy(mine.begin(), mine.end(), buf.data_as<float>());
  c.all_reduce(buf, op,
               hook ? ChunkHook([](const Tensor& chunk, int64_t) {
                 float* x = chunk.data_as<float>();
                 for (int64_t k = 0; k < chunk.numel(); ++k) x[k] *= 0.5f;
               })
                    : ChunkHook{});
  std::vector<float> scaled = want;
  if (hook)
    for (float& x : scaled) x *= 0.5f;
  std::string err = compare(label + " all_reduce", buf, scaled, 0, tolerance);

  // reduce_scatter: this rank's part of MPI_Reduce_scatter's.
  std::vector<float> part(static_cast<size_t>(std::max<int64_t>(count, 1)));
  MPI_Reduce_scatter(mine.data(), part.data(), counts.data(), MPI_FLOAT, mpi_op(op),
                     MPI_COMM_WORLD);
  Tensor in = Tensor::empty(DType::F32, {n}, c.allocator());
  Tensor out = Tensor::empty(DType::F32, {count}, c.allocator());
  std::copy(mine.begin(), mine.end(), in.data_as<float>());
  c.reduce_scatter(in, out, op);
  part.resize(static_cast<size_t>(count));
  std::vector<float> part_at(static_cast<size_t>(n));
  std::copy(part.begin(), part.end(), part_at.begin() + off);
  err += compare(label + " reduce_scatter", out, part_at, off, tolerance);

  // all_gather: every rank's own part of its random input, gathered by MPI_Allgatherv.
  std::vector<float> gathered(static_cast<size_t>(n));
  MPI_Allgatherv(mine.data() + off, static_cast<int>(count), MPI_FLOAT, gathered.data(),
                 counts.data(), offsets.data(), MPI_FLOAT, MPI_COMM_WORLD);
  Tensor piece = Tensor::empty(DType::F32, {count}, c.allocator());
  Tensor whole = Tensor::empty(DType::F32, {n}, c.allocator());
  std::copy(mine.begin() + off, mine.begin() + off + count, piece.data_as<float>());
  c.all_gather(piece, whole);
  err += compare(label + " all_gather", whole, gathered, 0, 0.0);

  // broadcast from the last rank.
  const int root = p - 1;
  std::vector<float> sent = mine;
  MPI_Bcast(sent.data(), static_cast<int>(n), MPI_FLOAT, root, MPI_COMM_WORLD);
  Tensor b = Tensor::empty(DType::F32, {n}, c.allocator());
  std::copy(mine.begin(), mine.end(), b.data_as<float>());
  c.broadcast(b, root);
  err += compare(label + " broadcast", b, sent, 0, 0.0);
  return err;
}

TEST(MpiReference, EveryCollectiveAgainstMpiOnRandomInputs) {
  auto c = mpi_world();
  std::string err;
  // At the default chunk and message sizes: a large buffer in 4 MiB messages, 256 KiB hook chunks.
  err += reference_case(*c, ReduceOp::Sum, (int64_t{1} << 20) + 3, 1, true);
  // Small chunks and messages: the multi-chunk paths on small buffers.
  ScopedChunkBytes chunk(64);
  set_mpi_message_bytes(1);
  uint64_t seed = 2;
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min})
    for (int64_t n : {0, 1, 13, 1001, 4099}) {
      err += reference_case(*c, op, n, seed++, false);
      err += reference_case(*c, op, n, seed++, true);
    }
  set_mpi_message_bytes(0);
  EXPECT_EQ(err, "") << "rank " << c->rank();
}

}  // namespace
}  // namespace tandem::comm::testing
