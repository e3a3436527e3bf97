// The step-time model of perf/step_model.h: each stage's unit times and exchanges from the
// rates, and the step composed from the stages' activation timelines.
#include "tandem/perf/step_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "tandem/core/error.h"
#include "tandem/parallel/block_store.h"
#include "tandem/parallel/model.h"
#include "tandem/parallel/shard.h"
#include "tandem/perf/flops.h"
#include "tandem/perf/streamed_state.h"

namespace tandem::perf {
namespace {

double rate_in(const std::map<int, double>& rates, int tp, const char* which) {
  const auto it = rates.find(tp);
  TANDEM_CHECK(it != rates.end(), "no GEMM rate {} for tp {}", which, tp);
  return it->second;
}

// Matmul seconds of one micro-batch's half blocks' forward on a rank (their backward: twice).
struct HalfBlockMatmuls {
  double attention_s = 0, mlp_s = 0;
};

// With context parallelism a rank holds seq_len / cp tokens of each row: its projections and MLP
// run on them, and its queries meet the whole sequence's keys. The split is balanced for the
// causal mask, so a rank's share of the scores is 1/cp of the sequence's: the per-token formula
// at the whole sequence's T over the rank's tokens counts exactly that.
HalfBlockMatmuls half_block_matmuls(const StepShape& c, const Rates& r) {
  const nn::GPTConfig& m = c.model;
  const double tokens = c.rank_tokens();
  const double rate = charged_gemm_rate(r, c.grid.tp);
  return {tokens * attention_flops_per_token(m, m.seq_len) / c.grid.tp / rate,
          tokens * mlp_flops_per_token(m) / c.grid.tp / rate};
}

// The update's seconds over `params` parameters, 0 when its rate was not measured.
double update_s(double params, const Rates& r) {
  return r.update_params_per_s > 0 ? params / r.update_params_per_s : 0;
}

// A rank's work on its host's cores a step besides its blocks' compute, in core-seconds (host
// slots' units): every byte it moves over the link and its update, at the cores' share of their
// seconds (rates.h: none for a stated link), and its other work, a core's throughout. A
// collective's waits are not counted: with more ranks than cores a waiter spins for microseconds
// and then sleeps (comm/wait.h), leaving its core to the others.
double host_other_work_s(const StageTimes& st, const Rates& r) {
  return st.link_bytes / r.link_bytes_per_s * r.link_core_share +
         (st.update_blocks_s + st.update_rest_s) * r.update_core_share + st.other_s;
}

}  // namespace

bool ranks_share_cores(const Rates& r) { return r.host_ranks > r.host_slots; }

double charged_gemm_rate(const Rates& r, int tp) {
  if (!ranks_share_cores(r)) return rate_in(r.gemm_flops_per_s, tp, "with the ranks together");
  // A core's rate while the host is busy; no faster than a rank alone (the two are measured
  // apart, and the sum over cores may round above it).
  const double core = rate_in(r.gemm_core_flops_per_s, tp, "a core");
  const auto alone = r.gemm_alone_flops_per_s.find(tp);
  return alone == r.gemm_alone_flops_per_s.end() ? core : std::min(core, alone->second);
}

std::string StepBreakdown::str() const {
  return fmt::format(
      "compute {:.4f} + exchange {:.4f} + io {:.4f} + bubble {:.4f} + cores {:.4f} + update "
      "{:.4f} + other {:.4f} = {:.4f} s",
      compute, exposed_exchange, exposed_io, bubble, cores, update, other, total());
}

StageTimes stage_times(const StepShape& c, int s, const Rates& r) {
  const parallel::GridShape& g = c.grid;
  const nn::GPTConfig& m = c.model;
  const int M = c.micro_batches;
  const int rows = c.micro_rows();
  const double tokens = c.rank_tokens();
  const double rate = charged_gemm_rate(r, g.tp);
  const double lat = r.link_latency_s, bw = r.link_bytes_per_s;
  StageTimes st;
  st.chain = parallel::ParallelGPT::chain_layout(m, g, parallel::GridCoord{0, 0, s}, rows,
                                                 m.seq_len / g.cp, M);
  const parallel::ShardLayout layout(m, g, 0, s);
  const int64_t block = layout.block_floats();
  const int blocks = layout.end_layer() - layout.first_layer();
  const int R = g.replicas();  // the data-parallel exchange's group: dp x cp
  const double block_floats = static_cast<double>(block) * blocks;
  const double rest_floats = static_cast<double>(layout.size()) - block_floats;

  // Matmul seconds of each half block's forward (its backward: twice), the head's.
  const auto [attn_s, mlp_s] = half_block_matmuls(c, r);
  const double head_s = layout.has_final() ? tokens * head_flops_per_token(m) / rate : 0;
  const double act_bytes = tokens * m.d_model * sizeof(float);
  // The tensor-parallel exchanges in their dtype (--tp-dtype).
  const double tp_bytes = act_bytes / sizeof(float) * dtype_size(c.tp_dtype);
  const double tp_s = g.tp > 1 ? lat + 2.0 * (g.tp - 1) / g.tp * tp_bytes / bw : 0;
  const double handoff_s = lat + act_bytes / bw;
  // Context parallelism: each attention forward gathers the group's keys and values (an
  // AllGather of the whole sequence's), its backward gathers them again and reduce-scatters
  // their gradient; the kernel waits for each, so all of it counts.
  const KvExchange kv = kv_exchange(c, r);
  st.link_bytes += M * blocks * 3 * kv.bytes;
  // A gather overlaps the blocks computing before it; the stage's first has nothing to hide
  // behind. The gathers run one at a time on the data-parallel thread, so however far ahead they
  // start (--gather-ahead), a block waits for what its gather takes beyond its own compute.
  const GatherTiming gt = c.shard_weights ? gather_timing(c, r) : GatherTiming{};
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
    if (attn) cf += kv.seconds, cb += 2 * kv.seconds;
    if (attn && c.shard_weights) {
      cf += u == 0 ? gather_s : gather_f;
      cb += u == n - 2 ? gather_s : gather_b;
    }
    st.profile.forward_s.push_back(f + cf);
    st.profile.backward_s.push_back(b + cb);
    st.comm_per_micro_s += cf + cb;
    st.backward_micro_s += b + cb;
  }
  // Bytes the rank moves over the link a step besides the kv exchanges: 4 tp all-reduces a block
  // each micro-batch, a hand-off each way at each inner stage boundary, ZeRO-3's gathers.
  if (g.tp > 1) st.link_bytes += M * blocks * 4 * 2.0 * (g.tp - 1) / g.tp * tp_bytes;
  if (s < g.pp - 1) st.link_bytes += M * act_bytes;
  if (s > 0) st.link_bytes += M * act_bytes;
  if (c.shard_weights)
    st.link_bytes += M * blocks * 2 * (R - 1.0) / R * static_cast<double>(block) * sizeof(float);
  st.profile.write_bytes_per_s = r.swap_tier.write_bytes_per_s;
  st.profile.read_bytes_per_s = r.swap_tier.read_bytes_per_s;

