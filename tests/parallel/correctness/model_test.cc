// ParallelGPT against the whole model run by nn: the loss and every parameter's gradient of one
// step match for tensor-parallel, pipeline-parallel (1F1B micro-batches) and combined grids,
// and the tensor-parallel block's backward (with the DSL program's dropout) matches its forward.
#include "tandem/parallel/model.h"

#include <gtest/gtest.h>

#include <cstring>
#include <mutex>

#include "parallel/parallel_test_util.h"
#include "tandem/comm/thread.h"
#include "tandem/dsl/workloads.h"

namespace tandem::parallel {
namespace {

using testing::close;
using testing::tiny_config;
using testing::tokens;

using testing::StepResult;
using testing::whole_model_step;

StepResult parallel_step(const nn::GPTConfig& c, const GridShape& shape, int micro,
                         const std::vector<int32_t>& in, const std::vector<int32_t>& tg, int B,
                         uint64_t seed, uint64_t step) {
  nn::ParameterSet whole(c);
  nn::gpt_init(whole, 7);
  StepResult r;
  r.grads.assign(static_cast<size_t>(whole.size()), 0.0f);
  std::mutex mu;
  comm::run_ranks(shape.size(), [&](comm::Communicator& world) {
    Grid grid(world, shape);
    const int rows = B / shape.dp / micro, T = c.seq_len;
    ParallelGPT model(c, grid, rows, T, micro);
    model.layout().extract(whole.flat().data_as<float>(), model.params().data_as<float>());
    std::vector<MicroBatch> mbs;
    for (int k = 0; k < micro; ++k) {
      const int64_t row = static_cast<int64_t>(grid.coord().dp) * (B / shape.dp) + k * rows;
      mbs.push_back({in.data() + row * T, tg.data() + row * T, rows, T, row});
    }
    const double loss = model.forward_backward(mbs, seed, step);
    model.reduce_tied_gradients();
    std::lock_guard<std::mutex> lock(mu);
    if (grid.coord().dp == 0)  // dp = 1 in these tests: one replica holds the whole gradient
      model.layout().deposit(model.grads().data_as<float>(), 0, model.layout().size(),
                             r.grads.data());
    if (grid.last_stage() && grid.coord().tp == 0) r.loss = loss / micro;
  });
  return r;
}

void expect_match(const nn::GPTConfig& c, const StepResult& got, const StepResult& want,
                  const std::string& what, double rtol) {
  EXPECT_NEAR(got.loss, want.loss, 1e-5 * std::max(1.0, std::fabs(want.loss))) << what;
  auto part = [](const std::vector<float>& v, const nn::ParamSpec& s) {
    std::vector<float> out(static_cast<size_t>(s.numel()));
    std::memcpy(out.data(), v.data() + s.offset, out.size() * sizeof(float));
    return out;
  };
  for (const nn::ParamSpec& s : nn::gpt_parameter_specs(c))
    EXPECT_TRUE(close(what + " d" + s.name, part(got.grads, s), part(want.grads, s), rtol, 1e-7));
}

struct GridCase {
  GridShape shape;
  int micro;
};

class ModelEquivalence : public ::testing::TestWithParam<GridCase> {};

// Tolerance: the shards sum the same products in other orders (a row-parallel GEMM's partial
// sums, micro-batches' weight gradients), so gradients agree to f32 rounding of sums over a few
// hundred terms: 1e-4 of each tensor's largest gradient; the loss to 1e-5.
TEST_P(ModelEquivalence, LossAndGradientsMatchTheWholeModel) {
  const GridCase gc = GetParam();
  const nn::GPTConfig c = tiny_config(4, 4, 16, 8);
  const int B = 4;
  const std::vector<int32_t> in = tokens(static_cast<size_t>(B) * c.seq_len, 1);
  const std::vector<int32_t> tg = tokens(static_cast<size_t>(B) * c.seq_len, 2);
  const StepResult want = whole_model_step(c, in, tg, B, 5, 3);
  const StepResult got = parallel_step(c, gc.shape, gc.micro, in, tg, B, 5, 3);
  expect_match(c, got, want, gc.shape.str() + " micro " + std::to_string(gc.micro), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Grids, ModelEquivalence,
                         ::testing::Values(GridCase{{1, 1, 1}, 1}, GridCase{{1, 1, 1}, 4},
                                           GridCase{{1, 2, 1}, 1}, GridCase{{1, 4, 1}, 2},
                                           GridCase{{1, 1, 2}, 4}, GridCase{{1, 1, 3}, 2},
                                           GridCase{{1, 2, 2}, 2}),
                         [](const auto& info) {
                           const GridCase& g = info.param;
                           return "tp" + std::to_string(g.shape.tp) + "_pp" +
                                  std::to_string(g.shape.pp) + "_micro" + std::to_string(g.micro);
                         });

// With tp = 1 inside a stage the blocks are nn's own, dropout included: splitting the batch into
// micro-batches draws the same masks (keyed by the global sample index).
TEST(ModelEquivalence, MicroBatchesDrawTheWholeBatchsDropoutMasks) {
  nn::GPTConfig c = tiny_config(2, 2, 16, 8);
  c.dropout = 0.2f;
  const int B = 4;
  const std::vector<int32_t> in = tokens(static_cast<size_t>(B) * c.seq_len, 3);
  const std::vector<int32_t> tg = tokens(static_cast<size_t>(B) * c.seq_len, 4);
  const StepResult want = whole_model_step(c, in, tg, B, 9, 2);
  const StepResult got = parallel_step(c, GridShape{1, 1, 1}, 4, in, tg, B, 9, 2);
  expect_match(c, got, want, "dropout, 4 micro-batches", 1e-4);
}

TEST(ModelEquivalence, EvaluationForwardMatchesTheWholeModelWithoutDropout) {
  nn::GPTConfig c = tiny_config(2, 2, 16, 8);
  c.dropout = 0.3f;  // not applied when evaluating
  const int B = 4;
  const std::vector<int32_t> in = tokens(static_cast<size_t>(B) * c.seq_len, 5);
  const std::vector<int32_t> tg = tokens(static_cast<size_t>(B) * c.seq_len, 6);
  nn::ParameterSet p(c);
  nn::gpt_init(p, 7);
  nn::GPTActivations acts(c, B, c.seq_len);
  nn::Workspace ws(c, B, c.seq_len);
  const float want =
      nn::gpt_forward(p, acts, ws, {in.data(), tg.data(), B, c.seq_len}, {0, 0, 0, false});
  const GridShape shape{1, 2, 2};
  std::mutex mu;
  double got = 0;
  comm::run_ranks(shape.size(), [&](comm::Communicator& world) {
    Grid grid(world, shape);
    ParallelGPT model(c, grid, 2, c.seq_len, 2);
    model.layout().extract(p.flat().data_as<float>(), model.params().data_as<float>());
    std::vector<MicroBatch> mbs = {
        {in.data(), tg.data(), 2, c.seq_len, 0},
        {in.data() + 2 * c.seq_len, tg.data() + 2 * c.seq_len, 2, c.seq_len, 2}};
    const double loss = model.forward(mbs);
    std::lock_guard<std::mutex> lock(mu);
    if (grid.last_stage() && grid.coord().tp == 0) got = loss / 2;
  });
  EXPECT_NEAR(got, want, 1e-5);
}

// A tensor-parallel block's programs on one rank of the grid's tp group, as ParallelGPT runs them:
// the Megatron epilogue of attention's and the MLP's projections (with the config's dropout) and
// the backward's sum of input gradients. Not copyable: the callbacks point into it.
struct TpBlockPrograms {
  TpBlockPrograms(const nn::GPTConfig& c, Grid& grid, int B, int T)
      : megatron(dsl::workloads::megatron_layer(DType::F32, c.dropout),
                 epilogue_schedule_preferences()),
        sum(dsl::workloads::sum_in_place(), {"AR-C"}),
        block{c, grid.shape().tp, grid.coord().tp, [this](float* g, int64_t count) {
                tp_sum->bind("g", Tensor::view_of(g, DType::F32, Shape{count}));
                tp_sum->run();
              }} {
    const int64_t N = static_cast<int64_t>(B) * T, C = c.d_model;
    attn = megatron.prepare(grid.tp(), {{"B", N}, {"K", C}, {"H", C}});
    mlp = megatron.prepare(grid.tp(), {{"B", N}, {"K", 4 * C}, {"H", C}});
    tp_sum = sum.prepare(grid.tp(), {{"N", N * C}}, {"g"});
    epilogue = [this](const EpilogueArgs& e) {
      exec::Runner& s = e.mlp ? *mlp : *attn;
      auto put = [&](const char* name, const void* q) {
        const Tensor t = s.input(name);
        std::memcpy(t.data(), q, t.nbytes());
      };
      put("x", e.x);
      put("w", e.w);
      put("bias", e.bias);
      put("residual", e.residual);
      s.set_scalar("seed", static_cast<double>(e.seed));
      s.run();
      const Tensor out = s.output("out");
      std::memcpy(e.out, out.data(), out.nbytes());
    };
  }
  TpBlockPrograms(const TpBlockPrograms&) = delete;
  TpBlockPrograms& operator=(const TpBlockPrograms&) = delete;

  ProgramRunner megatron, sum;
  std::unique_ptr<exec::Runner> attn, mlp, tp_sum;
  ShardBlock block;
  Epilogue epilogue;
};

// The shard block's backward under the DSL program's residual dropout: the directional
// derivative of L = sum(Out * R) along a random direction of the input, by central differences
// in f32, matches the backward pass's d(x) . v (a wrong mask or scale is off by O(1)).
TEST(TensorParallelBlock, BackwardWithProgramDropoutMatchesItsForward) {
  nn::GPTConfig c = tiny_config(1, 4, 16, 8);
  c.dropout = 0.3f;
  const int B = 2, T = c.seq_len, C = c.d_model, tp = 2;
  const int64_t n = static_cast<int64_t>(B) * T * C;
  nn::ParameterSet whole(c);
  nn::gpt_init(whole, 11);
  std::vector<float> x(static_cast<size_t>(n)), R(x.size()), v(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = 2.0f * random_uniform(21, i) - 1.0f;
    R[i] = 2.0f * random_uniform(22, i) - 1.0f;
    v[i] = 2.0f * random_uniform(23, i) - 1.0f;
  }
  const float h = 1e-2f;
  std::vector<float> xp(x), xm(x);
  for (size_t i = 0; i < x.size(); ++i) {
    xp[i] += h * v[i];
    xm[i] -= h * v[i];
  }
  const nn::StepRng rng{3, 4, 6, true};
  std::mutex mu;
  double directional = 0, fd = 0;
  comm::run_ranks(tp, [&](comm::Communicator& world) {
    Grid grid(world, GridShape{1, tp, 1});
    ShardLayout layout(c, grid.shape(), grid.coord().tp, 0);
    const Tensor pt = Tensor::zeros(DType::F32, Shape{layout.size()});
    const Tensor gt = Tensor::zeros(DType::F32, Shape{layout.size()});
    float* p = pt.data_as<float>();
    float* g = gt.data_as<float>();
    layout.extract(whole.flat().data_as<float>(), p);
    const TpBlockPrograms programs(c, grid, B, T);
    const ShardBlock& sb = programs.block;
    const Epilogue& epilogue = programs.epilogue;
    nn::BlockActivations a = allocate_shard_block_activations(c, tp, B, T);
    nn::Workspace ws(c, B, T);
    auto loss_at = [&](const std::vector<float>& input) {
      shard_block_forward(sb, 0, layout.block(p, 0), a, input.data(), ws, B, T, rng, epilogue,
                          epilogue);
      double L = 0;
      const float* out = a.ptr(nn::BlockAct::Out);
      for (int64_t i = 0; i < n; ++i) L += static_cast<double>(out[i]) * R[static_cast<size_t>(i)];
      return L;
    };
    const double fd_r = (loss_at(xp) - loss_at(xm)) / (2.0 * h);
    loss_at(x);
    std::memcpy(ws.dresidual(), R.data(), static_cast<size_t>(n) * sizeof(float));
    shard_block_backward(sb, 0, layout.block(p, 0), layout.block(g, 0), a, x.data(), ws.dresidual(),
                         ws, B, T, rng);
    double dir = 0;
    for (int64_t i = 0; i < n; ++i)
      dir += static_cast<double>(ws.dresidual()[i]) * v[static_cast<size_t>(i)];
    std::lock_guard<std::mutex> lock(mu);
    if (world.rank() == 0) {
      directional = dir;
      fd = fd_r;
    }
  });
  EXPECT_NEAR(directional, fd, 2e-3 * std::max(1.0, std::fabs(fd)))
      << "backward " << directional << " vs central differences " << fd;
}

// In bf16 the tensor-parallel block saves its matmuls' inputs in bf16 (nn::act_dtype), and the
// epilogue widens the saved projection input: bitwise the block that saves them in f32, forward
// (Out) and backward (d(x), every gradient of the shard), with the DSL program's dropout.
TEST(TensorParallelBlock, Bf16SavedActivationsBitwiseAsSavedInF32) {
  nn::GPTConfig c = tiny_config(1, 4, 16, 8);
  c.dropout = 0.3f;
  c.matmul = DType::BF16;
  // The unfused attention kernel, under which attn.y (the attention epilogue's input) is saved in
  // bf16 too; the fused one keeps it f32 (nn::act_dtype), leaving only mlp.gelu.out's path.
  c.attention = nn::AttentionKernel::Unfused;
  const int B = 2, T = c.seq_len, C = c.d_model, tp = 2;
  const int64_t n = static_cast<int64_t>(B) * T * C;
  nn::ParameterSet whole(c);
  nn::gpt_init(whole, 11);
  std::vector<float> x(static_cast<size_t>(n)), R(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = 2.0f * random_uniform(21, i) - 1.0f;
    R[i] = 2.0f * random_uniform(22, i) - 1.0f;
  }
  const nn::StepRng rng{3, 4, 6, true};
  comm::run_ranks(tp, [&](comm::Communicator& world) {
    Grid grid(world, GridShape{1, tp, 1});
    ShardLayout layout(c, grid.shape(), grid.coord().tp, 0);
    const Tensor pt = Tensor::zeros(DType::F32, Shape{layout.size()});
    float* p = pt.data_as<float>();
    layout.extract(whole.flat().data_as<float>(), p);
    const TpBlockPrograms programs(c, grid, B, T);
    const ShardBlock& sb = programs.block;
    const Epilogue& epilogue = programs.epilogue;
    nn::Workspace ws(c, B, T);
    struct Run {
      std::vector<float> out, dx, grads;
    };
    auto run = [&](nn::BlockActivations a) {
      const Tensor gt = Tensor::zeros(DType::F32, Shape{layout.size()});
      shard_block_forward(sb, 0, layout.block(p, 0), a, x.data(), ws, B, T, rng, epilogue,
                          epilogue);
      std::memcpy(ws.dresidual(), R.data(), static_cast<size_t>(n) * sizeof(float));
      shard_block_backward(sb, 0, layout.block(p, 0), layout.block(gt.data_as<float>(), 0), a,
                           x.data(), ws.dresidual(), ws, B, T, rng);
      const float* out = a.ptr(nn::BlockAct::Out);
      const float* g = gt.data_as<float>();
      return Run{std::vector<float>(out, out + n),
                 std::vector<float>(ws.dresidual(), ws.dresidual() + n),
                 std::vector<float>(g, g + layout.size())};
    };
    nn::BlockActivations saved_bf16 = allocate_shard_block_activations(c, tp, B, T);
    EXPECT_EQ(saved_bf16[nn::BlockAct::AttY].dtype(), DType::BF16);
    nn::BlockActivations saved_f32 = saved_bf16;
    for (Tensor& t : saved_f32.buf) t = Tensor::zeros(DType::F32, t.shape());
    const Run b = run(saved_bf16), f = run(saved_f32);
    EXPECT_EQ(b.out, f.out) << "rank " << world.rank();
    EXPECT_EQ(b.dx, f.dx) << "rank " << world.rank();
    EXPECT_EQ(b.grads, f.grads) << "rank " << world.rank();
  });
}

}  // namespace
}  // namespace tandem::parallel
