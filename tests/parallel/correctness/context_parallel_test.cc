// Context-parallel attention against one rank's attention on the whole sequence, in both orders
// (exchanges overlapped with the products, and before and after them) and the two against each
// other: over 1 to 4 in-process ranks, grouped-query and multi-query heads, head counts that are
// not powers of two, chunks that end inside a kernel block, dropout; its exchange programs run by
// the program runner on the reference interpreter, the plan runner and the compiled executor. And
// the balanced split (which tokens a rank holds) and its refusals.
//
// Tolerances: one rank's kernel and the split one sum in other orders (the query blocks start
// elsewhere, and each key's gradient is summed over the ranks), so they agree to f32 rounding:
// rtol 2e-6 of max|out| for the output, 1e-6 for the log-sum-exp, 1e-5 of each part's max|grad|
// (and 1e-6 absolute) for dq, dk and dv: flash_attention_test's tolerances.
#include "tandem/parallel/context_parallel.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "parallel/parallel_test_util.h"
#include "tandem/comm/thread.h"
#include "tandem/core/error.h"
#include "tandem/core/rng.h"

namespace tandem::parallel {
namespace context_parallel_test {

using testing::close;

TEST(ContextSplit, EachRankHoldsAnEarlyAndALateChunk) {
  EXPECT_EQ(ContextSplit(16, 2, 0).positions(), (std::vector<int>{0, 1, 2, 3, 12, 13, 14, 15}));
  EXPECT_EQ(ContextSplit(16, 2, 1).positions(), (std::vector<int>{4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(ContextSplit(6, 3, 2).positions(), (std::vector<int>{2, 3}));
  EXPECT_EQ(ContextSplit(6, 1, 0).positions(), (std::vector<int>{0, 1, 2, 3, 4, 5}));
  // Every position once over the ranks.
  std::vector<int> seen(24, 0);
  for (int r = 0; r < 4; ++r)
    for (int p : ContextSplit(24, 4, r).positions()) ++seen[static_cast<size_t>(p)];
  EXPECT_EQ(seen, std::vector<int>(24, 1));
}

TEST(ContextSplit, ASequenceThatDoesNotCutIntoTwoChunksARankIsRefused) {
  const auto message = [](int T, int cp) {
    try {
      ContextSplit::check(T, cp);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(10, 2),
            "context parallelism over 2 ranks cuts a sequence into 4 equal chunks (two a rank), "
            "which 10 tokens are not: the sequence length must be a multiple of 4");
  EXPECT_EQ(message(4, 3),
            "context parallelism over 3 ranks cuts a sequence into 6 equal chunks (two a rank), "
            "which 4 tokens are not: the sequence length must be a multiple of 6");
  EXPECT_EQ(message(8, 0), "context parallelism over 0 ranks: the rank count must be at least 1");
  EXPECT_EQ(message(8, 2), "no error");
  EXPECT_THROW(ContextSplit(10, 2, 0), InternalError);
  EXPECT_THROW(ContextSplit(8, 2, 2), InternalError);
}

struct Case {
  int B, T, NH, KVH, HS;
  nn::FlashBlocks blocks;
  float p = 0.0f;  // attention dropout
  std::string str() const {
    return "B " + std::to_string(B) + " T " + std::to_string(T) + " NH " + std::to_string(NH) +
           " KVH " + std::to_string(KVH) + " HS " + std::to_string(HS) + " blocks " +
           std::to_string(blocks.rows) + "x" + std::to_string(blocks.cols) + " dropout " +
           std::to_string(p);
  }
};

std::vector<float> uniform(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(random_bits(seed, i) % 4001) / 1000.0f - 2.0f;
  return v;
}

// The columns [first, first + width) of each of the N rows of a (N, W) buffer.
std::vector<float> columns(const std::vector<float>& v, int N, int W, int first, int width) {
  std::vector<float> r;
  for (int n = 0; n < N; ++n)
    for (int j = first; j < first + width; ++j) r.push_back(v[static_cast<size_t>(n) * W + j]);
  return r;
}

// Attention's results on the whole sequence: out (B, T, NH*HS), lse (B, NH, T), dqkv.
struct Results {
  std::vector<float> out, lse, dqkv;
};

nn::AttentionDropout dropout_of(const Case& s) {
  nn::AttentionDropout drop;
  drop.p = s.p;
  drop.key = 41;
  drop.sample_offset = 2;  // a data-parallel shard's samples draw where the whole batch's would
  return drop;
}

// cp ranks, each its own tokens of qkv and dout, in `order`; their results put back at the
// tokens' positions.
Results split_attention(const Case& s, int cp, exec::RunnerKind executor, ContextOrder order,
                        const std::vector<float>& qkv, const std::vector<float>& dout) {
  const int W = (s.NH + 2 * s.KVH) * s.HS, C = s.NH * s.HS;
  const nn::AttentionDropout drop = dropout_of(s);
  std::vector<float> got_out(dout.size(), NAN), got_lse(static_cast<size_t>(s.B) * s.NH * s.T, NAN),
      got_dqkv(qkv.size(), NAN);
  comm::run_ranks(cp, [&](comm::Communicator& group) {
    const ContextSplit split(s.T, cp, group.rank());
    const int Tl = split.tokens();
    ContextSchedules schedules;
    schedules.order = order;
    ContextParallelAttention attn(group, split, s.B, s.NH, s.KVH, s.HS, schedules, executor,
                                  s.blocks);
    EXPECT_EQ(attn.overlapping(), order != ContextOrder::Sequential && cp > 1);
    std::vector<float> q(static_cast<size_t>(s.B) * Tl * W), dy(static_cast<size_t>(s.B) * Tl * C);
    for (int b = 0; b < s.B; ++b)
      for (int r = 0; r < Tl; ++r) {
        const size_t from = static_cast<size_t>(b) * s.T + split.position(r),
                     to = static_cast<size_t>(b) * Tl + r;
        std::copy_n(qkv.begin() + from * W, W, q.begin() + to * W);
        std::copy_n(dout.begin() + from * C, C, dy.begin() + to * C);
      }
    std::vector<float> o(dy.size()), l(static_cast<size_t>(s.B) * s.NH * Tl), d(q.size(), 0.0f);
    attn.forward(o.data(), l.data(), q.data(), drop);
    attn.backward(d.data(), dy.data(), q.data(), o.data(), l.data(), drop);
    // Each rank writes only its own tokens' rows.
    for (int b = 0; b < s.B; ++b)
      for (int r = 0; r < Tl; ++r) {
        const size_t to = static_cast<size_t>(b) * s.T + split.position(r),
                     from = static_cast<size_t>(b) * Tl + r;
        std::copy_n(o.begin() + from * C, C, got_out.begin() + to * C);
        std::copy_n(d.begin() + from * W, W, got_dqkv.begin() + to * W);
        for (int h = 0; h < s.NH; ++h)
          got_lse[(static_cast<size_t>(b) * s.NH + h) * s.T + split.position(r)] =
              l[(static_cast<size_t>(b) * s.NH + h) * Tl + r];
      }
    // Each exchange ran and was timed (two a forward and backward: gather, gather and reduce).
    if (cp > 1) {
      EXPECT_GT(attn.overlap_times().exchanged_s, 0.0);
    }
  });
  return {got_out, got_lse, got_dqkv};
}

void expect_close(const Case& s, const Results& got, const Results& want, const std::string& what) {
  SCOPED_TRACE(what);
  const int N = s.B * s.T, W = (s.NH + 2 * s.KVH) * s.HS, C = s.NH * s.HS, K = s.KVH * s.HS;
  EXPECT_TRUE(close("out", got.out, want.out, 2e-6));
  EXPECT_TRUE(close("lse", got.lse, want.lse, 1e-6, 1e-6));
  const auto part = [&](const char* name, int first, int width) {
    return close(name, columns(got.dqkv, N, W, first, width),
                 columns(want.dqkv, N, W, first, width), 1e-5, 1e-6);
  };
  EXPECT_TRUE(part("dq", 0, C));
  EXPECT_TRUE(part("dk", C, K));
  EXPECT_TRUE(part("dv", C + K, K));
}

void compare_with_one_rank(const Case& s, int cp, exec::RunnerKind executor) {
  SCOPED_TRACE(s.str() + " on " + std::to_string(cp) + " ranks, executor " +
               std::string(exec::runner_kind_name(executor)));
  const int N = s.B * s.T, W = (s.NH + 2 * s.KVH) * s.HS, C = s.NH * s.HS;
  const nn::AttentionDropout drop = dropout_of(s);
  const std::vector<float> qkv = uniform(static_cast<size_t>(N) * W, 7);
  const std::vector<float> dout = uniform(static_cast<size_t>(N) * C, 8);

  // One rank, the whole sequence.
  Results one{std::vector<float>(static_cast<size_t>(N) * C),
              std::vector<float>(static_cast<size_t>(s.B) * s.NH * s.T),
              std::vector<float>(qkv.size(), 0.0f)};
  std::vector<float> scratch(
      static_cast<size_t>(nn::flash_attention_scratch_floats(s.T, s.HS, s.blocks)));
  nn::flash_attention_forward(one.out.data(), one.lse.data(), scratch.data(), qkv.data(), s.B, s.T,
                              s.NH, s.KVH, s.HS, drop, s.blocks);
  nn::flash_attention_backward(one.dqkv.data(), scratch.data(), dout.data(), qkv.data(),
                               one.out.data(), one.lse.data(), s.B, s.T, s.NH, s.KVH, s.HS, drop,
                               s.blocks);

  const Results sequential = split_attention(s, cp, executor, ContextOrder::Sequential, qkv, dout);
  const Results overlapped = split_attention(s, cp, executor, ContextOrder::Overlapped, qkv, dout);
  const Results ring = split_attention(s, cp, executor, ContextOrder::Ring, qkv, dout);
  expect_close(s, sequential, one, "sequential against one rank");
  expect_close(s, overlapped, one, "overlapped against one rank");
  expect_close(s, ring, one, "ring against one rank");
  expect_close(s, overlapped, sequential, "overlapped against sequential");
  expect_close(s, ring, sequential, "ring against sequential");
}

constexpr exec::RunnerKind kReference = exec::RunnerKind::Reference;

TEST(ContextParallelAttention, EqualsOneRanksAttention) {
  const nn::FlashBlocks tiny{8, 8};
  for (int cp : {1, 2, 3, 4}) {
    for (float p : {0.0f, 0.2f}) {
      compare_with_one_rank({2, 48, 2, 2, 8, tiny, p}, cp, kReference);
      compare_with_one_rank({1, 48, 6, 2, 8, {5, 3}, p}, cp, kReference);    // GQA, odd blocks
      compare_with_one_rank({2, 24, 3, 1, 4, {16, 16}, p}, cp, kReference);  // MQA, 3 heads
    }
  }
  compare_with_one_rank({1, 96, 4, 2, 16, {}, 0.1f}, 2, kReference);  // the default blocks
}

// The exchanges as the trainer runs them: the plan runner and the compiled executor.
TEST(ContextParallelAttention, EqualsOneRanksAttentionOnEveryExecutor) {
  for (exec::RunnerKind executor : {exec::RunnerKind::Plan, exec::RunnerKind::Compiled}) {
    compare_with_one_rank({2, 48, 6, 2, 8, {8, 8}, 0.1f}, 2, executor);
    compare_with_one_rank({1, 24, 3, 3, 4, {8, 8}, 0.0f}, 3, executor);
  }
}

// The schedules come from the preferences, the autotuner's choice first with its chunk size, as
// every program's do; an AllGather or a ReduceScatter alone has nothing to fuse ("fused(C)" is
// passed over).
TEST(ContextParallelAttention, RunsTheSchedulesItIsGiven) {
  comm::run_ranks(2, [&](comm::Communicator& group) {
    ContextSchedules s;
    s.gather = {{"C"}, 4096};
    s.reduce = {{"fused(C)", "C"}, 8192};
    ContextParallelAttention attn(group, ContextSplit(8, 2, group.rank()), 1, 2, 1, 4, s,
                                  kReference);
    EXPECT_EQ(attn.gather_program().schedule_name(), "C");
    EXPECT_EQ(attn.gather_program().chunk_bytes(), 4096u);
    EXPECT_EQ(attn.reduce_program().schedule_name(), "C");
    EXPECT_EQ(attn.reduce_program().chunk_bytes(), 0u);
    EXPECT_GT(attn.allocated_bytes(), 0u);
    ContextSchedules r;
    r.order = ContextOrder::Ring;
    r.ring = {{"fused(C)", "C"}, 2048};
    ContextParallelAttention ring(group, ContextSplit(8, 2, group.rank()), 1, 2, 1, 4, r,
                                  kReference);
    EXPECT_EQ(ring.ring_program().program().name(), "kv_ring");
    EXPECT_EQ(ring.ring_program().schedule_name(), "C");
    EXPECT_EQ(ring.ring_program().chunk_bytes(), 0u);
  });
}

// The memory estimate's count (buffer_bytes) is what the constructor allocates; the exchanges
// bind their inputs and outputs to the attention's buffers, so the compiled executor's runners
// (the one to train with) add a few bytes of their own, and the plan runner two whole-sequence
// intermediates (which the memory estimate counts for it, and for the reference interpreter, whose
// runner does not report what it allocates).
// Overlapped, a partial output and log-sum-exp more: B x Tl x NH x (HS + 1) floats. The ring
// holds five pieces and that partial output instead of three whole-sequence buffers and a piece;
// its shifts work in its buffers on every executor.
TEST(ContextParallelAttention, TheEstimatesBuffersAreWhatItAllocates) {
  for (exec::RunnerKind executor : {exec::RunnerKind::Plan, exec::RunnerKind::Compiled})
    for (ContextOrder order :
         {ContextOrder::Sequential, ContextOrder::Overlapped, ContextOrder::Ring})
      comm::run_ranks(2, [&](comm::Communicator& group) {
        SCOPED_TRACE(std::string(exec::runner_kind_name(executor)) + " " +
                     std::string(context_order_name(order)));
        const ContextSplit split(16, 2, group.rank());
        ContextSchedules schedules;
        schedules.order = order;
        ContextParallelAttention attn(group, split, 2, 4, 2, 8, schedules, executor);
        const std::vector<int> pos = split.positions();
        const int64_t piece = 2 * 8 * 2 * 2 * 8;  // B x Tl x (k, v) x KVH x HS
        const int64_t scratch = nn::flash_attention_scratch_floats({8, 16, pos.data()}, 8);
        const int64_t part = order != ContextOrder::Sequential ? 2 * 8 * 4 * (8 + 1) : 0;
        const int64_t pieces = order == ContextOrder::Ring ? 5 * piece : piece + 3 * 2 * piece;
        const uint64_t want = static_cast<uint64_t>(pieces + part + scratch) * sizeof(float);
        EXPECT_EQ(ContextParallelAttention::buffer_bytes(split, 2, 4, 2, 8, {}, order), want);
        const uint64_t runners =
            executor == exec::RunnerKind::Compiled || order == ContextOrder::Ring
                ? 0
                : 2 * 2 * piece * 4;
        EXPECT_GE(attn.allocated_bytes(), want + runners);
        EXPECT_LE(attn.allocated_bytes(), want + runners + 64);
      });
}

// One rank has nothing to exchange: no partial buffer, no thread, in either order.
TEST(ContextParallelAttention, OneRankNeitherOverlapsNorHoldsAPartialResult) {
  comm::run_ranks(1, [&](comm::Communicator& group) {
    const ContextSplit split(8, 1, 0);
    ContextParallelAttention attn(group, split, 1, 2, 1, 4, {}, kReference);
    EXPECT_EQ(attn.order(), ContextOrder::Overlapped);
    EXPECT_FALSE(attn.overlapping());
    EXPECT_EQ(
        ContextParallelAttention::buffer_bytes(split, 1, 2, 1, 4, {}, ContextOrder::Overlapped),
        ContextParallelAttention::buffer_bytes(split, 1, 2, 1, 4, {}, ContextOrder::Sequential));
    ContextSchedules ring;
    ring.order = ContextOrder::Ring;
    ContextParallelAttention alone(group, split, 1, 2, 1, 4, ring, kReference);
    EXPECT_FALSE(alone.overlapping());
    // Its piece and their gradient: 2 x B x Tl x (k, v) x KVH x HS floats, and the scratch.
    const std::vector<int> pos = split.positions();
    EXPECT_EQ(ContextParallelAttention::buffer_bytes(split, 1, 2, 1, 4, {}, ContextOrder::Ring),
              (2 * 8 * 2 * 4 + nn::flash_attention_scratch_floats({8, 8, pos.data()}, 4)) *
                  sizeof(float));
  });
}

// TANDEM_CP_ORDER chooses the order, else TANDEM_CP_OVERLAP; a value of neither that is not one
// of its choices is refused by name.
TEST(ContextOrder, TheEnvironmentChoosesIt) {
  const auto with = [](const char* v) {
    setenv("TANDEM_CP_OVERLAP", v, 1);
    std::string r;
    try {
      r = context_order_from_env() == ContextOrder::Overlapped ? "overlapped" : "sequential";
    } catch (const UserError& e) {
      r = e.what();
    }
    unsetenv("TANDEM_CP_OVERLAP");
    return r;
  };
  EXPECT_EQ(context_order_from_env(), ContextOrder::Overlapped);
  EXPECT_EQ(with("0"), "sequential");
  EXPECT_EQ(with("1"), "overlapped");
  EXPECT_EQ(with("yes"),
            "TANDEM_CP_OVERLAP=yes: give 1 (context parallelism's exchanges overlap its products, "
            "the default) or 0 (they run before and after them)");
  const auto order = [](const char* v, const char* overlap) {
    setenv("TANDEM_CP_ORDER", v, 1);
    setenv("TANDEM_CP_OVERLAP", overlap, 1);
    std::string r;
    try {
      r = context_order_name(context_order_from_env());
    } catch (const UserError& e) {
      r = e.what();
    }
    unsetenv("TANDEM_CP_ORDER");
    unsetenv("TANDEM_CP_OVERLAP");
    return r;
  };
  EXPECT_EQ(order("ring", "1"), "ring");
  EXPECT_EQ(order("overlap", "0"), "overlapped");  // TANDEM_CP_ORDER wins
  EXPECT_EQ(order("sequential", "1"), "sequential");
  EXPECT_EQ(order("rings", "1"),
            "TANDEM_CP_ORDER=rings: give ring (the keys and values go round the group while each "
            "piece is multiplied), overlap (gathered while the rank's own are multiplied) or "
            "sequential (gathered before, reduced after)");
}

}  // namespace context_parallel_test
}  // namespace tandem::parallel
