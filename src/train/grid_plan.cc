// The plan across grids: the configurations of N ranks that fit a memory per rank, each step
// predicted by the performance model in grid_plan.h from measured rates, the fastest first; and
// the settings it decides resolved (--grid auto, --gather-ahead auto).
#include "tandem/train/grid_plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>
#include <tuple>
#include <vector>

#include "schedule_choice.h"
#include "settings.h"
#include "tandem/comm/agree.h"
#include "tandem/comm/communicator.h"
#include "tandem/comm/mpi.h"
#include "tandem/comm/thread.h"
#include "tandem/core/blas.h"
#include "tandem/core/bytes.h"
#include "tandem/core/clock.h"
#include "tandem/core/error.h"
#include "tandem/core/gemm.h"
#include "tandem/core/tensor.h"
#include "tandem/nn/gpt.h"
#include "tandem/ooc/memory_schedule.h"
#include "tandem/ooc/plan.h"
#include "tandem/ooc/planner.h"
#include "tandem/parallel/block_store.h"
#include "tandem/parallel/model.h"
#include "tandem/parallel/shard.h"
#include "tandem/train/memory_estimate.h"

namespace tandem::train {
namespace {

constexpr int kGemmRows = 1024;            // rows of the measured GEMM, at most
constexpr double kGemmSeconds = 0.2;       // timed per shape, about
constexpr uint64_t kLinkBytes = 16 << 20;  // the measured all-reduce
constexpr int kLinkRanks = 8;              // threads it runs on, at most
constexpr int kUnitTokens = 512;           // tokens of the block run for the UnitFactors, at most
constexpr uint64_t kTierProbeBytes = 32 << 20;
constexpr double kStatedLinkLatencyS = 50e-6;  // with --link-gbps: a TCP round trip, about
// The out-of-core searches per stage: enough for the benchmark models, short across many grids.
constexpr int64_t kPlanEvaluations = 20'000;

// Matmul FLOPs a token of one block's forward, from the one block description (GPT-2's or
// Llama's): attention's projections (q, k and v, then out) and its scores and weighted sum over
// sequences of T; the MLP's up projection(s) (GPT-2's fc; Llama's gate and up) and down.
double attention_flops_per_token(const nn::GPTConfig& m, double T) {
  const double C = m.d_model;
  return 2 * C * (static_cast<double>(m.qkv_width()) + C) + 4 * T * C;
}
double mlp_flops_per_token(const nn::GPTConfig& m) {
  return 2.0 * m.d_model * static_cast<double>(m.fc_width() + m.mlp_width());
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// FLOP/s of one (rows x k) by (k x n) GEMM of `type`: the fastest of repeats filling about
// kGemmSeconds (a busy machine only slows a repeat down, so the fastest is the least disturbed).
double gemm_rate(DType type, int rows, int n, int k) {
  const size_t elem = dtype_size(type);
  std::vector<char> a(static_cast<size_t>(rows) * k * elem), b(static_cast<size_t>(k) * n * elem);
  std::vector<float> c(static_cast<size_t>(rows) * n);
  GemmCall call;
  call.type = type;
  call.m = rows, call.n = n, call.k = k;
  call.a = a.data(), call.lda = k;
  call.b = b.data(), call.ldb = n;
  call.c = c.data(), call.ldc = n;
  gemm(call);  // warm-up: threads started, primitives created
  std::vector<double> times;
  const auto begin = Clock::now();
  while (times.size() < 3 || (seconds_since(begin) < kGemmSeconds && times.size() < 50)) {
    const auto t = Clock::now();
    gemm(call);
    times.push_back(seconds_since(t));
  }
  return 2.0 * rows * n * k / std::max(*std::min_element(times.begin(), times.end()), 1e-9);
}

// Seconds of `run`: the fastest of repeats filling about kGemmSeconds, after a warm-up.
template <typename F>
double fastest_s(F&& run) {
  run();
  double best = 1e30;
  const auto begin = Clock::now();
  for (int i = 0; i < 2 || (i < 20 && seconds_since(begin) < kGemmSeconds); ++i) {
    const auto t = Clock::now();
    run();
    best = std::min(best, seconds_since(t));
  }
  return best;
}

// Runs one block's halves and the head (ln_f, the tied LM head, the loss) forward and backward
// on one rank, at up to kUnitTokens tokens of the model's sequences, and divides each time by
// what its matmuls take at `rate` (the matmul model of model_stage below, at tp 1).
void measure_unit_factors(const nn::GPTConfig& model, int64_t rows, double rate, Rates& r) {
  nn::GPTConfig c = model;
  c.n_layers = 1;
  const int T = std::min(c.seq_len, kUnitTokens);
  const int B = static_cast<int>(std::clamp<int64_t>(rows, 1, std::max(1, kUnitTokens / T)));
  const nn::ParameterSet w(c), dw(c);
  nn::gpt_init(w, 1);
  const nn::BlockActivations a = nn::allocate_block_activations(c, B, T);
  const nn::FinalActivations fa = nn::allocate_final_activations(c, B, T);
  nn::Workspace ws(c, B, T);
  const int64_t btc = static_cast<int64_t>(B) * T * c.d_model;
  std::vector<float> x(static_cast<size_t>(btc), 0.5f), dres(static_cast<size_t>(btc), 1e-3f),
      dx(static_cast<size_t>(btc));
  std::vector<int32_t> targets(static_cast<size_t>(B) * T, 1);
  const nn::StepRng rng;
  const nn::BlockParams bw = w.block(0), bdw = dw.block(0);
  const double tokens = static_cast<double>(B) * T, C = c.d_model, V = c.vocab_size;
  const double attn_s = tokens * attention_flops_per_token(c, T) / rate;
  const double mlp_s = tokens * mlp_flops_per_token(c) / rate;
  const double head_s = 2 * tokens * C * V / rate;
  const auto ratio = [](double measured, double modelled) { return measured / modelled; };
  r.attention.forward =
      ratio(fastest_s([&] { nn::block_attention_forward(c, 0, bw, a, x.data(), ws, B, T, rng); }),
            attn_s);
  r.mlp.forward =
      ratio(fastest_s([&] { nn::block_mlp_forward(c, 0, bw, a, ws, B, T, rng); }), mlp_s);
  r.mlp.backward = ratio(
      fastest_s([&] { nn::block_mlp_backward(c, 0, bw, bdw, a, dres.data(), ws, B, T, rng); }),
      2 * mlp_s);
  r.attention.backward =
      ratio(fastest_s([&] {
              nn::block_attention_backward(c, 0, bw, bdw, a, x.data(), dres.data(), ws, B, T, rng);
            }),
            2 * attn_s);
  r.head.forward =
      ratio(fastest_s([&] {
              nn::final_forward(c, w.final_stage(), fa, x.data(), targets.data(), ws, B, T);
            }),
            head_s);
  r.head.backward = ratio(fastest_s([&] {
                            nn::final_backward(c, w.final_stage(), dw.final_stage(), fa, x.data(),
                                               targets.data(), 1.0f, dx.data(), ws, B, T);
                          }),
                          2 * head_s);
}

// An in-process all-reduce's bus bandwidth and a small one's latency over `p` threads.
void measure_link(int p, Rates& r) {
  std::vector<double> big, small;
  comm::run_ranks(p, [&](comm::Communicator& c) {
    Tensor b = Tensor::zeros(DType::F32, Shape{static_cast<int64_t>(kLinkBytes / 4)});
    Tensor s = Tensor::zeros(DType::F32, Shape{256});
    c.all_reduce(b, ReduceOp::Sum);  // warm-up
    for (int i = 0; i < 3; ++i) {
      c.barrier();
      const auto t = Clock::now();
      c.all_reduce(b, ReduceOp::Sum);
      if (c.rank() == 0) big.push_back(seconds_since(t));
    }
    for (int i = 0; i < 20; ++i) {
      c.barrier();
      const auto t = Clock::now();
      c.all_reduce(s, ReduceOp::Sum);
      if (c.rank() == 0) small.push_back(seconds_since(t));
    }
  });
  r.link_latency_s = median(small);
  const double moved = 2.0 * (p - 1) / p * static_cast<double>(kLinkBytes);
  r.link_bytes_per_s = moved / std::max(median(big) - r.link_latency_s, 1e-9);
  r.link_source = fmt::format("measured: an in-process all-reduce of {} over {} threads",
                              human_bytes(kLinkBytes), p);
}

ooc::TierBandwidth tier_rates(const ooc::TierSpec& spec) {
  auto tier = ooc::open_slow_tier(spec, kTierProbeBytes, "the grid plan's bandwidth probe");
  return ooc::measure_bandwidth(*tier, kTierProbeBytes);
}

// TrainConfig::validate's refusal of `cfg`, or "".
std::string refusal_of(const TrainConfig& cfg) {
  try {
    cfg.validate();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// Grid divisors of `n` (at most kMaxPlanRanks, checked by the callers), ascending.
std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// At most this many refusals are listed in a message, then how many more there are: a plan of
// many ranks refuses hundreds of grids, and a message is one readable line.
constexpr size_t kListedRefusals = 3;

// A configuration's run: `base` on grid `g` with nothing the plan chooses set yet.
TrainConfig on_grid(const TrainConfig& base, const parallel::GridShape& g) {
  TrainConfig c = base;
  c.grid = g;
  c.plan_only = false;
  c.memory_budget.clear();
  c.ooc_plan.clear();
  c.model_state.reset();
  c.resident_blocks = Auto<int>();
  c.optimizer.sharding = parallel::Sharding::Moments;
  return c;
}

// One pipeline stage of a configuration: what it saves, its memory, its unit times.
struct Stage {
  nn::ChainLayout chain;
  RankMemory memory;
  ooc::Profile profile;         // the unit times the model predicts (comm included)
  double comm_per_micro_s = 0;  // of which communication, per micro-batch
  double backward_micro_s = 0;  // one micro-batch's backward, the data-parallel exchange's cover
  double dp_blocks_s = 0, dp_rest_s = 0;  // the data-parallel exchange: blocks', the rest's
  double state_io_s = 0;                  // the model state's I/O a step (with --model-state)
};

double rate_for(const Rates& r, int tp) {
  const auto it = r.gemm_flops_per_s.find(tp);
  TANDEM_CHECK(it != r.gemm_flops_per_s.end(), "no GEMM rate for tp {}", tp);
  return it->second;
}

// Matmul seconds of one micro-batch's half blocks' forward on a rank (their backward: twice).
struct HalfBlockMatmuls {
  double attention_s = 0, mlp_s = 0;
};

HalfBlockMatmuls half_block_matmuls(const TrainConfig& cfg, const Rates& r) {
  const parallel::GridShape& g = cfg.grid;
  const nn::GPTConfig& m = cfg.model;
  const int rows = static_cast<int>(cfg.batch / g.dp / cfg.micro_batch_count());
  const double tokens = rows * static_cast<double>(m.seq_len);
  const double rate = rate_for(r, g.tp);
  return {tokens * attention_flops_per_token(m, m.seq_len) / g.tp / rate,
          tokens * mlp_flops_per_token(m) / g.tp / rate};
}

// Local elements of one block's weights on a rank (every stage's blocks are alike).
int64_t block_elements(const TrainConfig& cfg) {
  const parallel::ShardLayout layout(cfg.model, cfg.grid, 0, 0);
  return layout.block_floats();
}

Stage model_stage(const TrainConfig& cfg, int s, const Rates& r) {
  const parallel::GridShape& g = cfg.grid;
  const nn::GPTConfig& m = cfg.model;
  const int M = cfg.micro_batch_count();
  const int rows = static_cast<int>(cfg.batch / g.dp / M);
  const double C = m.d_model, V = m.vocab_size, tokens = rows * static_cast<double>(m.seq_len);
  const double rate = rate_for(r, g.tp);
  const double lat = r.link_latency_s, bw = r.link_bytes_per_s;
  Stage st;
  st.chain =
      parallel::ParallelGPT::chain_layout(m, g, parallel::GridCoord{0, 0, s}, rows, m.seq_len, M);
  st.memory = rank_memory(cfg, 0, s);
  const parallel::ShardLayout layout(m, g, 0, s);
  const int64_t block = layout.block_floats();
  const int blocks = layout.end_layer() - layout.first_layer();
  const double block_floats = static_cast<double>(block) * blocks;
  const double rest_floats = static_cast<double>(layout.size()) - block_floats;

  // Matmul seconds of each half block's forward (its backward: twice), the head's.
  const auto [attn_s, mlp_s] = half_block_matmuls(cfg, r);
  const double head_s = layout.has_final() ? 2 * tokens * C * V / rate : 0;
  const double act_bytes = tokens * C * sizeof(float);
  // The tensor-parallel exchanges in their dtype (--tp-dtype; auto counted as f32).
  const double tp_bytes = act_bytes / sizeof(float) * dtype_size(cfg.tp_dtype.value_or(DType::F32));
  const double tp_s = g.tp > 1 ? lat + 2.0 * (g.tp - 1) / g.tp * tp_bytes / bw : 0;
  const double handoff_s = lat + act_bytes / bw;
  const bool zero3 = cfg.optimizer.sharding == parallel::Sharding::Weights;
  // A gather overlaps the blocks computing before it; the stage's first has nothing to hide
  // behind. The gathers run one at a time on the data-parallel thread, so however far ahead they
  // start (--gather-ahead), a block waits for what its gather takes beyond its own compute.
  const GatherTiming gt = zero3 ? gather_timing(cfg, r) : GatherTiming{};
  const double gather_s = gt.gather_s;
  const double gather_f = std::max(0.0, gather_s - gt.block_forward_s);
  const double gather_b = std::max(0.0, gather_s - gt.block_backward_s);
  const int n = st.chain.units;
  for (int u = 0; u < n; ++u) {
    const bool attn = u % nn::kBlockHalves == 0;
    const UnitFactor& k = attn ? r.attention : r.mlp;
    const double f0 = attn ? attn_s : mlp_s;
    double f = k.forward * f0, b = k.backward * 2 * f0, cf = tp_s, cb = tp_s;
    if (u == n - 1) f += r.head.forward * head_s, b += r.head.backward * 2 * head_s;
    if (u == n - 1 && s < g.pp - 1) cf += handoff_s;
    if (u == 0 && s > 0) cb += handoff_s;
    if (attn && zero3) {
      cf += u == 0 ? gather_s : gather_f;
      cb += u == n - 2 ? gather_s : gather_b;
    }
    st.profile.forward_s.push_back(f + cf);
    st.profile.backward_s.push_back(b + cb);
    st.comm_per_micro_s += cf + cb;
    st.backward_micro_s += b + cb;
  }
  st.profile.write_bytes_per_s = r.swap_tier.write_bytes_per_s;
  st.profile.read_bytes_per_s = r.swap_tier.read_bytes_per_s;

  // The data-parallel exchange: gradients reduce-scattered (in the gradients' dtype), weights
  // all-gathered; a sharded block's weights stay sliced, so its update gathers nothing.
  if (g.dp > 1) {
    const double frac = (g.dp - 1.0) / g.dp,
                 gsize = dtype_size(cfg.grad_dtype.value_or(DType::F32));
    st.dp_blocks_s = lat + frac * block_floats * (gsize + (zero3 ? 0 : sizeof(float))) / bw;
    st.dp_rest_s = lat + frac * rest_floats * (gsize + sizeof(float)) / bw;
  }
  if (cfg.model_state) {
    // The store's own prediction (no block resident), over the slices with --shard weights.
    const int64_t piece = (block + g.dp - 1) / g.dp;
    const parallel::BlockStore::Traffic t = parallel::BlockStore::predicted_step_traffic(
        blocks, zero3 ? piece : block, piece, zero3 ? 1 : M);
    st.state_io_s = static_cast<double>(t.read_bytes) / r.state_tier.read_bytes_per_s +
                    static_cast<double>(t.written_bytes) / r.state_tier.write_bytes_per_s;
  }
  return st;
}

// A size as a flag reads it back exactly: "9MiB", "3234KiB", "1000".
std::string size_flag(uint64_t bytes) {
  for (auto [unit, scale] :
       {std::pair{"GiB", 1ull << 30}, {"MiB", 1ull << 20}, {"KiB", 1ull << 10}})
    if (bytes % scale == 0) return fmt::format("{}{}", bytes / scale, unit);
  return fmt::format("{}", bytes);
}

// What the plan chooses, as the flags that ask for it (the settings table's).
std::string flags_of(const TrainConfig& c) {
  static constexpr std::string_view kChosen[] = {"grid", "sharding", "gather_ahead", "model_state",
                                                 "memory_budget"};
  return fmt::format("{}", fmt::join(detail::flags_for(c, kChosen), " "));
}

std::string listed(const std::vector<Refusal>& refused) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < refused.size() && i < kListedRefusals; ++i)
    parts.push_back(refused[i].what + ": " + refused[i].why);
  if (refused.size() > kListedRefusals)
    parts.push_back(fmt::format("and {} more", refused.size() - kListedRefusals));
  return fmt::format("{}", fmt::join(parts, "; "));
}

std::string describe_config(const TrainConfig& c) {
  return fmt::format("{}, --shard {}, blocks {}", c.grid.str(),
                     parallel::sharding_name(c.optimizer.sharding),
                     c.model_state ? "streamed from " + c.model_state->str() : "in memory");
}

// Plans one configuration against the limit: the option when it fits, else the least memory
// per rank it would need.
struct Evaluation {
  std::optional<GridOption> option;
  uint64_t least_bytes = 0;
  bool least_out_of_core = false;  // the least needs the activations out-of-core
};

Evaluation evaluate(const TrainConfig& cfg, uint64_t limit, const Rates& rates) {
  const parallel::GridShape& g = cfg.grid;
  std::vector<Stage> stages;
  for (int s = 0; s < g.pp; ++s) stages.push_back(model_stage(cfg, s, rates));
  uint64_t in_core = 0, fixed_less_held = 0;
  for (const Stage& st : stages) {
    in_core = std::max(in_core, st.memory.in_core());
    fixed_less_held = std::max(fixed_less_held, st.memory.fixed - st.memory.budget_holds);
  }
  Evaluation ev;
  GridOption o;
  o.cfg = cfg;
  std::vector<ooc::Prediction> predictions;
  if (in_core <= limit) {
    o.memory_per_rank = in_core;
    o.activations = "in-core";
    for (const Stage& st : stages)
      predictions.push_back(ooc::predict(st.chain, ooc::keep_all(st.chain.units), st.profile));
  } else {
    // Out-of-core: one --memory-budget B for every rank; stage s's activations get
    // B - budget_holds, and a rank needs fixed - budget_holds + B.
    uint64_t least_budget = 0;
    for (const Stage& st : stages) {
      const ooc::Profile sizes = ooc::uniform_profile(st.chain.units, 1.0, 2.0, 1e9, 1e9);
      const uint64_t smallest = ooc::smallest_budget(st.chain, sizes).bytes;
      least_budget = std::max(least_budget, st.memory.budget_holds + smallest);
    }
    ev.least_bytes = std::min(in_core, fixed_less_held + least_budget);
    ev.least_out_of_core = ev.least_bytes < in_core;
    if (fixed_less_held + least_budget > limit) return ev;
    // Whole KiB, so that the flag reads back the same.
    const uint64_t budget = (limit - fixed_less_held) / 1024 * 1024;
    if (budget < least_budget) return ev;
    std::vector<std::string> plans;
    try {
      for (const Stage& st : stages) {
        const ooc::PlannerResult p =
            ooc::plan_step(st.chain, st.profile, budget - st.memory.budget_holds, kPlanEvaluations);
        predictions.push_back(p.best.prediction);
        plans.push_back(p.best.plan.str());
      }
    } catch (const UserError&) {
      return ev;  // the search, cut short, found no plan that fits
    }
    o.cfg.memory_budget = size_flag(budget);
    o.memory_per_rank = fixed_less_held + budget;
    o.activations = fmt::format("out-of-core, plan{} {}", plans.size() == 1 ? "" : "s by stage",
                                fmt::join(plans, " "));
  }
  ev.least_bytes = o.memory_per_rank;
  // The slowest stage sets the pipeline's pace; the exchange's exposed part follows the step.
  const int M = cfg.micro_batch_count();
  double slowest = 0, dp = 0;
  for (size_t s = 0; s < stages.size(); ++s) {
    const Stage& st = stages[s];
    const ooc::Prediction& p = predictions[s];
    const double stage_s = std::max(p.step_s, st.state_io_s);
    if (stage_s >= slowest) {
      slowest = stage_s;
      o.comm_s = M * st.comm_per_micro_s;
      o.compute_s = p.compute_s - o.comm_s;
      o.stall_s = p.step_s - p.compute_s;
      o.io_s = stage_s - p.step_s;
    }
    const double cover =
        cfg.optimizer.exchange == parallel::GradExchange::Overlap ? st.backward_micro_s : 0;
    dp = std::max(dp, std::max(0.0, st.dp_blocks_s - cover) + st.dp_rest_s);
  }
  o.bubble_s = slowest * (g.pp - 1) / M;
  o.dp_s = dp;
  o.step_s = slowest + o.bubble_s + o.dp_s;
  o.tokens_per_s = static_cast<double>(cfg.batch) * cfg.model.seq_len / o.step_s;
  ev.option = std::move(o);
  return ev;
}

}  // namespace

GatherTiming gather_timing(const TrainConfig& cfg, const Rates& r) {
  const parallel::GridShape& g = cfg.grid;
  const auto [attn_s, mlp_s] = half_block_matmuls(cfg, r);
  GatherTiming t;
  t.gather_s = r.link_latency_s + (g.dp - 1.0) / g.dp * static_cast<double>(block_elements(cfg)) *
                                      sizeof(float) / r.link_bytes_per_s;
  t.block_forward_s = r.attention.forward * attn_s + r.mlp.forward * mlp_s;
  t.block_backward_s = 2 * (r.attention.backward * attn_s + r.mlp.backward * mlp_s);
  return t;
}

int gather_ahead_for(double gather_s, double block_s, int blocks) {
  const int most = std::max(1, blocks - 1);
  if (!(block_s > 0)) return most;
  const double d = std::ceil(gather_s / block_s - 1e-9);
  return static_cast<int>(std::clamp(d, 1.0, static_cast<double>(most)));
}

void choose_gather_ahead(TrainConfig& cfg, const Rates& rates) {
  if (cfg.optimizer.sharding != parallel::Sharding::Weights) return;
  if (cfg.gather_ahead.known()) return;  // given, or decided before (by --grid auto's plan)
  const int fewest = cfg.fewest_stage_blocks();
  const GatherTiming t = gather_timing(cfg, rates);
  const int d = gather_ahead_for(t.gather_s, t.block_forward_s, fewest);
  const bool capped = d * t.block_forward_s < t.gather_s;
  cfg.gather_ahead.decide(
      d, fmt::format("--gather-ahead auto: a gather {:.2f} ms, a block's forward {:.2f} ms{}",
                     t.gather_s * 1e3, t.block_forward_s * 1e3,
                     capped ? fmt::format("; at most {} with {} block{} a stage", d, fewest,
                                          fewest == 1 ? "" : "s")
                            : ""));
}

namespace {

// An Auto<int> as rank 0 hands it to the others: {"given": N}, {"value": N, "reason": "..."}
// once decided, or null while undecided.
nlohmann::json auto_json(const Auto<int>& a) {
  if (!a.is_auto()) return {{"given", a.value()}};
  if (!a.known()) return nullptr;
  return {{"value", a.value()}, {"reason", a.reason()}};
}
Auto<int> auto_from_json(const nlohmann::json& j) {
  if (j.is_null()) return {};
  if (j.contains("given")) return j.at("given").get<int>();
  Auto<int> a;
  a.decide(j.at("value").get<int>(), j.at("reason").get<std::string>());
  return a;
}

// What --grid auto takes from the plan's recommendation, as rank 0 hands it to the others.
nlohmann::json plan_choice_json(const TrainConfig& c) {
  return {{"dp", c.grid.dp},
          {"tp", c.grid.tp},
          {"pp", c.grid.pp},
          {"sharding", c.optimizer.sharding == parallel::Sharding::Weights},
          {"model_state", c.model_state ? c.model_state->str() : ""},
          {"resident_blocks", auto_json(c.resident_blocks)},
          {"memory_budget", c.memory_budget},
          {"gather_ahead", auto_json(c.gather_ahead)},
          {"grid_choice", c.grid_choice}};
}

void take_plan_choice(const nlohmann::json& j, TrainConfig& c) {
  c.grid = {j.at("dp").get<int>(), j.at("tp").get<int>(), j.at("pp").get<int>()};
  c.optimizer.sharding =
      j.at("sharding").get<bool>() ? parallel::Sharding::Weights : parallel::Sharding::Moments;
  const std::string tier = j.at("model_state").get<std::string>();
  c.model_state.reset();
  if (!tier.empty()) c.model_state = ooc::TierSpec::parse(tier);
  c.resident_blocks = auto_from_json(j.at("resident_blocks"));
  c.memory_budget = j.at("memory_budget").get<std::string>();
  c.gather_ahead = auto_from_json(j.at("gather_ahead"));
  c.grid_choice = j.at("grid_choice").get<std::string>();
}

// Rank 0's `decide`, on every process of `world` (or here, without one).
std::string on_root(comm::Communicator* world, const std::function<std::string()>& decide) {
  return world == nullptr ? decide() : comm::decide_on_root(*world, decide);
}

}  // namespace

uint64_t plan_memory_per_rank(const TrainConfig::GridAuto& request, comm::Backend backend) {
  if (request.memory_per_rank) return *request.memory_per_rank;
  const auto avail = available_memory();
  if (!avail)
    user_error(
        "--ranks {}: the memory available here is unknown; give the memory each rank may use "
        "with --memory-per-rank (e.g. 4GiB)",
        request.ranks);
  const int local = backend == comm::Backend::Thread ? request.ranks : comm::launched_local_ranks();
  return avail->bytes / static_cast<uint64_t>(std::max(1, local));
}

namespace {

// The BLAS threads a rank has: --threads, else the hardware threads shared by this process's
// ranks (every rank of the thread backend, or the launcher's ranks on this host).
int rank_blas_threads(const TrainConfig& c) {
  if (c.blas_threads > 0) return c.blas_threads;
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int local =
      c.backend == comm::Backend::Thread ? c.grid.size() : comm::launched_local_ranks();
  return std::max(1, hw / std::max(1, local));
}

}  // namespace

// --grid auto: the processes would each plan on their own measurements (and by default their
// own machine's memory) and could choose differently, so rank 0 plans; should it find nothing,
// all stop and rank 0 says why. --gather-ahead auto likewise. The rates measured for it are
// compute's and the link's, not the tiers'.
TrainConfig resolve(const TrainConfig& asked, comm::Communicator* world) {
  // Whether rank 0 plans, and whether and how the dtypes are decided, decides which collectives
  // follow: ranks started with different flags there stop here, naming them, rather than wait in
  // unmatched broadcasts.
  if (world != nullptr)
    detail::check_ranks_agree_on(*world, asked,
                                 {"model", "batch", "optimizer", "grad_dtype", "tp_dtype", "grid",
                                  "grid_auto", "micro_batches", "executor", "tune"});
  TrainConfig c = asked;
  if (c.grid_auto) {
    const TrainConfig::GridAuto& g = *c.grid_auto;
    auto plan = [&] {
      const GridPlan p = plan_grids(c, g.ranks, plan_memory_per_rank(g, c.backend),
                                    measure_rates(c, g.ranks, g.link_gbps));
      TrainConfig best = p.best().cfg;
      best.grid_choice = grid_choice_line(p);
      return plan_choice_json(best).dump();
    };
    take_plan_choice(nlohmann::json::parse(on_root(world, plan)), c);
  }
  c.validate();
  const std::string chosen = on_root(world, [&c] {
    TrainConfig d = c;
    if (d.optimizer.sharding == parallel::Sharding::Weights && !d.gather_ahead.known())
      choose_gather_ahead(d, measure_rates(d, d.grid.size(), std::nullopt, false));
    return auto_json(d.gather_ahead).dump();
  });
  // Rank 0's decision, where this process asked for auto too.
  const Auto<int> root = auto_from_json(nlohmann::json::parse(chosen));
  if (c.optimizer.sharding == parallel::Sharding::Weights && c.gather_ahead.is_auto() &&
      !c.gather_ahead.known() && root.is_auto() && root.known())
    c.gather_ahead = root;
  // The process's BLAS threads, a rank's: the autotuner's records count them in their keys, and
  // everything from here on runs as the ranks will.
  blas::set_num_threads(rank_blas_threads(c));
  // --tp-dtype auto, --grad-dtype auto: decided from the autotuner's records of the programs
  // they change, read (or, with --tune, timed) on the groups those run on, so each group's own
  // record counts (schedule_choice.h's decide_dtypes); the ranks' Grid is built for it here, on
  // the MPI world or on the in-process ranks of the thread backend, and the world agrees through
  // comm::all_true. An MPI world of the wrong size leaves them to train(), which refuses it.
  if (detail::dtypes_to_decide(c)) {
    if (world != nullptr) {
      if (world->size() == c.grid.size()) detail::decide_dtypes(*world, c);
    } else {
      TANDEM_CHECK(c.backend == comm::Backend::Thread,
                   "resolve: an MPI run's autos are decided on its world");
      TrainConfig decided;
      comm::run_ranks(c.grid.size(), [&](comm::Communicator& ranks) {
        TrainConfig mine = c;
        detail::decide_dtypes(ranks, mine);
        if (ranks.rank() == 0) decided = std::move(mine);  // the same on every rank
      });
      c = std::move(decided);
    }
  }
  return c;
}

std::string GridOption::describe() const {
  return fmt::format("{}, {}", describe_config(cfg), activations);
}

void check_plan_ranks(int64_t ranks) {
  if (ranks < 1) user_error("--ranks {} must be at least 1", ranks);
  if (ranks > kMaxPlanRanks)
    user_error(
        "--ranks {}: the plan across grids takes at most {} ranks; plan a run of that size or "
        "fewer, or give --dp, --tp and --pp",
        ranks, kMaxPlanRanks);
}

GridCandidates candidate_grids(const TrainConfig& base, int ranks) {
  check_plan_ranks(ranks);
  GridCandidates c;
  for (int dp : divisors(ranks))
    for (int tp : divisors(ranks / dp)) {
      const parallel::GridShape g{dp, tp, ranks / dp / tp};
      if (std::string why = refusal_of(on_grid(base, g)); !why.empty())
        c.refused.push_back({g.str(), std::move(why)});
      else
        c.allowed.push_back(g);
    }
  return c;
}

Rates measure_rates(const TrainConfig& base, int ranks, std::optional<double> link_gbps,
                    bool tiers) {
  check_plan_ranks(ranks);
  Rates r;
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int local = base.backend == comm::Backend::Thread ? ranks : comm::launched_local_ranks();
  const int threads = base.blas_threads > 0 ? base.blas_threads : std::max(1, hw / local);
  const int saved = blas::num_threads();
  blas::set_num_threads(threads);
  const nn::GPTConfig& m = base.model;
  const int64_t rank_rows = std::max<int64_t>(1, base.batch / ranks);
  const int rows = static_cast<int>(std::min<int64_t>(kGemmRows, m.seq_len * rank_rows));
  // Two rounds, the better of each: the first shape measured also pays for the warm-up of the
  // library and the processor's clock.
  for (int round = 0; round < 2; ++round)
    for (int tp : divisors(ranks))
      if (m.n_heads % tp == 0) {
        double& rate = r.gemm_flops_per_s[tp];
        rate = std::max(rate, gemm_rate(m.matmul, rows, m.mlp_width() / tp, m.d_model));
      }
  measure_unit_factors(m, rank_rows, r.gemm_flops_per_s.at(1), r);
  blas::set_num_threads(saved);
  // The ranks on this machine share its cores: asking for more threads than there are, each
  // computes at that share of the rate it has alone.
  const double share =
      std::min(1.0, static_cast<double>(hw) / (static_cast<double>(local) * threads));
  for (auto& [tp, rate] : r.gemm_flops_per_s) rate *= share;
  r.compute_source = fmt::format(
      "measured: a {} GEMM of the MLP's shape ({} rows) on {} BLAS thread{} a rank{}; a block "
      "and the head run at tp 1 take attention {:.2f}/{:.2f}, MLP {:.2f}/{:.2f}, head "
      "{:.2f}/{:.2f} (forward/backward) times their matmuls at that rate",
      dtype_name(m.matmul), rows, threads, threads == 1 ? "" : "s",
      share < 1 ? fmt::format(", times {:.2f}: {} ranks x {} threads on {} cores", share, local,
                              threads, hw)
                : "",
      r.attention.forward, r.attention.backward, r.mlp.forward, r.mlp.backward, r.head.forward,
      r.head.backward);
  if (link_gbps) {
    r.link_bytes_per_s = *link_gbps * 1e9 / 8;
    r.link_latency_s = kStatedLinkLatencyS;
    r.link_source = fmt::format("stated: --link-gbps {:g}, {:.0f} us a message", *link_gbps,
                                kStatedLinkLatencyS * 1e6);
  } else if (ranks > 1) {
    measure_link(std::min({ranks, kLinkRanks, comm::kMaxThreadRanks}), r);
  } else {
    r.link_bytes_per_s = 1e12;
    r.link_source = "one rank: no link";
  }
  if (!tiers) return r;
  r.swap_tier = tier_rates(base.slow_tier);
  if (base.model_state) r.state_tier = tier_rates(*base.model_state);
  return r;
}

GridPlan plan_grids(const TrainConfig& base, int ranks, uint64_t memory_per_rank,
                    const Rates& rates) {
  GridPlan plan;
  plan.ranks = ranks;
  plan.memory_per_rank = memory_per_rank;
  plan.rates = rates;
  const GridCandidates grids = candidate_grids(base, ranks);
  plan.refused = grids.refused;
  if (grids.allowed.empty())
    user_error("no grid of {} ranks suits this model and batch: {}", ranks, listed(grids.refused));
  std::optional<std::pair<uint64_t, std::string>> least;  // over every configuration
  for (const parallel::GridShape& g : grids.allowed) {
    std::vector<TrainConfig> configs;
    TrainConfig c = on_grid(base, g);
    configs.push_back(c);
    if (g.dp >= 2) {
      TrainConfig w = c;
      w.optimizer.sharding = parallel::Sharding::Weights;
      configs.push_back(w);
    }
    if (base.model_state) {
      TrainConfig st = c;
      st.model_state = base.model_state;
      st.resident_blocks = base.resident_blocks;
      configs.push_back(st);
      if (g.dp >= 2) {  // each rank's slices streamed from its tier
        st.optimizer.sharding = parallel::Sharding::Weights;
        configs.push_back(st);
      }
    }
    for (TrainConfig& cfg : configs) {
      if (cfg.optimizer.sharding == parallel::Sharding::Weights)
        choose_gather_ahead(cfg, rates);
      else
        cfg.gather_ahead = Auto<int>();  // --grid auto --gather-ahead N: for the sharded ones
      if (std::string why = refusal_of(cfg); !why.empty()) {
        plan.refused.push_back({describe_config(cfg), std::move(why)});
        continue;
      }
      Evaluation ev = evaluate(cfg, memory_per_rank, rates);
      if (!least || ev.least_bytes < least->first)
        least = {ev.least_bytes,
                 describe_config(cfg) + (ev.least_out_of_core ? ", activations out-of-core" : "")};
      if (ev.option) {
        plan.options.push_back(std::move(*ev.option));
      } else {
        plan.refused.push_back({describe_config(cfg), fmt::format("needs at least {} a rank",
                                                                  human_bytes(ev.least_bytes))});
      }
    }
  }
  if (plan.options.empty()) {
    if (!least)
      user_error("no configuration of {} ranks suits these flags: {}", ranks, listed(plan.refused));
    const uint64_t kib = (least->first + 1023) / 1024;
    user_error(
        "no grid of {} ranks fits {} a rank: the smallest memory per rank that works is {} "
        "(--memory-per-rank {}), with {}",
        ranks, human_bytes(memory_per_rank), human_bytes(least->first), size_flag(kib * 1024),
        least->second);
  }
  std::stable_sort(plan.options.begin(), plan.options.end(),
                   [](const GridOption& a, const GridOption& b) { return a.step_s < b.step_s; });
  for (size_t i = 1; i < plan.ties(); ++i)
    if (simpler_than(plan.options[i], plan.options[plan.recommended])) plan.recommended = i;
  return plan;
}

size_t GridPlan::ties() const {
  if (options.empty()) return 0;
  const double limit = options.front().step_s * (1 + kPlanTieFraction);
  size_t n = 0;
  while (n < options.size() && options[n].step_s <= limit) ++n;
  return n;
}

bool simpler_than(const GridOption& a, const GridOption& b) {
  auto parts = [](const GridOption& o) {
    return std::make_tuple(o.cfg.model_state.has_value(),
                           o.cfg.optimizer.sharding == parallel::Sharding::Weights,
                           !o.cfg.memory_budget.empty(), o.cfg.grid.pp, o.cfg.grid.tp);
  };
  return parts(a) < parts(b);
}

std::string grid_plan_report(const GridPlan& plan) {
  const TrainConfig& c = plan.best().cfg;
  const Rates& r = plan.rates;
  std::string out = fmt::format(
      "tandem plan: {} {} layers x d_model {} ({} heads{}), {} x {} tokens a step, on {} ranks "
      "with {} a rank\n",
      c.model.llama() ? "Llama" : "GPT", c.model.n_layers, c.model.d_model, c.model.n_heads,
      c.model.llama()
          ? fmt::format(", {} key/value heads, MLP {}", c.model.n_kv_heads(), c.model.mlp_width())
          : "",
      c.batch, c.model.seq_len, plan.ranks, human_bytes(plan.memory_per_rank));
  std::vector<std::string> gemms;
  for (const auto& [tp, f] : r.gemm_flops_per_s)
    gemms.push_back(fmt::format("tp{} {:.1f}", tp, f / 1e9));
  out += fmt::format("  compute: GFLOP/s {} ({})\n", fmt::join(gemms, ", "), r.compute_source);
  out += fmt::format("  link: {:.2f} GB/s, {:.1f} us a message ({})\n", r.link_bytes_per_s / 1e9,
                     r.link_latency_s * 1e6, r.link_source);
  out += fmt::format("  slow tier {}: write {:.2f} GB/s, read {:.2f} GB/s\n", c.slow_tier.str(),
                     r.swap_tier.write_bytes_per_s / 1e9, r.swap_tier.read_bytes_per_s / 1e9);
  if (r.state_tier.read_bytes_per_s > 0)
    out += fmt::format("  model-state tier: write {:.2f} GB/s, read {:.2f} GB/s\n",
                       r.state_tier.write_bytes_per_s / 1e9, r.state_tier.read_bytes_per_s / 1e9);
  out += fmt::format("\n{:<17}{:<10}{:<14}{:<34}{:>12}{:>10}{:>12}  {}\n", "grid", "sharding",
                     "model state", "activations", "memory/rank", "step", "tokens/s",
                     "compute + comm + stall + io + bubble + dp (s)  [flags]");
  for (const GridOption& o : plan.options) {
    const std::string acts =
        o.cfg.memory_budget.empty()
            ? "in-core"
            : fmt::format("out-of-core in {}", human_bytes(parse_bytes(o.cfg.memory_budget)));
    out += fmt::format(
        "{:<17}{:<10}{:<14}{:<34}{:>12}{:>9.4f}s{:>12.0f}  {:.4f} + {:.4f} + {:.4f} + {:.4f} + "
        "{:.4f} + {:.4f}  [{}]\n",
        o.cfg.grid.str(), parallel::sharding_name(o.cfg.optimizer.sharding),
        o.cfg.model_state ? "streamed" : "memory", acts, human_bytes(o.memory_per_rank), o.step_s,
        o.tokens_per_s, o.compute_s, o.comm_s, o.stall_s, o.io_s, o.bubble_s, o.dp_s,
        flags_of(o.cfg));
  }
  if (!plan.refused.empty()) {
    out += "\nleft out:\n";
    for (const Refusal& f : plan.refused) out += fmt::format("  {}: {}\n", f.what, f.why);
  }
  const GridOption& b = plan.best();
  out += fmt::format(
      "\nrecommended: {} ({}): predicted {:.4f} s a step, {:.0f} tokens/s; `tandem train --grid "
      "auto --ranks {} --memory-per-rank {}` takes it\n",
      flags_of(b.cfg), b.activations, b.step_s, b.tokens_per_s, plan.ranks,
      size_flag(plan.memory_per_rank));
  if (plan.ties() > 1)
    out += fmt::format(
        "  {} configurations are within {:g}% of the fastest prediction, closer than the "
        "measurements behind them: a tie, taken by the simplest (model state in memory, weights "
        "whole, activations in core, fewer stages, fewer tensor-parallel ranks)\n",
        plan.ties(), kPlanTieFraction * 100);
  return out;
}

std::string grid_choice_line(const GridPlan& plan) {
  const GridOption& b = plan.best();
  const std::string which =
      plan.ties() > 1 ? fmt::format("the simplest of the {} within {:g}% of the fastest prediction",
                                    plan.ties(), kPlanTieFraction * 100)
                      : "the fastest";
  return fmt::format(
      "--grid auto: {} ({}), {} of {} configuration{} of {} ranks that fit {} a rank, predicted "
      "{:.4f} s a step",
      flags_of(b.cfg), b.activations, which, plan.options.size(),
      plan.options.size() == 1 ? "" : "s", plan.ranks, human_bytes(plan.memory_per_rank), b.step_s);
}

}  // namespace tandem::train
