// The thread backend's own machinery: run_ranks, point-to-point rendezvous (either side first,
// ordering, self-sends, polling, abandoned requests), barrier, split into sub-groups, and that
// waiting ranks sleep instead of spinning.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "comm/collective_checks.h"
#include "tandem/comm/thread.h"

namespace tandem::comm::testing {
namespace {

TEST(RunRanks, EveryRankRunsOnceWithItsRank) {
  for (int n = 1; n <= 5; ++n) {
    std::vector<std::atomic<int>> seen(n);
    run_ranks(n, [&](Communicator& c) {
      EXPECT_EQ(c.size(), n);
      EXPECT_EQ(c.backend(), Backend::Thread);
      seen[c.rank()]++;
    });
    for (int r = 0; r < n; ++r) EXPECT_EQ(seen[r].load(), 1);
  }
}

// The receive may be posted before or after the send; either way one copy lands the bytes.
TEST(PointToPoint, EitherSideMayArriveFirst) {
  for (bool recv_first : {true, false}) {
    std::vector<float> got(100);
    run_ranks(2, [&](Communicator& c) {
      Tensor t = Tensor::empty(DType::F32, {100});
      if (c.rank() == 0) {
        for (int i = 0; i < 100; ++i) t.set(i, static_cast<float>(i * 3));
        if (recv_first) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        c.send(t, 1, 5);
      } else {
        if (!recv_first) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        c.recv(t, 0, 5);
        for (int i = 0; i < 100; ++i) got[i] = t.get(i);
      }
    });
    for (int i = 0; i < 100; ++i) EXPECT_EQ(got[i], i * 3.0f) << recv_first;
  }
}

// Messages of one (sender, tag) arrive in order; different tags match independently, even when
// received in the opposite order of sending.
TEST(PointToPoint, OrderedPerTagAndMatchedByTag) {
  std::vector<float> got(6);
  run_ranks(2, [&](Communicator& c) {
    if (c.rank() == 0) {
      std::vector<Tensor> ts;
      std::vector<Request> reqs;
      for (int k = 0; k < 6; ++k) {
        ts.push_back(Tensor::empty(DType::F32, {1}));
        ts.back().set(0, static_cast<float>(k));
        reqs.push_back(c.isend(ts.back(), 1, k < 3 ? 1 : 2));
      }
      for (auto& r : reqs) r.wait();
    } else {
      std::vector<Tensor> ts;
      for (int k = 0; k < 6; ++k) ts.push_back(Tensor::empty(DType::F32, {1}));
      // Tag 2 first, then tag 1.
      for (int k = 0; k < 3; ++k) c.recv(ts[k], 0, 2);
      for (int k = 3; k < 6; ++k) c.recv(ts[k], 0, 1);
      for (int k = 0; k < 6; ++k) got[k] = ts[k].get(0);
    }
  });
  EXPECT_EQ(got, (std::vector<float>{3, 4, 5, 0, 1, 2}));
}

TEST(PointToPoint, SelfSendAndPolling) {
  run_ranks(2, [&](Communicator& c) {
    Tensor a = Tensor::empty(DType::BF16, {3}), b = Tensor::zeros(DType::BF16, {3});
    a.fill(static_cast<float>(c.rank() + 2));
    Request r = c.irecv(b, c.rank(), 0);
    EXPECT_FALSE(r.test());
    Request s = c.isend(a, c.rank(), 0);
    EXPECT_TRUE(r.test());
    EXPECT_TRUE(s.test());
    EXPECT_EQ(b.get(2), c.rank() + 2.0f);
    // An empty message is a message too.
    Tensor none = Tensor::empty(DType::F32, {0}), none_in = Tensor::empty(DType::F32, {0});
    Request out = c.isend(none, 1 - c.rank(), 9);
    c.recv(none_in, 1 - c.rank(), 9);
    out.wait();
  });
}

// A send whose request is dropped (and whose tensor dies) before the receive is posted still
// arrives, with the bytes it had when it was dropped.
TEST(PointToPoint, AbandonedSendStillArrives) {
  float got = 0;
  run_ranks(2, [&](Communicator& c) {
    if (c.rank() == 1) {
      {
        Tensor t = Tensor::empty(DType::F32, {1});
        t.set(0, 7.0f);
        c.isend(t, 0, 4);
      }
      c.barrier();
    } else {
      c.barrier();
      Tensor t = Tensor::empty(DType::F32, {1});
      c.recv(t, 1, 4);
      got = t.get(0);
    }
  });
  EXPECT_EQ(got, 7.0f);
}

// A receive dropped before its match is withdrawn: the next receive gets the next send.
TEST(PointToPoint, AbandonedReceiveIsWithdrawn) {
  float got = 0;
  run_ranks(2, [&](Communicator& c) {
    Tensor t = Tensor::empty(DType::F32, {1});
    if (c.rank() == 0) {
      {
        Tensor dead = Tensor::empty(DType::F32, {1});
        Request abandoned = c.irecv(dead, 1, 0);
      }
      c.barrier();
      c.recv(t, 1, 0);
      got = t.get(0);
    } else {
      c.barrier();
      t.set(0, 42.0f);
      c.send(t, 0, 0);
    }
  });
  EXPECT_EQ(got, 42.0f);
}

// Many messages in flight in a ring, each rank sending before receiving.
TEST(PointToPoint, RingOfNonBlockingMessages) {
  for (int n : {2, 3, 4}) {
    std::vector<std::string> errors(n);
    run_ranks(n, [&](Communicator& c) {
      const int right = (c.rank() + 1) % n, left = (c.rank() + n - 1) % n;
      std::vector<Tensor> out, in;
      std::vector<Request> reqs;
      for (int k = 0; k < 16; ++k) {
        out.push_back(Tensor::empty(DType::F32, {257}));
        fill(out.back(), 0, [&](int64_t i) { return static_cast<float>(c.rank() * 1000 + k + i); });
        in.push_back(Tensor::empty(DType::F32, {257}));
        reqs.push_back(c.isend(out.back(), right, 3));
        reqs.push_back(c.irecv(in.back(), left, 3));
      }
      for (auto& r : reqs) r.wait();
      for (int k = 0; k < 16; ++k)
        errors[c.rank()] += check(fmt::format("message {}", k), in[k], 0,
                                  [&](int64_t i) { return left * 1000.0 + k + i; });
    });
    for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << n << " ranks, rank " << r;
  }
}

TEST(Barrier, NobodyLeavesBeforeEveryoneArrives) {
  std::atomic<int> arrived{0};
  std::atomic<bool> early{false};
  run_ranks(4, [&](Communicator& c) {
    for (int round = 1; round <= 50; ++round) {
      arrived++;
      c.barrier();
      if (arrived.load() < 4 * round) early = true;
      c.barrier();
    }
  });
  EXPECT_FALSE(early.load());
}

// split(color, key): groups by color, ordered by key then old rank; a negative color opts out.
TEST(Split, GroupsByColorOrderedByKey) {
  std::vector<int> new_rank(6, -9), new_size(6, -9);
  std::vector<std::string> errors(6);
  run_ranks(6, [&](Communicator& c) {
    const int r = c.rank();
    const int color = r == 5 ? -1 : r % 2;
    auto sub = c.split(color, /*key=*/-r);  // reversed order within each color
    if (sub == nullptr) return;
    new_rank[r] = sub->rank();
    new_size[r] = sub->size();
    // The sub-group works: an all-reduce of the old ranks, and a barrier.
    Tensor t = Tensor::empty(DType::F32, {5});
    t.fill(static_cast<float>(r));
    sub->all_reduce(t, ReduceOp::Sum);
    const double want = color == 0 ? 0 + 2 + 4 : 1 + 3;
    errors[r] = check("sub-group all_reduce", t, 0, [&](int64_t) { return want; });
    sub->barrier();
  });
  // Color 0: old ranks 0, 2, 4 with keys 0, -2, -4 -> new ranks 2, 1, 0. Color 1: 1, 3 -> 1, 0.
  EXPECT_EQ(new_rank, (std::vector<int>{2, 1, 1, 0, 0, -9}));
  EXPECT_EQ(new_size, (std::vector<int>{3, 2, 3, 2, 3, -9}));
  for (int r = 0; r < 6; ++r) EXPECT_EQ(errors[r], "") << r;
}

// Sub-groups run collectives concurrently with each other and with the parent afterwards, and
// can be split again (a data x tensor grid).
TEST(Split, GridOfConcurrentSubGroups) {
  std::vector<std::string> errors(4);
  run_ranks(4, [&](Communicator& world) {
    ScopedChunkBytes chunk(64);
    auto rows = world.split(world.rank() / 2, world.rank());
    auto cols = world.split(world.rank() % 2, world.rank());
    std::string& err = errors[world.rank()];
    for (CollectiveAlgo algo : {CollectiveAlgo::Direct, CollectiveAlgo::Ring}) {
      err += all_reduce_case(*rows, algo, DType::F32, 1000, ReduceOp::Sum, true);
      err += all_reduce_case(*cols, algo, DType::BF16, 333, ReduceOp::Max, false);
      err += all_gather_case(world, algo, DType::F16, 99, false);
    }
    auto single = rows->split(rows->rank(), 0);
    EXPECT_EQ(single->size(), 1);
    err += all_reduce_case(*single, CollectiveAlgo::Auto, DType::F32, 10, ReduceOp::Prod, true);
  });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(errors[r], "") << r;
}

double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// Three ranks wait 300 ms for a fourth in a barrier and in an all-reduce: they must sleep, not
// spin. Spinning would burn about 3 x 0.6 s of CPU; sleeping costs almost none.
TEST(Waiting, WaitingRanksSleep) {
  const double cpu_before = process_cpu_seconds();
  run_ranks(4, [&](Communicator& c) {
    if (c.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    c.barrier();
    if (c.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    Tensor t = Tensor::zeros(DType::F32, {16});
    c.all_reduce(t, ReduceOp::Sum);
  });
  const double cpu = process_cpu_seconds() - cpu_before;
  EXPECT_LT(cpu, 0.3) << "waiting ranks used " << cpu << " s of CPU in 0.6 s";
}

// Four ranks on (typically) two cores: many small collectives must not crawl. Even under the
// sanitizers and a loaded machine, 2000 barriers and all-reduces take well under 20 s.
TEST(Waiting, ManySmallCollectivesOnFourRanks) {
  const auto start = std::chrono::steady_clock::now();
  run_ranks(4, [&](Communicator& c) {
    Tensor t = Tensor::empty(DType::F32, {8});
    for (int i = 0; i < 1000; ++i) {
      t.fill(1.0f);
      c.all_reduce(t, ReduceOp::Sum);
      c.barrier();
    }
    EXPECT_EQ(t.get(0), 4.0f);
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(s, 20.0);
  std::printf("2000 small collectives on 4 ranks: %.3f s\n", s);
}

}  // namespace
}  // namespace tandem::comm::testing
