// The LM head fused with the loss over chunks of rows (lm_head_loss_forward / _backward): losses,
// dx and dwte against the unchunked computation in double for chunks that do and do not divide
// the rows, one chunk bit for bit the unfused kernels' (f32 and bf16), and the head's memory
// (saved buffers and workspace) bounded by a chunk, not by B x T x V.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "nn/nn_test_util.h"
#include "tandem/core/rng.h"
#include "tandem/nn/gpt.h"
#include "tandem/nn/layers.h"

namespace tandem::nn {
namespace {

using testing::all_close;
using testing::Bf16Scratch;
using testing::to_f32;
using testing::uniform;

struct Inputs {
  int N, C, V;
  std::vector<float> x, wte, dx0, dwte0;
  std::vector<int32_t> targets;
};

Inputs inputs(int N, int C, int V) {
  Inputs in{N,
            C,
            V,
            to_f32(uniform(static_cast<size_t>(N) * C, 61)),
            to_f32(uniform(static_cast<size_t>(V) * C, 62)),
            to_f32(uniform(static_cast<size_t>(N) * C, 63)),
            to_f32(uniform(static_cast<size_t>(V) * C, 64)),
            {}};
  for (int n = 0; n < N; ++n)
    in.targets.push_back(
        static_cast<int32_t>(random_bits(65, static_cast<uint64_t>(n)) % static_cast<uint32_t>(V)));
  return in;
}

struct HeadResult {
  std::vector<double> losses, dx, dwte;
};

// The whole (N, V) logits at once, in double: losses, and dx, dwte accumulated onto dx0, dwte0.
HeadResult reference(const Inputs& in, double dloss) {
  const int N = in.N, C = in.C, V = in.V;
  HeadResult r{std::vector<double>(static_cast<size_t>(N)),
               std::vector<double>(in.dx0.begin(), in.dx0.end()),
               std::vector<double>(in.dwte0.begin(), in.dwte0.end())};
  std::vector<double> logits(static_cast<size_t>(N) * V);
  for (int n = 0; n < N; ++n)
    for (int v = 0; v < V; ++v) {
      double s = 0;
      for (int c = 0; c < C; ++c)
        s += static_cast<double>(in.x[static_cast<size_t>(n * C + c)]) *
             in.wte[static_cast<size_t>(v * C + c)];
      logits[static_cast<size_t>(n) * V + v] = s;
    }
  for (int n = 0; n < N; ++n) {
    double* l = logits.data() + static_cast<size_t>(n) * V;
    double m = l[0], sum = 0;
    for (int v = 0; v < V; ++v) m = std::max(m, l[v]);
    for (int v = 0; v < V; ++v) sum += std::exp(l[v] - m);
    const double lse = m + std::log(sum);
    const int t = in.targets[static_cast<size_t>(n)];
    r.losses[static_cast<size_t>(n)] = lse - l[t];
    for (int v = 0; v < V; ++v) l[v] = (std::exp(l[v] - lse) - (v == t ? 1.0 : 0.0)) * dloss;
  }
  for (int n = 0; n < N; ++n)
    for (int v = 0; v < V; ++v) {
      const double g = logits[static_cast<size_t>(n) * V + v];
      for (int c = 0; c < C; ++c) {
        r.dx[static_cast<size_t>(n * C + c)] += g * in.wte[static_cast<size_t>(v * C + c)];
        r.dwte[static_cast<size_t>(v * C + c)] += g * in.x[static_cast<size_t>(n * C + c)];
      }
    }
  return r;
}

struct Chunked {
  std::vector<float> losses, dx, dwte;
};

Chunked run_chunked(const Inputs& in, float dloss, int chunk, const MatmulPrecision& mm) {
  Chunked r{std::vector<float>(static_cast<size_t>(in.N)), in.dx0, in.dwte0};
  // Poisoned scratch: nothing may be read before it is written.
  std::vector<float> logits(static_cast<size_t>(chunk) * in.V, std::nanf(""));
  lm_head_loss_forward(r.losses.data(), logits.data(), in.x.data(), in.wte.data(),
                       in.targets.data(), in.N, in.C, in.V, chunk, mm);
  std::fill(logits.begin(), logits.end(), std::nanf(""));
  lm_head_loss_backward(r.dx.data(), r.dwte.data(), logits.data(), in.x.data(), in.wte.data(),
                        in.targets.data(), dloss, in.N, in.C, in.V, chunk, mm);
  return r;
}

// The unchunked head of the unfused kernels: the whole logits, probabilities and dlogits.
Chunked run_unfused(const Inputs& in, float dloss, const MatmulPrecision& mm) {
  const size_t nv = static_cast<size_t>(in.N) * in.V;
  Chunked r{std::vector<float>(static_cast<size_t>(in.N)), in.dx0, in.dwte0};
  std::vector<float> probs(nv), dlogits(nv, 0.0f);
  lm_head_forward(probs.data(), in.x.data(), in.wte.data(), in.N, in.C, in.V, mm);
  crossentropy_forward(r.losses.data(), probs.data(), probs.data(), in.targets.data(), in.N, in.V);
  crossentropy_backward(dlogits.data(), probs.data(), in.targets.data(), dloss, in.N, in.V);
  lm_head_backward(r.dx.data(), r.dwte.data(), dlogits.data(), in.x.data(), in.wte.data(), in.N,
                   in.C, in.V, mm);
  return r;
}

// What a kernel added onto the accumulated start value (the tolerances are of the gradient's own
// size, not of the value it was added to).
template <typename F>
std::vector<double> added(const std::vector<F>& v, const std::vector<float>& start) {
  std::vector<double> d(v.size());
  for (size_t i = 0; i < v.size(); ++i) d[i] = static_cast<double>(v[i]) - start[i];
  return d;
}

struct Shape3 {
  int N, C, V, chunk;
};

TEST(LmHeadChunked, MatchesTheUnchunkedHeadInDouble) {
  // Chunks that divide N, that do not (a short last chunk), of one row, and larger than N.
  for (const Shape3 s : {Shape3{12, 8, 37, 4}, Shape3{13, 8, 37, 5}, Shape3{7, 16, 300, 1},
                         Shape3{5, 4, 11, 9}, Shape3{30, 24, 97, 7}}) {
    SCOPED_TRACE(::testing::Message()
                 << "N " << s.N << " C " << s.C << " V " << s.V << " chunk " << s.chunk);
    const Inputs in = inputs(s.N, s.C, s.V);
    const float dloss = 1.0f / static_cast<float>(s.N);
    const HeadResult want = reference(in, dloss);
    const Chunked got = run_chunked(in, dloss, s.chunk, {});
    EXPECT_TRUE(all_close("losses", got.losses, want.losses, 1e-6, 1e-6));
    EXPECT_TRUE(all_close("dx", added(got.dx, in.dx0), added(want.dx, in.dx0), 1e-5, 1e-7));
    EXPECT_TRUE(
        all_close("dwte", added(got.dwte, in.dwte0), added(want.dwte, in.dwte0), 1e-5, 1e-7));
  }
}

// One chunk of every row is the unfused head exactly: the same GEMMs and the same softmax.
TEST(LmHeadChunked, OneChunkIsTheUnfusedHeadBitForBit) {
  const Inputs in = inputs(21, 16, 53);
  const float dloss = 0.25f;
  const Chunked got = run_chunked(in, dloss, in.N, {});
  const Chunked want = run_unfused(in, dloss, {});
  EXPECT_EQ(got.losses, want.losses);
  EXPECT_EQ(got.dx, want.dx);
  EXPECT_EQ(got.dwte, want.dwte);
}

// bf16 matmuls round the same operands per chunk as the unfused head does for the whole batch:
// one chunk is its result bit for bit, and chunks of 4 and 1 rows agree with the double
// reference within bf16's rounding.
TEST(LmHeadChunked, Bf16RoundsAsTheUnfusedHead) {
  const Inputs in = inputs(18, 32, 61);
  const float dloss = 1.0f / 18;
  const int64_t C = in.C, V = in.V, N = in.N;
  {
    Bf16Scratch s(N * (C + V), V * C);
    const Chunked got = run_chunked(in, dloss, in.N, s.bf16s());
    Bf16Scratch u(N * V, std::max(N, V) * C);
    const Chunked want = run_unfused(in, dloss, u.bf16s());
    EXPECT_EQ(got.losses, want.losses);
    EXPECT_EQ(got.dx, want.dx);
    EXPECT_EQ(got.dwte, want.dwte);
  }
  const HeadResult exact = reference(in, dloss);
  for (int chunk : {4, 1}) {
    SCOPED_TRACE(::testing::Message() << "chunk " << chunk);
    Bf16Scratch s(chunk * (C + V), V * C);
    const Chunked got = run_chunked(in, dloss, chunk, s.bf16s());
    // Operands of 8 significant bits over C = 32 (logits) and V or N terms (gradients).
    EXPECT_TRUE(all_close("bf16 losses", got.losses, exact.losses, 2e-2));
    EXPECT_TRUE(all_close("bf16 dx", added(got.dx, in.dx0), added(exact.dx, in.dx0), 2e-2));
    EXPECT_TRUE(
        all_close("bf16 dwte", added(got.dwte, in.dwte0), added(exact.dwte, in.dwte0), 2e-2));
  }
}

TEST(LmHeadChunked, ChunkRowsKeepAChunkWithinItsBytes) {
  EXPECT_EQ(lm_head_chunk_rows(8192, 50257), kLmHeadChunkBytes / (4 * 50257));  // 166
  EXPECT_EQ(lm_head_chunk_rows(100, 256), 100);     // a small head is one chunk
  EXPECT_EQ(lm_head_chunk_rows(8192, 1 << 24), 1);  // at least one row
  EXPECT_EQ(lm_head_chunk_rows(0, 256), 1);
}

// The head's saved buffers hold nothing of V columns, and its chunk of logits in the workspace
// stays within the chunk's bytes whatever the vocabulary and the batch: the unchunked head held
// B x T x V floats twice (probabilities and their gradient).
TEST(LmHeadChunked, HeadMemoryDoesNotGrowWithBatchTimesVocabulary) {
  const auto bytes = [](int V, int B, int T, DType matmul) {
    GPTConfig c;
    c.vocab_size = V;
    c.n_layers = 1;
    c.n_heads = 2;
    c.d_model = 64;
    c.seq_len = c.max_positions = T;
    c.matmul = matmul;
    size_t saved = 0, logits = 0, total_ws = 0;
    for (int i = 0; i < kNumActs<FinalAct>; ++i)
      saved += static_cast<size_t>(act_shape(c, static_cast<FinalAct>(i), B, T).numel()) * 4;
    for (const ActivationSpec& s : Workspace::specs(c, B, T)) {
      total_ws += s.bytes();
      if (s.name == "ws.logits") logits = s.bytes();
    }
    return std::vector<size_t>{saved, logits, total_ws};
  };
  for (DType mm : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(mm));
    const int B = 8, T = 1024;
    const auto small = bytes(50257, B, T, mm), large = bytes(4 * 50257, B, T, mm);
    EXPECT_EQ(small[0], large[0]) << "saved buffers hold nothing of V columns";
    for (const auto& b : {small, large}) {
      EXPECT_GT(b[1], 0u);
      EXPECT_LE(b[1], static_cast<size_t>(kLmHeadChunkBytes));
    }
    // A batch twice as large: the chunk is the same.
    EXPECT_EQ(bytes(50257, 2 * B, T, mm)[1], small[1]);
    // The whole workspace stays far below one (B, T, V) f32 buffer: under a quarter of it at
    // 50 257 words, a sixteenth at four times as many.
    for (const auto& b : {small, large}) EXPECT_LT(b[2], static_cast<size_t>(B) * T * 50257);
  }
}

}  // namespace
}  // namespace tandem::nn