  // The data-parallel exchange over the dp x cp replicas: gradients reduce-scattered (in the
  // gradients' dtype), weights all-gathered; a sharded block's weights stay sliced, so its update
  // gathers nothing.
  if (R > 1) {
    const double frac = (R - 1.0) / R, gsize = dtype_size(c.grad_dtype);
    const double block_bytes =
        frac * block_floats * (gsize + (c.shard_weights ? 0 : sizeof(float)));
    const double rest_bytes = frac * rest_floats * (gsize + sizeof(float));
    st.dp_blocks_s = lat + block_bytes / bw;
    st.dp_rest_s = lat + rest_bytes / bw;
    st.link_bytes += block_bytes + rest_bytes;
  }
  // Each replica updates its slice of the parameters (ZeRO-1's moments, ZeRO-3's weights: 1/(dp
  // cp) either way).
  st.update_blocks_s = update_s(block_floats / R, r);
  st.update_rest_s = update_s(rest_floats / R, r);
  if (c.state_streamed) {
    // The store's own prediction (no block resident), over the slices with --shard weights.
    const int64_t piece = (block + R - 1) / R;
    st.state_io_s =
        store_io_s(parallel::BlockStore::predicted_step_traffic(
                       blocks, c.shard_weights ? piece : block, piece, c.shard_weights ? 1 : M),
                   r.state_tier);
  }
  st.other_s = stage_other_s(c, s, r);
  return st;
}

double stage_other_s(const StepShape& c, int s, const Rates& r) {
  const parallel::ShardLayout layout(c.model, c.grid, 0, s);
  double other = 0;
  if (layout.has_embedding()) other += c.micro_batches * c.rank_tokens() * r.embedding_token_s;
  if (r.zero_floats_per_s > 0) {
    const auto [first, end] = layout.blocks_range();
    const bool blocks_apart =
        (c.state_streamed || c.shard_weights) && !(c.shard_weights && c.micro_batches > 1);
    const double floats =
        static_cast<double>(layout.size()) - (blocks_apart ? static_cast<double>(end - first) : 0);
    other += floats / r.zero_floats_per_s;
  }
  return other;
}

