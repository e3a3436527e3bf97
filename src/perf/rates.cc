// Measuring the performance model's rates: a GEMM at the model's shapes, one block and the head
// run for their UnitFactors, the step's other work, an in-process all-reduce, the tiers and the
// optimizer's update. The one place tandem times compute, a link or a tier to predict a step.
#include "tandem/perf/rates.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <latch>
#include <thread>
#include <vector>

#include "tandem/comm/thread.h"
#include "tandem/core/blas.h"
#include "tandem/core/bytes.h"
#include "tandem/core/clock.h"
#include "tandem/core/error.h"
#include "tandem/core/gemm.h"
#include "tandem/core/rng.h"
#include "tandem/core/tensor.h"
#include "tandem/nn/layers.h"
#include "tandem/perf/flops.h"
#include "tandem/perf/tier_bandwidth.h"

namespace tandem::perf {
namespace {

constexpr int kGemmRows = 1024;              // rows of the measured GEMM, at most
constexpr double kGemmSeconds = 0.2;         // timed per run of a unit or the other work, about
constexpr int kGemmWindows = 5;              // alone and together windows of a GEMM rate, each
constexpr double kGemmWindowSeconds = 0.06;  // a window, about
constexpr uint64_t kLinkBytes = 16 << 20;    // the measured all-reduce
constexpr int kLinkRanks = 8;                // threads it runs on, at most
constexpr int kTogetherRanks = 32;           // ranks the GEMM runs on at once, at most
constexpr int kUnitTokens = 512;             // tokens of the block run for the UnitFactors, at most
constexpr int64_t kUpdateParams = 1 << 20;   // parameters of the timed update loop
constexpr double kStatedLinkLatencyS = 50e-6;  // with a stated link: a TCP round trip, about

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A (rows x k) by (k x n) GEMM of `type` on operands of its own (zeros: the rate does not depend
// on the values).
struct TimedGemm {
  std::vector<char> a, b;
  std::vector<float> c;
  GemmCall call;
  TimedGemm(DType type, int rows, int n, int k)
      : a(static_cast<size_t>(rows) * k * dtype_size(type)),
        b(static_cast<size_t>(k) * n * dtype_size(type)),
        c(static_cast<size_t>(rows) * n) {
    call.type = type;
    call.m = rows, call.n = n, call.k = k;
    call.a = a.data(), call.lda = k;
    call.b = b.data(), call.ldb = n;
    call.c = c.data(), call.ldc = n;
  }
  double flops() const { return 2.0 * call.m * call.n * call.k; }
};

// FLOP/s of `callers` threads running the GEMM at once for one window, as in-process ranks and
// the processes of one host do (callers 1: a rank alone): each a thread with its own operands,
// all released together at a latch and each repeating the GEMM until the same deadline, so that
// they compete throughout; each caller's rate is the calls it finished over the time they took:
// the slowest's (a step whose ranks all compute at once waits for its slowest), and their sum
// (what the host computes with all of them at it).
struct TogetherRates {
  double slowest = 0, sum = 0;
};
TogetherRates gemm_window(std::vector<TimedGemm>& gemms, int callers, double seconds) {
  std::latch start(callers);
  std::vector<double> rates(static_cast<size_t>(callers));
  auto caller = [&](int i) {
    const TimedGemm& g = gemms[static_cast<size_t>(i)];
    start.arrive_and_wait();
    const auto begin = Clock::now();
    int calls = 0;
    while (calls < 2 || seconds_since(begin) < seconds) {
      gemm(g.call);
      ++calls;
    }
    rates[static_cast<size_t>(i)] = g.flops() * calls / std::max(seconds_since(begin), 1e-9);
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < callers; ++i) threads.emplace_back(caller, i);
  for (std::thread& t : threads) t.join();
  TogetherRates r;
  r.slowest = *std::min_element(rates.begin(), rates.end());
  for (double x : rates) r.sum += x;
  return r;
}

// A rank's GEMM rate alone, and with `callers` at once (1: alone only). The machine's speed
// drifts by 10-25% over seconds on a shared host (measured: five runs of `tandem plan` on one
// quiet 2-core VM read 69-84 GFLOP/s alone as the fastest of repeats, 42-70 together as one
// window's mean): so alone and together windows alternate, the ratio of each pair is taken in the
// same moment, and the medians of the rate alone and of the ratios are kept.
struct GemmRates {
  double alone = 0;
  TogetherRates together;  // equal to alone when callers is 1
};
GemmRates gemm_rates(DType type, int rows, int n, int k, int callers) {
  std::vector<TimedGemm> gemms;
  for (int i = 0; i < callers; ++i) gemms.emplace_back(type, rows, n, k);
  for (TimedGemm& g : gemms) gemm(g.call);  // warm-up: threads started, primitives created
  std::vector<double> alone, slowest, sum;
  for (int w = 0; w < kGemmWindows; ++w) {
    const double a = gemm_window(gemms, 1, kGemmWindowSeconds).slowest;
    alone.push_back(a);
    if (callers > 1) {
      const TogetherRates t = gemm_window(gemms, callers, kGemmWindowSeconds);
      slowest.push_back(t.slowest / a);
      sum.push_back(t.sum / a);
    }
  }
  GemmRates r;
  r.alone = median(alone);
  r.together = callers > 1 ? TogetherRates{r.alone * median(slowest), r.alone * median(sum)}
                           : TogetherRates{r.alone, r.alone};
  return r;
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

// The step's other work (step_model.h's stage_other_s), on the unit factors' model and tokens:
// the embedding's forward and backward (their tokens spread over the vocabulary, as a text's
// are, not one row of the table read again), a token's; and zeroing `dw` as the trainer zeroes
// its gradients (Tensor::fill), floats a second.
void measure_other_work(const nn::GPTConfig& c, int B, int T, const nn::ParameterSet& w,
                        const nn::ParameterSet& dw, nn::Workspace& ws, const float* dout,
                        Rates& r) {
  std::vector<int32_t> tokens(static_cast<size_t>(B) * T);
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<int32_t>((i * 7919) % static_cast<size_t>(c.vocab_size));
  const nn::EmbeddingActivations e = nn::allocate_embedding_activations(c, B, T);
  const nn::StepRng rng;
  const double forward_s =
      fastest_s([&] { nn::embedding_forward(c, w.embedding(), e, tokens.data(), B, T, rng); });
  const double backward_s = fastest_s(
      [&] { nn::embedding_backward(c, dw.embedding(), dout, tokens.data(), ws, B, T, rng); });
  r.embedding_token_s = (forward_s + backward_s) / (static_cast<double>(B) * T);
  const Tensor g = dw.flat();
  r.zero_floats_per_s = static_cast<double>(g.numel()) / fastest_s([&] { g.fill(0.0f); });
  r.other_source = fmt::format(
      "measured: the embedding's forward and backward over {} tokens, and {} of gradients "
      "zeroed, on one rank alone",
      B * T, human_bytes(g.nbytes()));
}

// A unit's factor: the seconds of `run` over what its matmuls (`matmul_flops`) take at the GEMM
// rate, each run timed right after one call of the rates' GEMM `g`, so that the machine's drift
// cancels within each pair; the median of the pairs filling about 2 x kGemmSeconds, after a
// warm-up.
template <typename F>
double unit_factor(F&& run, double matmul_flops, const TimedGemm& g) {
  run();
  gemm(g.call);
  std::vector<double> factors;
  const auto begin = Clock::now();
  for (int i = 0; i < 3 || (i < 15 && seconds_since(begin) < 2 * kGemmSeconds); ++i) {
    auto t = Clock::now();
    gemm(g.call);
    const double gemm_s = seconds_since(t);
    t = Clock::now();
    run();
    const double run_s = seconds_since(t);
    factors.push_back(run_s / std::max(matmul_flops * gemm_s / g.flops(), 1e-12));
  }
  return median(factors);
}

// Runs one block's halves and the head (ln_f, the tied LM head, the loss) forward and backward
// on one rank, at up to kUnitTokens tokens of the model's sequences, each against the GEMM `g`
// (the step model's matmul term, at tp 1: unit_factor); then the step's other work on the same.
void measure_unit_factors(const nn::GPTConfig& model, int64_t rows, const TimedGemm& g, Rates& r) {
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
  // Activations and gradients of a trained model's spread: constant rows would make LayerNorm's
  // output constant and the products' operands degenerate.
  std::vector<float> x(static_cast<size_t>(btc)), dres(static_cast<size_t>(btc)),
      dx(static_cast<size_t>(btc));
  for (int64_t i = 0; i < btc; ++i) {
    x[static_cast<size_t>(i)] = random_normal(1, static_cast<uint64_t>(i));
    dres[static_cast<size_t>(i)] = 1e-3f * random_normal(2, static_cast<uint64_t>(i));
  }
  std::vector<int32_t> targets(static_cast<size_t>(B) * T, 1);
  const nn::StepRng rng;
  const nn::BlockParams bw = w.block(0), bdw = dw.block(0);
  const double tokens = static_cast<double>(B) * T;
  const double attn = tokens * attention_flops_per_token(c, T);
  const double mlp = tokens * mlp_flops_per_token(c);
  const double head = tokens * head_flops_per_token(c);
  r.attention.forward = unit_factor(
      [&] { nn::block_attention_forward(c, 0, bw, a, x.data(), ws, B, T, rng); }, attn, g);
  r.mlp.forward = unit_factor([&] { nn::block_mlp_forward(c, 0, bw, a, ws, B, T, rng); }, mlp, g);
  r.mlp.backward = unit_factor(
      [&] { nn::block_mlp_backward(c, 0, bw, bdw, a, dres.data(), ws, B, T, rng); }, 2 * mlp, g);
  r.attention.backward = unit_factor(
      [&] { nn::block_attention_backward(c, 0, bw, bdw, a, x.data(), dres.data(), ws, B, T, rng); },
      2 * attn, g);
  r.head.forward = unit_factor(
      [&] { nn::final_forward(c, w.final_stage(), fa, x.data(), targets.data(), ws, B, T); }, head,
      g);
  r.head.backward = unit_factor(
      [&] {
        nn::final_backward(c, w.final_stage(), dw.final_stage(), fa, x.data(), targets.data(), 1.0f,
                           dx.data(), ws, B, T);
      },
      2 * head, g);
  measure_other_work(c, B, T, w, dw, ws, dres.data(), r);
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

// Parameters a second one thread updates with AdamW's arithmetic (weights, gradients and both
// moments read, weights and moments written: the update's memory traffic and its square root),
// over kUpdateParams parameters: the loop the optimizer programs run per element, written out
// here because a program's timing needs a communicator and a compiler.
double update_rate() {
  const size_t n = kUpdateParams;
  std::vector<float> w(n, 0.5f), g(n, 1e-3f), m(n, 0.0f), v(n, 0.0f);
  const float b1 = 0.9f, b2 = 0.999f, lr = 1e-4f, eps = 1e-8f, wd = 0.1f;
  const double s = fastest_s([&] {
    for (size_t i = 0; i < n; ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      w[i] -= lr * (m[i] / (std::sqrt(v[i]) + eps) + wd * w[i]);
    }
  });
  return static_cast<double>(n) / std::max(s, 1e-9);
}

template <typename T>
T field(const nlohmann::json& j, const char* name) {
  if (!j.contains(name)) user_error("the performance model's rates lack '{}'", name);
  return j.at(name).get<T>();
}

double positive(const nlohmann::json& j, const char* name) {
  const double v = field<double>(j, name);
  if (!(v > 0) || !std::isfinite(v))
    user_error("the performance model's rate '{}' is {}, not a positive number", name, v);
  return v;
}

}  // namespace

nlohmann::json Rates::to_json() const {
  nlohmann::json gemm = nlohmann::json::object();
  for (const auto& [tp, f] : gemm_flops_per_s) gemm[std::to_string(tp)] = f;
  auto unit = [](const UnitFactor& u) { return nlohmann::json{u.forward, u.backward}; };
  nlohmann::json alone = nlohmann::json::object();
  for (const auto& [tp, f] : gemm_alone_flops_per_s) alone[std::to_string(tp)] = f;
  nlohmann::json core = nlohmann::json::object();
  for (const auto& [tp, f] : gemm_core_flops_per_s) core[std::to_string(tp)] = f;
  return {{"gemm_flops_per_s", gemm},
          {"gemm_alone_flops_per_s", alone},
          {"gemm_core_flops_per_s", core},
          {"host_ranks", host_ranks},
          {"host_slots", host_slots},
          {"link_core_share", link_core_share},
          {"update_core_share", update_core_share},
          {"attention", unit(attention)},
          {"mlp", unit(mlp)},
          {"head", unit(head)},
          {"link_bytes_per_s", link_bytes_per_s},
          {"link_latency_s", link_latency_s},
          {"swap_tier", {swap_tier.write_bytes_per_s, swap_tier.read_bytes_per_s}},
          {"state_tier", {state_tier.write_bytes_per_s, state_tier.read_bytes_per_s}},
          {"update_params_per_s", update_params_per_s},
          {"embedding_token_s", embedding_token_s},
          {"zero_floats_per_s", zero_floats_per_s},
          {"compute_source", compute_source},
          {"link_source", link_source},
          {"update_source", update_source},
          {"other_source", other_source}};
}

Rates Rates::from_json(const nlohmann::json& j) {
  Rates r;
  try {
    // A map of GEMM rates by tp, each positive; `what` names it in the message.
    const auto read_rates = [&](const char* key, const char* what, std::map<int, double>& out) {
      const nlohmann::json rates = field<nlohmann::json>(j, key);  // items() refers to it
      for (const auto& [tp, f] : rates.items()) {
        const double rate = f.get<double>();
        if (!(rate > 0))
          user_error("the performance model's GEMM rate{} at tp {} is {}", what, tp, rate);
        out[std::stoi(tp)] = rate;
      }
    };
    read_rates("gemm_flops_per_s", "", r.gemm_flops_per_s);
    if (r.gemm_flops_per_s.empty()) user_error("the performance model's rates have no GEMM rate");
    read_rates("gemm_alone_flops_per_s", " alone", r.gemm_alone_flops_per_s);
    read_rates("gemm_core_flops_per_s", " a core", r.gemm_core_flops_per_s);
    r.host_ranks = field<int>(j, "host_ranks");
    r.host_slots = field<double>(j, "host_slots");
    if (r.host_ranks < 1 || !(r.host_slots >= 1) || !std::isfinite(r.host_slots))
      user_error(
          "the performance model's host holds {} ranks and {} cores' worth of them, not at least "
          "1 each",
          r.host_ranks, r.host_slots);
    auto unit = [&](const char* name) {
      const auto pair = field<std::vector<double>>(j, name);
      if (pair.size() != 2 || !(pair[0] > 0) || !(pair[1] > 0))
        user_error("the performance model's '{}' factors are not two positive numbers", name);
      return UnitFactor{pair[0], pair[1]};
    };
    const auto share = [&](const char* name) {
      const double v = field<double>(j, name);
      if (!(v >= 0 && v <= 1))
        user_error("the performance model's '{}' is {}, not a share of a core from 0 to 1", name,
                   v);
      return v;
    };
    r.link_core_share = share("link_core_share");
    r.update_core_share = share("update_core_share");
    r.attention = unit("attention"), r.mlp = unit("mlp"), r.head = unit("head");
    r.link_bytes_per_s = positive(j, "link_bytes_per_s");
    r.link_latency_s = field<double>(j, "link_latency_s");
    auto tier = [&](const char* name) {
      const auto pair = field<std::vector<double>>(j, name);
      if (pair.size() != 2 || !(pair[0] >= 0) || !(pair[1] >= 0))
        user_error("the performance model's '{}' bandwidths are not two numbers", name);
      return ooc::TierBandwidth{pair[0], pair[1]};
    };
    r.swap_tier = tier("swap_tier"), r.state_tier = tier("state_tier");
    r.update_params_per_s = field<double>(j, "update_params_per_s");
    r.embedding_token_s = field<double>(j, "embedding_token_s");
    r.zero_floats_per_s = field<double>(j, "zero_floats_per_s");
    r.compute_source = field<std::string>(j, "compute_source");
    r.link_source = field<std::string>(j, "link_source");
    r.update_source = field<std::string>(j, "update_source");
    r.other_source = field<std::string>(j, "other_source");
  } catch (const nlohmann::json::exception& e) {
    user_error("the performance model's rates are malformed: {}", e.what());
  } catch (const std::invalid_argument&) {
    user_error("the performance model's GEMM rates are keyed by something not a tp degree");
  } catch (const std::out_of_range&) {
    user_error("the performance model's GEMM rates are keyed by something not a tp degree");
  }
  if (!(r.link_latency_s >= 0) || !(r.update_params_per_s >= 0) || !(r.embedding_token_s >= 0) ||
      !(r.zero_floats_per_s >= 0))
    user_error(
        "the performance model's rates hold a negative latency, update rate, embedding time or "
        "zeroing rate");
  return r;
}

std::string RateRequest::key() const {
  const nn::GPTConfig& m = model;
  return nlohmann::json{
      // v2: the GEMM rate is measured with the local ranks computing at once; v3: and a core's
      // rate while they do, with the host's ranks and cores; v4: and the cores' share of the
      // link's and the update's seconds; v5: and the step's other work (the embedding's time a
      // token, the gradients' zeroing rate); v6: rates from alternating windows, unit factors
      // from paired runs on varied inputs.
      {"what", "tandem performance-model rates v6"},
      {"model",
       {std::string(nn::arch_name(m.arch)), m.n_layers, m.d_model, m.n_heads, m.n_kv_heads(),
        m.mlp_width(), m.seq_len, m.vocab_size, std::string(dtype_name(m.matmul)),
        std::string(nn::attention_kernel_name(m.attention))}},
      {"rank_rows", rank_rows},
      {"ranks", ranks},
      {"local_ranks", local_ranks},
      {"threads", threads},
      {"hardware_threads", std::max(1u, std::thread::hardware_concurrency())},
      {"link_gbps", link_gbps ? nlohmann::json(*link_gbps) : nlohmann::json(nullptr)},
      {"tiers", tiers},
      {"swap_tier", swap_tier.str()},
      {"state_tier", state_tier ? state_tier->str() : ""}}
      .dump();
}

Rates measure_rates(const RateRequest& q) {
  TANDEM_CHECK(q.ranks >= 1 && q.local_ranks >= 1 && q.threads >= 1,
               "measure_rates: {} ranks, {} here, {} threads", q.ranks, q.local_ranks, q.threads);
  Rates r;
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int saved = blas::num_threads();
  blas::set_num_threads(q.threads);
  const nn::GPTConfig& m = q.model;
  const int64_t rank_rows = std::max<int64_t>(1, q.rank_rows);
  const int rows = static_cast<int>(std::min<int64_t>(kGemmRows, m.seq_len * rank_rows));
  // Each tp degree's GEMM alone and, for the ranks on this machine, with all of them computing
  // at once (cores and memory bandwidth shared; at most kTogetherRanks threads, more share the
  // rate those get): the slowest's rate, the step model's when each rank has cores of its own;
  // and their summed rate over the cores they shared, a core's while the host is busy, the step
  // model's when the ranks outnumber the cores (hardware threads over a rank's BLAS threads).
  const int together = std::min(q.local_ranks, kTogetherRanks);
  const double beyond = static_cast<double>(together) / q.local_ranks;
  r.host_ranks = q.local_ranks;
  r.host_slots = std::max(1.0, static_cast<double>(hw) / q.threads);
  for (int tp = 1; tp <= q.ranks; ++tp)
    if (q.ranks % tp == 0 && m.n_heads % tp == 0) {
      const GemmRates g =
          gemm_rates(m.matmul, rows, static_cast<int>(m.mlp_width() / tp), m.d_model, together);
      r.gemm_alone_flops_per_s[tp] = g.alone;
      r.gemm_flops_per_s[tp] = q.local_ranks > 1 ? beyond * g.together.slowest : g.alone;
      r.gemm_core_flops_per_s[tp] =
          q.local_ranks > 1 ? g.together.sum / std::min<double>(together, r.host_slots) : g.alone;
    }
  const TimedGemm unit_gemm(m.matmul, rows, static_cast<int>(m.mlp_width()), m.d_model);
  measure_unit_factors(m, rank_rows, unit_gemm, r);
  blas::set_num_threads(saved);
  const double alone1 = r.gemm_alone_flops_per_s.at(1), with1 = r.gemm_flops_per_s.at(1);
  const double core1 = r.gemm_core_flops_per_s.at(1);
  r.compute_source = fmt::format(
      "measured: a {} GEMM of the MLP's shape ({} rows) on {} BLAS thread{} a rank{}; a block "
      "and the head run at tp 1 take attention {:.2f}/{:.2f}, MLP {:.2f}/{:.2f}, head "
      "{:.2f}/{:.2f} (forward/backward) times their matmuls at the rate alone",
      dtype_name(m.matmul), rows, q.threads, q.threads == 1 ? "" : "s",
      q.local_ranks > 1
          ? fmt::format(", with the {} ranks on {} hardware threads computing at once ({:.2f}x "
                        "the rate alone at tp 1 for the slowest{})",
                        q.local_ranks, hw, with1 / alone1,
                        q.local_ranks > r.host_slots
                            ? fmt::format("; {:.2f}x summed over the {:g} cores' worth they "
                                          "share, a core's rate",
                                          core1 / alone1, r.host_slots)
                            : "")
          : "",
      r.attention.forward, r.attention.backward, r.mlp.forward, r.mlp.backward, r.head.forward,
      r.head.backward);
  if (q.link_gbps) {
    r.link_bytes_per_s = *q.link_gbps * 1e9 / 8;
    r.link_latency_s = kStatedLinkLatencyS;
    r.link_source = fmt::format("stated: --link-gbps {:g}, {:.0f} us a message", *q.link_gbps,
                                kStatedLinkLatencyS * 1e6);
  } else if (q.ranks > 1) {
    const int p = std::min({q.ranks, kLinkRanks, comm::kMaxThreadRanks});
    measure_link(p, r);
    // Its p threads copied and summed at once, each on a share of a hardware thread.
    r.link_core_share = std::min(1.0, static_cast<double>(hw) / p) / q.threads;
  } else {
    r.link_bytes_per_s = 1e12;
    r.link_source = "one rank: no link";
  }
  if (!q.tiers) {
    r.update_source = "not measured: counted as 0";
    return r;
  }
  r.swap_tier = measure_tier(q.swap_tier);
  if (q.state_tier) r.state_tier = measure_tier(*q.state_tier);
  // One thread's loop, shared like the GEMM when the machine's ranks outnumber its cores.
  const double thread_share = std::min(1.0, static_cast<double>(hw) / q.local_ranks);
  r.update_params_per_s = update_rate() * thread_share;
  r.update_core_share = thread_share / q.threads;
  r.update_source = fmt::format("measured: an AdamW loop over {} parameters on one thread{}",
                                kUpdateParams, q.local_ranks > hw ? ", shared by the ranks" : "");
  return r;
}

}  // namespace tandem::perf
