// Every way a user can misuse the communicator ends in one clear error, never a hang: the exact
// message a user reads for bad arguments, mismatches across ranks, bad peers and roots, and ranks
// that throw or return early.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "comm/testing.h"
#include "tandem/comm/thread.h"
#include "tandem/core/error.h"

namespace tandem::comm::testing {
namespace {

using ::testing::MatchesRegex;

// Runs fn on n ranks under a deadline and returns the message of the E that run_ranks threw, or
// "no error" if it returned normally.
template <typename E = UserError>
std::string failure_of(int n, const std::function<void(Communicator&)>& fn) {
  std::string message = "no error";
  with_deadline(60, "error test", [&] {
    try {
      run_ranks(n, fn);
    } catch (const E& e) {
      message = e.what();
    }
  });
  return message;
}

// ---- Arguments each rank checks on its own -----------------------------------------------------

TEST(LocalErrors, ReduceScatterOutputOfTheWrongSize) {
  // Rank 1 fails alone; rank 0, waiting in the collective, is released by the abort.
  EXPECT_EQ(
      failure_of(2,
                 [](Communicator& c) {
                   Tensor in = Tensor::zeros(DType::F32, {7});
                   Tensor out = Tensor::zeros(DType::F32, {4});
                   c.reduce_scatter(in, out, ReduceOp::Sum);
                 }),
      "reduce_scatter on rank 1 of 2: the output has 4 elements but this rank's part of the "
      "7-element input is 3 elements (elements [4, 7)), or 7 for an output shaped as the whole");
}

TEST(LocalErrors, AllGatherInputOfTheWrongSize) {
  EXPECT_EQ(failure_of(3,
                       [](Communicator& c) {
                         Tensor in = Tensor::zeros(DType::F32, {c.rank() == 2 ? 4 : 3});
                         Tensor out = Tensor::zeros(DType::F32, {8});
                         c.all_gather(in, out);
                       }),
            "all_gather on rank 2 of 3: the input has 4 elements but this rank's part of the "
            "8-element output is 2 elements (elements [6, 8))");
}

// ---- Partitions ---------------------------------------------------------------------------------

// The failure of a `kind` call on 2 ranks, over 30 elements, with `partition`.
std::string failure_with_partition(CollectiveKind kind, const PartitionDesc& partition) {
  return failure_of(2, [&](Communicator& c) {
    CollectiveDesc d{kind};
    d.send = Tensor::zeros(DType::F32, {30});
    d.partition = partition;
    c.run(d);
  });
}

TEST(PartitionErrors, PartitionThatDoesNotCoverTheBuffer) {
  EXPECT_THAT(
      failure_with_partition(CollectiveKind::AllReduce, {3, 5, 3}),
      MatchesRegex(
          "all_reduce on rank [01] of 2: the partition \\[outer 3, rows 5, inner 3\\] does not "
          "cover "
          "the 30-element buffer: outer \\* rows \\* inner must be its element count \\(rows -1, "
          "with outer and inner 1: the flat split\\)"));
}

TEST(PartitionErrors, ReduceScatterOutputOfTheWrongSize) {
  EXPECT_EQ(
      failure_of(
          3,
          [](Communicator& c) {
            Tensor in = Tensor::zeros(DType::F32, {30});
            const int64_t size[] = {12, 6, 6};  // rank 1's part is 2 rows of 3 blocks of 2: 12
            Tensor out = Tensor::zeros(DType::F32, {size[c.rank()]});
            c.reduce_scatter(in, out, ReduceOp::Sum, {}, {3, 5, 2});
          }),
      "reduce_scatter on rank 1 of 3: the output has 6 elements but this rank's part of the "
      "30-element input "
      "is 12 elements (rows [2, 4) of the [3, 5, 2] partition), or 30 for an output shaped as the "
      "whole");
}

TEST(PartitionErrors, AllGatherInputShapedAsTheWholeButNotTheOutput) {
  EXPECT_THAT(
      failure_of(2,
                 [](Communicator& c) {
                   Tensor in = Tensor::zeros(DType::F32, {30});
                   Tensor out = Tensor::zeros(DType::F32, {30});
                   c.all_gather(in, out, {3, 5, 2});
                 }),
      MatchesRegex(
          "all_gather on rank [01] of 2: the input has as many elements as the output \\(30\\), so "
          "it "
          "must be the output itself \\(this rank's part already in place\\), or pass this rank's "
          "part alone \\(1[28] elements, rows \\[[03], [35]\\) of the \\[3, 5, 2\\] partition\\)"));
}

TEST(PartitionErrors, PackedOutputInsideTheInputWhenThePartIsNotContiguous) {
  EXPECT_THAT(
      failure_of(2,
                 [](Communicator& c) {
                   Tensor in = Tensor::zeros(DType::F32, {30});
                   const int64_t off = c.rank() == 0 ? 0 : 6;  // row 3 of block 0 on rank 1
                   c.reduce_scatter(in, in.flat_slice(off, c.rank() == 0 ? 18 : 12), ReduceOp::Sum,
                                    {}, {3, 5, 2});
                 }),
      MatchesRegex(
          "reduce_scatter on rank [01] of 2: the output overlaps the input but is not this rank's "
          "part of it \\(rows \\[[03], [35]\\) of the \\[3, 5, 2\\] partition\\); pass separate "
          "buffers, or the input itself as the output"));
}

TEST(PartitionErrors, BroadcastTakesNoPartition) {
  EXPECT_THAT(
      failure_with_partition(CollectiveKind::Broadcast, {3, 5, 2}),
      MatchesRegex(
          "broadcast on rank [01] of 2: broadcast takes no partition \\(it copies the whole buffer "
          "to every rank\\)"));
}

TEST(PartitionErrors, PartitionsDifferAcrossRanks) {
  EXPECT_THAT(failure_of(2,
                         [](Communicator& c) {
                           Tensor buf = Tensor::zeros(DType::F32, {30});
                           c.all_reduce(buf, ReduceOp::Sum, {},
                                        c.rank() == 0 ? PartitionDesc{3, 5, 2} : PartitionDesc{});
                         }),
              MatchesRegex("all_reduce on rank [01] of 2: partition mismatch across ranks: rank 0 "
                           "passed \\[outer 3, "
                           "rows 5, inner 2\\], rank 1 passed \\[outer 1, rows 30, inner 1\\]"));
}

// ---- Chunk sizes --------------------------------------------------------------------------------

// A `kind` call on 3 ranks by `algo` in which rank 2 asks for another chunk size (CollectiveDesc::
// chunk_bytes) than ranks 0 and 1: its failure.
std::string failure_with_rank_2_chunk(CollectiveKind kind, CollectiveAlgo algo, size_t others,
                                      size_t rank_2) {
  return failure_of(3, [&](Communicator& c) {
    CollectiveDesc d{kind};
    d.send = Tensor::zeros(DType::F32, {30});
    d.recv = kind == CollectiveKind::AllGather ? Tensor::zeros(DType::F32, {90}) : Tensor();
    d.algo = algo;
    d.chunk_bytes = c.rank() == 2 ? rank_2 : others;
    c.run(d);
  });
}

TEST(ChunkSizeErrors, ChunkSizesDifferAcrossRanks) {
  for (CollectiveAlgo algo : {CollectiveAlgo::Direct, CollectiveAlgo::Ring}) {
    EXPECT_THAT(
        failure_with_rank_2_chunk(CollectiveKind::AllReduce, algo, 64, 128),
        MatchesRegex(
            "all_reduce on rank [012] of 3: chunk size mismatch across ranks: rank 0 passed 64 "
            "bytes, rank 2 passed 128 bytes; every rank must run the call at the same chunk size "
            "\\(CollectiveDesc::chunk_bytes; 0 takes the process's comm::chunk_bytes\\(\\)\\)"))
        << collective_algo_name(algo);
    EXPECT_THAT(
        failure_with_rank_2_chunk(CollectiveKind::AllGather, algo, 64, 128),
        MatchesRegex(
            "all_gather on rank [012] of 3: chunk size mismatch across ranks: rank 0 passed 64 "
            "bytes, rank 2 passed 128 bytes.*"))
        << collective_algo_name(algo);
  }
}

// 0 stands for the process's chunk size: the ranks compare what it resolves to.
TEST(ChunkSizeErrors, ZeroIsTheProcessChunkSize) {
  ScopedChunkBytes process(96);
  EXPECT_THAT(
      failure_with_rank_2_chunk(CollectiveKind::Broadcast, CollectiveAlgo::Auto, 64, 0),
      MatchesRegex(
          "broadcast on rank [012] of 3: chunk size mismatch across ranks: rank 0 passed 64 bytes, "
          "rank 2 passed 96 bytes.*"));
  EXPECT_EQ(failure_with_rank_2_chunk(CollectiveKind::AllReduce, CollectiveAlgo::Auto, 96, 0),
            "no error");
}

TEST(LocalErrors, InputAndOutputDTypesDiffer) {
  EXPECT_EQ(failure_of(1,
                       [](Communicator& c) {
                         c.reduce_scatter(Tensor::zeros(DType::F32, {4}),
                                          Tensor::zeros(DType::BF16, {4}), ReduceOp::Max);
                       }),
            "reduce_scatter on rank 0 of 1: the input is f32 but the output is bf16; both must "
            "have the same dtype");
}

TEST(LocalErrors, BroadcastRootOutOfRange) {
  // Both ranks fail the same way; whichever fails first is reported.
  EXPECT_THAT(
      failure_of(2, [](Communicator& c) { c.broadcast(Tensor::zeros(DType::F16, {3}), 2); }),
      MatchesRegex("broadcast on rank [01] of 2: root 2 is out of range; the group has "
                   "ranks 0 to 1"));
}

TEST(LocalErrors, ShiftOutputOfAnotherSize) {
  EXPECT_THAT(failure_of(2,
                         [](Communicator& c) {
                           c.shift(Tensor::zeros(DType::F32, {5}), Tensor::zeros(DType::F32, {4}));
                         }),
              MatchesRegex("shift on rank [01] of 2: the input has 5 elements but the output 4; "
                           "shift keeps the size"));
}

TEST(LocalErrors, ShiftInPlace) {
  EXPECT_THAT(failure_of(2,
                         [](Communicator& c) {
                           Tensor t = Tensor::zeros(DType::F32, {6});
                           c.shift(t.flat_slice(0, 4), t.flat_slice(2, 4));
                         }),
              MatchesRegex("shift on rank [01] of 2: the output overlaps the input; shift sends "
                           "the input while it receives, so pass separate buffers"));
}

TEST(LocalErrors, ShiftTakesNoPartition) {
  EXPECT_THAT(failure_of(2,
                         [](Communicator& c) {
                           CollectiveDesc d{CollectiveKind::Shift};
                           d.send = Tensor::zeros(DType::F32, {6});
                           d.recv = Tensor::zeros(DType::F32, {6});
                           d.partition = {2, 3, 1};
                           c.run(d);
                         }),
              MatchesRegex("shift on rank [01] of 2: shift takes no partition \\(the whole "
                           "buffer goes to the next rank\\)"));
}

TEST(LocalErrors, UndefinedTensor) {
  EXPECT_EQ(failure_of(1, [](Communicator& c) { c.all_reduce(Tensor(), ReduceOp::Sum); }),
            "all_reduce on rank 0 of 1: the buffer tensor is undefined");
}

TEST(LocalErrors, AllReduceIsInPlace) {
  EXPECT_EQ(failure_of(1,
                       [](Communicator& c) {
                         CollectiveDesc d{CollectiveKind::AllReduce};
                         d.send = Tensor::zeros(DType::F32, {4});
                         d.recv = Tensor::zeros(DType::F32, {4});
                         c.run(d);
                       }),
            "all_reduce on rank 0 of 1: all_reduce works in place: pass the buffer as `send` and "
            "leave `recv` empty");
}

TEST(LocalErrors, HookOnACollectiveWithoutOne) {
  EXPECT_EQ(failure_of(1,
                       [](Communicator& c) {
                         CollectiveDesc d{CollectiveKind::AllGather};
                         d.send = Tensor::zeros(DType::F32, {4});
                         d.recv = Tensor::zeros(DType::F32, {4});
                         d.hook = [](const Tensor&, int64_t) {};
                         c.run(d);
                       }),
            "all_gather on rank 0 of 1: all_gather takes no chunk hook (only all_reduce and "
            "reduce_scatter run one)");
}

TEST(LocalErrors, OutputOverlapsInputButIsNotThePart) {
  EXPECT_THAT(failure_of(2,
                         [](Communicator& c) {
                           Tensor in = Tensor::zeros(DType::F32, {8});
                           c.reduce_scatter(in, in.flat_slice(1, 4), ReduceOp::Sum);
                         }),
              MatchesRegex("reduce_scatter on rank [01] of 2: the output overlaps the input but "
                           "is not this rank's part of it \\(elements \\[[04], [48]\\)\\); pass "
                           "separate buffers, or exactly that part to reduce in place"));
}

TEST(LocalErrors, PeerOutOfRange) {
  EXPECT_EQ(failure_of(2,
                       [](Communicator& c) {
                         if (c.rank() == 0) c.isend(Tensor::zeros(DType::F32, {1}), 2, 0);
                       }),
            "isend on rank 0 of 2: peer 2 is out of range; the group has ranks 0 to 1");
  EXPECT_EQ(failure_of(2,
                       [](Communicator& c) {
                         if (c.rank() == 1) c.irecv(Tensor::zeros(DType::F32, {1}), -1, 0);
                       }),
            "irecv on rank 1 of 2: peer -1 is out of range; the group has ranks 0 to 1");
}

TEST(LocalErrors, TagOutOfRange) {
  EXPECT_EQ(failure_of(2,
                       [](Communicator& c) {
                         if (c.rank() == 0) c.isend(Tensor::zeros(DType::F32, {1}), 1, 40000);
                       }),
            "isend on rank 0 of 2: tag 40000 is out of range; tags are 0 to 32766");
}

TEST(LocalErrors, RunRanksNeedsAtLeastOneRank) {
  EXPECT_EQ(failure_of(0, [](Communicator&) {}),
            "run_ranks: the number of ranks must be at least 1, got 0");
}

// ---- Mismatches between ranks ------------------------------------------------------------------

TEST(CrossRankErrors, SizeMismatch) {
  for (CollectiveAlgo algo : {CollectiveAlgo::Direct, CollectiveAlgo::Ring})
    EXPECT_THAT(failure_of(2,
                           [&](Communicator& c) {
                             all_reduce(c, algo, Tensor::zeros(DType::F32, {8 - c.rank()}),
                                        ReduceOp::Sum);
                           }),
                MatchesRegex("all_reduce on rank [01] of 2: size mismatch across ranks: rank 0 "
                             "passed 8 elements, rank 1 passed 7; every rank must pass the same "
                             "size"));
}

TEST(CrossRankErrors, DTypeMismatch) {
  EXPECT_THAT(failure_of(3,
                         [](Communicator& c) {
                           c.all_reduce(
                               Tensor::zeros(c.rank() == 2 ? DType::BF16 : DType::F32, {8}),
                               ReduceOp::Sum);
                         }),
              MatchesRegex("all_reduce on rank [012] of 3: dtype mismatch across ranks: rank 0 "
                           "passed f32, rank 2 passed bf16"));
}

TEST(CrossRankErrors, OpMismatch) {
  EXPECT_THAT(failure_of(2,
                         [](Communicator& c) {
                           c.all_reduce(Tensor::zeros(DType::F32, {8}),
                                        c.rank() == 0 ? ReduceOp::Sum : ReduceOp::Max);
                         }),
              MatchesRegex("all_reduce on rank [01] of 2: reduce op mismatch across ranks: rank 0 "
                           "passed sum, rank 1 passed max"));
}

TEST(CrossRankErrors, RootMismatch) {
  EXPECT_THAT(
      failure_of(2, [](Communicator& c) { c.broadcast(Tensor::zeros(DType::F32, {8}), c.rank()); }),
      MatchesRegex("broadcast on rank [01] of 2: root mismatch across ranks: rank 0 "
                   "passed root 0, rank 1 passed root 1"));
}

TEST(CrossRankErrors, DifferentCollectives) {
  EXPECT_THAT(failure_of(2,
                         [](Communicator& c) {
                           Tensor t = Tensor::zeros(DType::F32, {8});
                           if (c.rank() == 0) {
                             c.all_reduce(t, ReduceOp::Sum);
                           } else {
                             c.barrier();
                           }
                         }),
              MatchesRegex("(all_reduce|barrier) on rank [01] of 2: the ranks made different "
                           "calls: rank 0 called all_reduce but rank 1 called barrier"));
}

TEST(CrossRankErrors, MessageSizeMismatch) {
  EXPECT_THAT(failure_of(2,
                         [](Communicator& c) {
                           if (c.rank() == 0) {
                             c.send(Tensor::zeros(DType::F32, {4}), 1, 3);
                           } else {
                             c.recv(Tensor::zeros(DType::F32, {2}), 0, 3);
                           }
                         }),
              MatchesRegex("(send on rank 0|recv on rank 1) of 2: message size mismatch: rank 0 "
                           "sends f32\\[4\\] \\(16 bytes\\) with tag 3 to rank 1, which receives "
                           "into f32\\[2\\] \\(8 bytes\\); sizes must match exactly"));
}

// ---- Ranks that fail: the others wake up, nobody hangs ------------------------------------------

TEST(Failures, ThrowingRankDoesNotHangTheOthers) {
  EXPECT_EQ(failure_of<std::runtime_error>(4,
                                           [](Communicator& c) {
                                             if (c.rank() == 2) throw std::runtime_error("boom");
                                             Tensor t = Tensor::zeros(DType::F32, {100});
                                             c.all_reduce(t, ReduceOp::Sum);
                                             c.barrier();
                                           }),
            "rank 2 of 4: boom");
}

TEST(Failures, InternalErrorsStayInternal) {
  EXPECT_EQ(failure_of<InternalError>(2,
                                      [](Communicator& c) {
                                        if (c.rank() == 1) throw InternalError("broken invariant");
                                        c.barrier();
                                      }),
            "rank 1 of 2: broken invariant");
}

// A hook that throws in the middle of a collective, while peers read its buffer chunk by chunk:
// everyone wakes, and (checked under AddressSanitizer) nobody reads a buffer after its owner
// has unwound.
TEST(Failures, ThrowingHookAbortsTheGroup) {
  ScopedChunkBytes chunk(4096);
  for (CollectiveAlgo algo : {CollectiveAlgo::Direct, CollectiveAlgo::Ring}) {
    EXPECT_EQ(failure_of(3,
                         [&](Communicator& c) {
                           int calls = 0;
                           Tensor t = Tensor::zeros(DType::F32, {1 << 16});
                           all_reduce(c, algo, t, ReduceOp::Sum, [&](const Tensor&, int64_t) {
                             if (c.rank() == 1 && ++calls == 2) user_error("bad chunk");
                           });
                           c.barrier();
                         }),
              "rank 1 of 3: bad chunk")
        << collective_algo_name(algo);
  }
}

TEST(Failures, ThrowWhilePeerWaitsInReceive) {
  EXPECT_EQ(failure_of<std::runtime_error>(2,
                                           [](Communicator& c) {
                                             if (c.rank() == 0) throw std::runtime_error("boom");
                                             c.recv(Tensor::zeros(DType::F32, {4}), 0, 1);
                                           }),
            "rank 0 of 2: boom");
}

TEST(Failures, RankThatReturnsEarlyIsNamed) {
  EXPECT_EQ(failure_of(2,
                       [](Communicator& c) {
                         if (c.rank() == 1) return;
                         c.all_reduce(Tensor::zeros(DType::F32, {4}), ReduceOp::Sum);
                       }),
            "all_reduce on rank 0 of 2: rank 1 has returned from its function without taking "
            "part; every rank of the group must make the same collective calls in the same order");
  EXPECT_EQ(failure_of(2,
                       [](Communicator& c) {
                         if (c.rank() == 1) return;
                         c.recv(Tensor::zeros(DType::F32, {4}), 1, 5);
                       }),
            "recv on rank 0 of 2: the receive from rank 1 with tag 5 can never complete: rank 1 "
            "has returned from its function");
}

// A rank that catches the abort and carries on gets the abort again, and the report still names
// the rank that failed first.
TEST(Failures, EveryCallAfterAnAbortFails) {
  std::atomic<int> aborted_calls{0};
  EXPECT_EQ(failure_of(2,
                       [&](Communicator& c) {
                         if (c.rank() == 1) user_error("first failure");
                         for (int i = 0; i < 3; ++i) {
                           try {
                             c.barrier();
                           } catch (const UserError& e) {
                             EXPECT_THAT(e.what(), MatchesRegex("barrier on rank 0 of 2: aborted "
                                                                "because rank 1 failed"));
                             aborted_calls++;
                           }
                         }
                       }),
            "rank 1 of 2: first failure");
  EXPECT_EQ(aborted_calls.load(), 3);
}

}  // namespace
}  // namespace tandem::comm::testing