StepBreakdown compose(const StepShape& c, const std::vector<StageTimes>& stages,
                      const std::vector<ooc::Prediction>& timelines, const Rates& r) {
  TANDEM_CHECK(stages.size() == static_cast<size_t>(c.grid.pp) && timelines.size() == stages.size(),
               "compose: {} stages and {} timelines for pp {}", stages.size(), timelines.size(),
               c.grid.pp);
  const int M = c.micro_batches;
  StepBreakdown b;
  // The slowest stage sets the pipeline's pace; a stage takes the longer of its timeline and its
  // model state's I/O (the store's transfers run beside compute).
  double slowest = 0, comm = 0, exposed_dp = 0, exposed_update = 0, stage_compute = 0;
  double stage_other = 0;    // the stages' work on the host's cores besides compute, summed
  double busiest_other = 0;  // the most other work of a stage
  for (size_t s = 0; s < stages.size(); ++s) {
    const StageTimes& st = stages[s];
    const ooc::Prediction& p = timelines[s];
    stage_compute += p.compute_s - M * st.comm_per_micro_s;
    stage_other += host_other_work_s(st, r);
    busiest_other = std::max(busiest_other, st.other_s);
    const double stage_s = streamed_step_s(p.step_s, st.state_io_s);
    if (stage_s >= slowest) {
      slowest = stage_s;
      comm = M * st.comm_per_micro_s;
      b.compute = p.compute_s - comm;
      b.exposed_io = (p.step_s - p.compute_s) + (stage_s - p.step_s);
    }
    // The blocks' exchange and update run behind the last micro-batch's backward: the exchange
    // takes the cover first, and what both take beyond it shows; the rest's follow the backward.
    const double cover = c.overlap_exchange ? st.backward_micro_s : 0;
    const double dp = std::max(0.0, st.dp_blocks_s - cover) + st.dp_rest_s;
    const double both = std::max(0.0, st.dp_blocks_s + st.update_blocks_s - cover);
    const double update = both - std::max(0.0, st.dp_blocks_s - cover) + st.update_rest_s;
    if (dp + update > exposed_dp + exposed_update) exposed_dp = dp, exposed_update = update;
    b.link_bytes = std::max(b.link_bytes, st.link_bytes);
  }
  b.bubble = slowest * (c.grid.pp - 1) / M;
  b.exposed_exchange = comm + exposed_dp;
  b.update = exposed_update;
  b.other = busiest_other;  // before the cores' term, whose host bound counts it too
  // Ranks that outnumber their host's cores: the rank's step above is its critical path at a
  // core's rate, as if its waits (the bubble, the exchanges) were its alone; but while it waits
  // the others compute on its core. The host's cores run all its ranks' work (every stage's
  // ranks alike, so the host's ranks times a stage's mean): their compute at a core's rate each,
  // and their exchanges' copies and sums, their updates and other work; the step takes at least
  // that: what it takes beyond the critical path is waiting for the cores.
  if (ranks_share_cores(r)) {
    const double stage_mean = stage_compute / c.grid.pp;
    const double host_work = r.host_ranks * (stage_compute + stage_other) / c.grid.pp;
    // Busy cores but for a pipeline's fill and drain: while the first micro-batch's forward
    // reaches stage k - 1 (and its last backward leaves it) only k stages' ranks can compute,
    // k x (the host's ranks / pp); cores beyond them idle for a micro-batch's forward and
    // backward at a stage.
    const double per_stage = static_cast<double>(r.host_ranks) / c.grid.pp;
    double idle = 0;
    for (int k = 1; k <= c.grid.pp; ++k)
      idle += std::max(0.0, r.host_slots - k * per_stage) * stage_mean / M;
    b.cores = std::max(0.0, (host_work + idle) / r.host_slots - b.total());
  }
  return b;
}

GatherTiming gather_timing(const StepShape& c, const Rates& r) {
  const parallel::GridShape& g = c.grid;
  const auto [attn_s, mlp_s] = half_block_matmuls(c, r);
  const parallel::ShardLayout layout(c.model, g, 0, 0);
  GatherTiming t;
  const double R = g.replicas();
  t.gather_s = r.link_latency_s + (R - 1) / R * static_cast<double>(layout.block_floats()) *
                                      sizeof(float) / r.link_bytes_per_s;
  t.block_forward_s = r.attention.forward * attn_s + r.mlp.forward * mlp_s;
  t.block_backward_s = 2 * (r.attention.backward * attn_s + r.mlp.backward * mlp_s);
  return t;
}

KvExchange kv_exchange(const StepShape& c, const Rates& r) {
  const parallel::GridShape& g = c.grid;
  if (g.cp == 1) return {};
  const nn::GPTConfig& m = c.model;
  // The whole sequence's keys and values of the rank's key/value heads, f32, one micro-batch.
  const double whole = static_cast<double>(c.micro_rows()) * m.seq_len * 2 *
                       (m.n_kv_heads() / g.tp) * m.head_size() * sizeof(float);
  KvExchange kv;
  kv.bytes = (g.cp - 1.0) / g.cp * whole;
  kv.seconds = r.link_latency_s + kv.bytes / r.link_bytes_per_s;
  return kv;
}

int gather_ahead_for(double gather_s, double block_s, int blocks) {
  const int most = std::max(1, blocks - 1);
  if (!(block_s > 0)) return most;
  const double d = std::ceil(gather_s / block_s - 1e-9);
  return static_cast<int>(std::clamp(d, 1.0, static_cast<double>(most)));
}

}  // namespace tandem::perf
