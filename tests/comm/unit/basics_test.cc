// The small pieces of comm/: names, the partition of remainders, the chunk-size setting, the
// reduction kernels against a scalar reference, and the rounding each algorithm promises.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <vector>

#include "../../../src/comm/reduce.h"
#include "comm/testing.h"
#include "tandem/comm/thread.h"

namespace tandem::comm::testing {
namespace {

TEST(Names, OpsCollectivesAndAlgorithms) {
  EXPECT_EQ(reduce_op_name(ReduceOp::Sum), "sum");
  EXPECT_EQ(reduce_op_name(ReduceOp::Prod), "prod");
  EXPECT_EQ(reduce_op_name(ReduceOp::Max), "max");
  EXPECT_EQ(reduce_op_name(ReduceOp::Min), "min");
  EXPECT_EQ(collective_name(CollectiveKind::AllReduce), "all_reduce");
  EXPECT_EQ(collective_name(CollectiveKind::ReduceScatter), "reduce_scatter");
  EXPECT_EQ(collective_name(CollectiveKind::AllGather), "all_gather");
  EXPECT_EQ(collective_name(CollectiveKind::Broadcast), "broadcast");
  EXPECT_EQ(collective_algo_name(CollectiveAlgo::Auto), "auto");
  EXPECT_EQ(collective_algo_name(CollectiveAlgo::Ring), "ring");
  EXPECT_EQ(collective_algo_name(CollectiveAlgo::Direct), "direct");
}

// Parts tile [0, n) in rank order; the first n % p parts are one element longer.
TEST(Partition, TilesTheBufferWithTheRemainderFirst) {
  for (int64_t n : {0, 1, 2, 7, 10, 1000, 1001}) {
    for (int p = 1; p <= 5; ++p) {
      int64_t next = 0;
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(fx::part_offset(n, p, r), next) << n << " " << p << " " << r;
        const int64_t c = fx::part_count(n, p, r);
        EXPECT_EQ(c, n / p + (r < n % p ? 1 : 0));
        next += c;
      }
      EXPECT_EQ(next, n);
    }
  }
  EXPECT_EQ(fx::part_count(7, 3, 0), 3);
  EXPECT_EQ(fx::part_count(7, 3, 2), 2);
  EXPECT_EQ(fx::part_offset(7, 3, 2), 5);
}

TEST(ChunkBytes, DefaultsTo256KiBAndCanBeSetForTests) {
  if (std::getenv("TANDEM_COMM_CHUNK_BYTES") == nullptr) {
    EXPECT_EQ(chunk_bytes(), 256u << 10);
  }
  const size_t before = chunk_bytes();
  {
    ScopedChunkBytes small(64);
    EXPECT_EQ(chunk_bytes(), 64u);
  }
  EXPECT_EQ(chunk_bytes(), before);
}

// The kernels against a scalar reference: every dtype and op, 1 to 5 inputs, lengths around the
// tile and vector widths, and the output aliasing each input in turn.
TEST(ReduceKernel, MatchesScalarReference) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
  for (DType t : kAllDTypes) {
    for (ReduceOp op : kAllOps) {
      for (int k = 1; k <= 5; ++k) {
        for (int64_t n : {1, 7, 8, 9, 2047, 2048, 2049, 5000}) {
          for (int alias = -1; alias < k; ++alias) {
            std::vector<Tensor> in;
            for (int q = 0; q < k; ++q) {
              Tensor x = Tensor::empty(t, {n});
              for (int64_t i = 0; i < n; ++i) x.set(i, dist(rng));
              in.push_back(x);
            }
            // Reference: combine in f32, left to right, round once.
            Tensor want = Tensor::empty(t, {n});
            for (int64_t i = 0; i < n; ++i) {
              float acc = in[0].get(i);
              for (int q = 1; q < k; ++q) {
                const float v = in[q].get(i);
                switch (op) {
                  case ReduceOp::Sum:
                    acc = acc + v;
                    break;
                  case ReduceOp::Prod:
                    acc = acc * v;
                    break;
                  case ReduceOp::Max:
                    acc = std::max(acc, v);
                    break;
                  case ReduceOp::Min:
                    acc = std::min(acc, v);
                    break;
                }
              }
              want.set(i, acc);
            }
            Tensor out = alias >= 0 ? in[alias] : Tensor::empty(t, {n});
            std::vector<const void*> srcs;
            for (const Tensor& x : in) srcs.push_back(x.data());
            detail::reduce_into(t, op, out.data(), srcs.data(), k, n);
            EXPECT_EQ(std::memcmp(out.data(), want.data(), want.nbytes()), 0)
                << dtype_name(t) << " " << reduce_op_name(op) << " k=" << k << " n=" << n
                << " alias=" << alias;
          }
        }
      }
    }
  }
}

TEST(ReduceKernel, MaxAndMinPropagateNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (DType t : kAllDTypes) {
    Tensor a = Tensor::empty(t, {2}), b = Tensor::empty(t, {2}), out = Tensor::empty(t, {2});
    a.set(0, nan);
    a.set(1, 1.0f);
    b.set(0, 1.0f);
    b.set(1, nan);
    for (ReduceOp op : {ReduceOp::Max, ReduceOp::Min}) {
      detail::reduce2(t, op, out.data(), a.data(), b.data(), 2);
      EXPECT_TRUE(std::isnan(out.get(0))) << dtype_name(t);
      EXPECT_TRUE(std::isnan(out.get(1))) << dtype_name(t);
    }
  }
}

// bf16 keeps 8 significant bits: 1 + 2^-8 is a tie and rounds (to even) down to 1. With rank 1
// holding 1 and ranks 0 and 2 holding 2^-8, the direct algorithm adds all three in f32 and
// rounds once (1 + 2^-7, exact); the ring starts the one-element part at rank 1, adds rank 2 and
// rounds (to 1), then adds rank 0 and rounds (to 1 again): rounding once per step, as documented.
TEST(Rounding, DirectRoundsOnceRingRoundsPerStep) {
  for (CollectiveAlgo algo : {CollectiveAlgo::Direct, CollectiveAlgo::Ring}) {
    std::vector<float> got(3);
    run_ranks(3, [&](Communicator& c) {
      Tensor t = Tensor::empty(DType::BF16, {1});
      t.set(0, c.rank() == 1 ? 1.0f : 0x1p-8f);
      all_reduce(c, algo, t, ReduceOp::Sum);
      got[c.rank()] = t.get(0);
    });
    const float want = algo == CollectiveAlgo::Direct ? 1.0f + 0x1p-7f : 1.0f;
    for (int r = 0; r < 3; ++r) EXPECT_EQ(got[r], want) << collective_algo_name(algo) << " " << r;
  }
}

TEST(Copy, StreamingCopyMatchesMemcpyAtEveryAlignment) {
  std::vector<unsigned char> src(20000), dst(20100);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 31 + 7);
  for (size_t shift : {0, 1, 17, 32, 63}) {
    for (size_t bytes : {0, 100, 4096, 4097, 19000}) {
      std::fill(dst.begin(), dst.end(), 0);
      detail::copy_bytes(dst.data() + shift, src.data() + 3, bytes, true);
      EXPECT_EQ(std::memcmp(dst.data() + shift, src.data() + 3, bytes), 0) << shift << " " << bytes;
      EXPECT_EQ(dst[shift + bytes], 0) << "wrote past the end";
    }
  }
}

}  // namespace
}  // namespace tandem::comm::testing
