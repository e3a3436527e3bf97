// The MPI backend under real mpirun (-np 2 and 3, 4 as 2 nodes of 2 with
// TANDEM_RANKS_PER_NODE=2 over TCP, and 2 namespaced hosts of 2 ranks in the multihost suite):
// every collective (flat and partitioned) through the ring over MPI_Isend/MPI_Irecv, the Direct
// algorithms over the processes' shared arenas and the hierarchical ones across the nodes, on the
// world communicator and on a wrapped caller's communicator, split, point-to-point (including
// messages split into pieces), and the errors a user reads.
//
// Every rank runs every test in the same order. Nothing here may leave a test early on one rank
// only (no ASSERT_*): the others would wait for it in the next collective.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "comm/collective_checks.h"
#include "tandem/comm/mpi.h"
#include "tandem/core/error.h"

namespace tandem::comm::testing {
namespace {

using ::testing::MatchesRegex;

constexpr int64_t kLarge = (int64_t{1} << 20) + 3;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// Each world rank's node as the hosts say (ranks whose MPI_Get_processor_name, the host name, is
// the same: one node, named by its lowest world rank), or in blocks of TANDEM_RANKS_PER_NODE: what
// rank_nodes() must find, worked out without MPI_Comm_split_type.
std::vector<int> expected_nodes() {
  const int p = world_size();
  std::vector<int> nodes(static_cast<size_t>(p));
  if (const int k = ranks_per_node(); k > 0) {
    for (int r = 0; r < p; ++r) nodes[static_cast<size_t>(r)] = r / k;
    return nodes;
  }
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> all(static_cast<size_t>(p) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME,
                MPI_CHAR, MPI_COMM_WORLD);
  auto host = [&](int r) {
    return std::string(all.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME);
  };
  for (int r = 0; r < p; ++r) {
    int first = 0;
    while (host(first) != host(r)) ++first;
    nodes[static_cast<size_t>(r)] = first;
  }
  return nodes;
}

bool world_spans_nodes() {
  const std::vector<int> nodes = expected_nodes();
  return std::any_of(nodes.begin(), nodes.end(), [&](int x) { return x != nodes[0]; });
}

// Ring messages of chunk_bytes() for the scope (instead of the 4 MiB default), so that small
// inputs take the multi-message paths.
struct ScopedSmallMessages {
  ScopedSmallMessages() { set_mpi_message_bytes(1); }
  ~ScopedSmallMessages() { set_mpi_message_bytes(0); }
};

// The message of the UserError fn throws, or "no error".
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

// Every collective, dtype, op and small size, with and without the hook, in place and not.
std::string small_sizes(Communicator& c) {
  ScopedChunkBytes chunk(64);
  ScopedSmallMessages messages;
  std::string err;
  const CollectiveAlgo algo = CollectiveAlgo::Auto;
  for (DType t : kAllDTypes) {
    for (int64_t n : {0, 1, 7, 1000}) {
      for (ReduceOp op : kAllOps) {
        err += all_reduce_case(c, algo, t, n, op, false);
        err += all_reduce_case(c, algo, t, n, op, true);
        err += reduce_scatter_case(c, algo, t, n, op, false, false);
        err += reduce_scatter_case(c, algo, t, n, op, true, true);
      }
      err += all_gather_case(c, algo, t, n, false);
      err += all_gather_case(c, algo, t, n, true);
      for (int root = 0; root < c.size(); ++root) err += broadcast_case(c, algo, t, n, root);
      err += shift_case(c, algo, t, n);
      err += shift_case(c, CollectiveAlgo::Ring, t, n);
    }
  }
  return err;
}

// 2^20 + 3 elements at the default chunk and message sizes: on the ring 4 MiB messages, the hook
// on 256 KiB pieces of them; with Auto on one node, the Direct algorithms.
std::string large_size(Communicator& c, CollectiveAlgo algo) {
  return all_reduce_case(c, algo, DType::F32, kLarge, ReduceOp::Sum, true) +
         all_reduce_case(c, algo, DType::F32, kLarge, ReduceOp::Max, false) +
         reduce_scatter_case(c, algo, DType::F32, kLarge, ReduceOp::Sum, false, false) +
         all_gather_case(c, algo, DType::F32, kLarge, false) +
         broadcast_case(c, algo, DType::F32, kLarge, c.size() - 1) +
         shift_case(c, algo, DType::F32, kLarge);
}

TEST(MpiWorld, IsMpiCommWorld) {
  auto c = mpi_world();
  EXPECT_EQ(c->rank(), world_rank());
  EXPECT_EQ(c->size(), world_size());
  EXPECT_EQ(c->backend(), Backend::Mpi);
  EXPECT_TRUE(launched_by_mpirun());
}

TEST(MpiCollectives, SmallSizesOnTheWorld) {
  auto c = mpi_world();
  EXPECT_EQ(small_sizes(*c), "") << "rank " << c->rank();
}

TEST(MpiCollectives, LargeSizeOnTheWorld) {
  auto c = mpi_world();
  EXPECT_EQ(large_size(*c, CollectiveAlgo::Ring), "") << "rank " << c->rank();
  EXPECT_EQ(large_size(*c, CollectiveAlgo::Auto), "") << "rank " << c->rank();
}

// Partitioned collectives ([outer, rows, inner]): by Auto (Direct on one node, hierarchical across
// nodes) and by the ring over MPI messages, with buffers in shared memory and on the heap.
TEST(MpiCollectives, PartitionedOnTheWorld) {
  auto c = mpi_world();
  ScopedChunkBytes chunk(64);
  ScopedSmallMessages messages;
  std::string err;
  for (DType t : {DType::F32, DType::BF16}) {
    err += partitioned_cases(*c, CollectiveAlgo::Auto, t);
    err += partitioned_cases(*c, CollectiveAlgo::Ring, t);
  }
  {
    ScopedHostBuffers host;
    err += partitioned_cases(*c, CollectiveAlgo::Auto, DType::F32);
  }
  EXPECT_EQ(err, "") << "rank " << c->rank();
}

// The caller hands tandem its communicator: tandem works on a duplicate and leaves the original,
// and MPI itself, to the caller.
TEST(MpiCollectives, OnACallersCommunicator) {
  MPI_Comm mine;
  MPI_Comm_dup(MPI_COMM_WORLD, &mine);
  {
    auto c = mpi_wrap(mine);
    ScopedChunkBytes chunk(256);
    ScopedSmallMessages messages;
    std::string err;
    for (ReduceOp op : kAllOps)
      err += all_reduce_case(*c, CollectiveAlgo::Auto, DType::BF16, 999, op, true);
    err +=
        reduce_scatter_case(*c, CollectiveAlgo::Ring, DType::F16, 1001, ReduceOp::Sum, true, false);
    err += all_gather_case(*c, CollectiveAlgo::Ring, DType::F32, 1002, true);
    EXPECT_EQ(err, "") << "rank " << c->rank();
    auto w = mpi_wrap(MPI_COMM_WORLD);
    EXPECT_EQ(w->size(), world_size());
  }
  // Still ours, still working, and ours to free.
  int sum = 0, one = 1;
  EXPECT_EQ(MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, mine), MPI_SUCCESS);
  EXPECT_EQ(sum, world_size());
  EXPECT_EQ(MPI_Comm_free(&mine), MPI_SUCCESS);
  int finalized = 1;
  MPI_Finalized(&finalized);
  EXPECT_EQ(finalized, 0);
}

// Random inputs against the reference, every collective at sizes that do not divide by the rank
// count, with the hook: on one node the Direct algorithms, on forced nodes the hierarchical ones
// (each rank's node as its host name or TANDEM_RANKS_PER_NODE says).
TEST(MpiHierarchical, EveryCollectiveAndRandomInputs) {
  auto c = mpi_world();
  EXPECT_EQ(c->rank_nodes(), expected_nodes());
  // At the default chunk and message sizes first, then small ones for the multi-chunk paths.
  std::string err = random_case(*c, DType::F32, kLarge, 5);
  ScopedChunkBytes chunk(64);
  ScopedSmallMessages messages;
  for (DType t : {DType::F32, DType::BF16})
    for (int64_t n : {0, 1, 13, 1001}) {
      err += random_case(*c, t, n, 11 + static_cast<uint64_t>(n));
      err += all_reduce_case(*c, CollectiveAlgo::Auto, t, n, ReduceOp::Max, true);
      err += reduce_scatter_case(*c, CollectiveAlgo::Auto, t, n, ReduceOp::Sum, true, true);
      err += all_gather_case(*c, CollectiveAlgo::Auto, t, n, true);
      err += broadcast_case(*c, CollectiveAlgo::Auto, t, n, c->size() - 1);
    }
  EXPECT_EQ(err, "") << "rank " << c->rank();
}

TEST(MpiSplit, ParityGroupsAndOptingOut) {
  auto world = mpi_world();
  const int r = world->rank(), p = world->size();
  // The last rank opts out; the others split by parity, in reverse order of rank.
  auto sub = world->split(r == p - 1 ? -1 : r % 2, -r);
  if (r == p - 1) {
    EXPECT_EQ(sub, nullptr);
  } else if (sub != nullptr) {
    int expected_size = 0, expected_rank = 0;
    for (int q = 0; q < p - 1; ++q)
      if (q % 2 == r % 2) {
        ++expected_size;
        if (q > r) ++expected_rank;
      }
    EXPECT_EQ(sub->size(), expected_size);
    EXPECT_EQ(sub->rank(), expected_rank);
    ScopedChunkBytes chunk(64);
    EXPECT_EQ(all_reduce_case(*sub, CollectiveAlgo::Auto, DType::F32, 100, ReduceOp::Sum, true),
              "");
    // Messages larger than the hook's pieces: the hook still sees at most 64 bytes at a time.
    EXPECT_EQ(all_reduce_case(*sub, CollectiveAlgo::Auto, DType::BF16, 1000, ReduceOp::Max, true),
              "");
    sub->barrier();
  } else {
    ADD_FAILURE() << "rank " << r << " got no group";
  }
  world->barrier();
}

// Point-to-point round the ring, with messages split into 100-byte pieces.
TEST(MpiPointToPoint, RingWithSplitMessages) {
  auto c = mpi_world();
  const int p = c->size(), r = c->rank();
  set_mpi_max_message_bytes(100);
  Tensor out = Tensor::empty(DType::F32, {1000}), in = Tensor::empty(DType::F32, {1000});
  fill(out, 0, [&](int64_t i) { return static_cast<float>(r * 10000 + i); });
  Request rq = c->irecv(in, (r + p - 1) % p, 7);
  Request sq = c->isend(out, (r + 1) % p, 7);
  rq.wait();
  sq.wait();
  set_mpi_max_message_bytes(0);
  const int left = (r + p - 1) % p;
  EXPECT_EQ(check("ring message", in, 0, [&](int64_t i) { return left * 10000.0 + i; }), "");
}

TEST(MpiErrors, MessageSizeMismatch) {
  auto c = mpi_world();
  const int p = c->size();
  if (c->rank() == 0) {
    c->send(Tensor::zeros(DType::F32, {4}), 1, 3);
    c->send(Tensor::zeros(DType::F32, {2}), 1, 4);
  } else if (c->rank() == 1) {
    EXPECT_EQ(error_of([&] { c->recv(Tensor::zeros(DType::F32, {2}), 0, 3); }),
              fmt::format("recv on rank 1 of {} from rank 0 (tag 3): the message is larger than "
                          "the receive buffer f32[2] (8 bytes); sizes must match exactly",
                          p));
    EXPECT_EQ(error_of([&] { c->recv(Tensor::zeros(DType::F32, {4}), 0, 4); }),
              fmt::format("recv on rank 1 of {} from rank 0 (tag 4): received 8 bytes into f32[4] "
                          "(16 bytes); sizes must match exactly",
                          p));
  }
  c->barrier();
}

// Each rank shares what it is about to call before the ring starts: a mismatch is an error on
// every rank, not a hang.
TEST(MpiErrors, CrossRankMismatches) {
  auto c = mpi_world();
  const int r = c->rank(), p = c->size();
  EXPECT_EQ(
      error_of([&] { c->all_reduce(Tensor::zeros(DType::F32, {r == 0 ? 8 : 7}), ReduceOp::Sum); }),
      fmt::format("all_reduce on rank {} of {}: size mismatch across ranks: rank 0 passed 8 "
                  "elements, rank 1 passed 7; every rank must pass the same size",
                  r, p));
  EXPECT_EQ(error_of([&] {
              Tensor t = Tensor::zeros(DType::F32, {8});
              c->broadcast(t, r == 1 ? 1 : 0);
            }),
            fmt::format("broadcast on rank {} of {}: root mismatch across ranks: rank 0 passed "
                        "root 0, rank 1 passed root 1",
                        r, p));
  // The communicator is still usable afterwards.
  EXPECT_EQ(all_reduce_case(*c, CollectiveAlgo::Auto, DType::F32, 10, ReduceOp::Min, false), "");
}

// The chunk size is part of what the ranks agree on: on one node in the calls they post in shared
// memory, and with each rank a node of its own (no shared memory) in the handshake before the ring.
TEST(MpiErrors, ChunkSizeMismatch) {
  std::unique_ptr<Communicator> one_node = mpi_world();
  std::unique_ptr<Communicator> nodes_of_one = [] {
    ScopedRanksPerNode k(1);
    return mpi_world();
  }();
  for (Communicator* c : {one_node.get(), nodes_of_one.get()}) {
    const int r = c->rank(), p = c->size();
    EXPECT_EQ(
        error_of([&] {
          CollectiveDesc d{CollectiveKind::AllReduce};
          d.send = Tensor::zeros(DType::F32, {8});
          d.chunk_bytes = r == 1 ? 128 : 64;
          c->run(std::move(d));
        }),
        fmt::format("all_reduce on rank {} of {}: chunk size mismatch across ranks: rank 0 passed "
                    "64 bytes, "
                    "rank 1 passed 128 bytes; every rank must run the call at the same chunk size "
                    "(CollectiveDesc::chunk_bytes; 0 takes the process's comm::chunk_bytes())",
                    r, p));
    EXPECT_EQ(all_reduce_case(*c, CollectiveAlgo::Auto, DType::F32, 10, ReduceOp::Min, false), "");
  }
}

TEST(MpiErrors, BadArguments) {
  auto c = mpi_world();
  const int r = c->rank(), p = c->size();
  EXPECT_EQ(error_of([&] { c->isend(Tensor::zeros(DType::F32, {1}), p, 0); }),
            fmt::format("isend on rank {} of {}: peer {} is out of range; the group has ranks 0 to "
                        "{}",
                        r, p, p, p - 1));
  // On one node the direct algorithm runs, but only on buffers the peers can read: here rank 0's
  // comes from the host heap, and every rank says so.
  EXPECT_EQ(error_of([&] {
              all_reduce(*c, CollectiveAlgo::Direct,
                         Tensor::zeros(DType::F32, {4}, r == 0 ? host_allocator() : c->allocator()),
                         ReduceOp::Sum);
            }),
            fmt::format("all_reduce on rank {} of {}: the direct algorithm reads the peers' "
                        "buffers, but some rank's buffer is not in memory they can read; allocate "
                        "collective buffers from the communicator's allocator()",
                        r, p));
  c->barrier();
}

// Ranks on one node share memory: Auto runs the Direct algorithms on buffers from allocator().
// Buffers from elsewhere (on every rank, or on one) take the ring instead, the same on every rank.
// A world on several nodes (hosts, or forced ones) does not share memory.
TEST(MpiSharedMemory, DirectOnOneNodeAndTheRingForHostBuffers) {
  auto c = mpi_world();
  if (world_spans_nodes()) {
    EXPECT_FALSE(c->shares_memory());
    return;
  }
  EXPECT_TRUE(c->shares_memory());
  EXPECT_EQ(c->allocator().name(), "shared");
  ScopedChunkBytes chunk(64);
  std::string err;
  for (DType t : kAllDTypes)
    for (int64_t n : {1, 7, 1000}) {
      err += all_reduce_case(*c, CollectiveAlgo::Direct, t, n, ReduceOp::Sum, true);
      err += reduce_scatter_case(*c, CollectiveAlgo::Direct, t, n, ReduceOp::Max, true, true);
      err += all_gather_case(*c, CollectiveAlgo::Direct, t, n, false);
      err += broadcast_case(*c, CollectiveAlgo::Direct, t, n, c->size() - 1);
      err += shift_case(*c, CollectiveAlgo::Direct, t, n);
    }
  {
    ScopedHostBuffers host;
    err += all_reduce_case(*c, CollectiveAlgo::Auto, DType::F32, 1000, ReduceOp::Sum, true);
    err +=
        reduce_scatter_case(*c, CollectiveAlgo::Auto, DType::BF16, 999, ReduceOp::Sum, true, false);
  }
  // One rank's buffer on the heap, the others' shared.
  Tensor buf =
      Tensor::empty(DType::F32, {1000}, c->rank() == 0 ? host_allocator() : c->allocator());
  fill(buf, 0, [&](int64_t i) { return input_value(ReduceOp::Sum, c->rank(), i); });
  c->all_reduce(buf, ReduceOp::Sum);
  err += check("mixed buffers", buf, 0,
               [&](int64_t i) { return expected_value(ReduceOp::Sum, c->size(), i); });
  EXPECT_EQ(err, "") << "rank " << c->rank();
}

}  // namespace
}  // namespace tandem::comm::testing
