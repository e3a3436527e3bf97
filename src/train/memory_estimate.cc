// A run's memory estimated from its config (the shard layout, the out-of-core planner's in-core
// need) and the refusal of a run that cannot fit the memory this machine has for it
// (core/available_memory.h).
#include "tandem/train/memory_estimate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "tandem/comm/mpi.h"
#include "tandem/core/available_memory.h"
#include "tandem/core/bytes.h"
#include "tandem/core/dtype.h"
#include "tandem/core/env.h"
#include "tandem/core/error.h"
#include "tandem/ooc/memory_schedule.h"
#include "tandem/ooc/plan.h"
#include "tandem/parallel/block_store.h"
#include "tandem/parallel/context_parallel.h"
#include "tandem/parallel/model.h"
#include "tandem/parallel/optimizer.h"
#include "tandem/parallel/shard.h"
#include "tandem/parallel/sharded_blocks.h"
#include "tandem/train/grid_plan.h"

namespace tandem::train {
namespace {

constexpr uint64_t kF32 = sizeof(float);

// One rank's need at its grid coordinates (gradients are as many bytes as parameters).
// With --shard weights, `sharded` is the blocks' weights, gradients and moments (their slices and
// the gathered blocks) and the other fields count the rest of the shard.
struct RankNeed {
  uint64_t parameters = 0, optimizer = 0, exchange = 0, activations = 0, staging = 0, tier = 0,
           sharded = 0;
  uint64_t largest_piece = 0;  // elements of the largest optimizer segment

  // Everything, the tier included (the largest rank's, to compare ranks).
  uint64_t total() const {
    return 2 * parameters + optimizer + exchange + activations + staging + tier + sharded;
  }
};

// The need of the rank at tensor-parallel rank `tp`, stage `pp` (its data-parallel and
// context-parallel peers alike: the dp x cp replicas, over which the optimizer slices its state).
RankNeed rank_need(const TrainConfig& cfg, int tp, int pp) {
  const parallel::GridShape& g = cfg.grid;
  const int M = cfg.micro_batch_count();
  const int micro_rows = static_cast<int>(cfg.batch / g.dp / M);
  const int R = g.replicas();
  const bool optimizer_in_file =
      cfg.optimizer.state_tier && cfg.optimizer.state_tier->kind == ooc::TierSpec::Kind::File;
  RankNeed n;
  const parallel::ShardLayout layout(cfg.model, g, tp, pp);
  n.parameters = static_cast<uint64_t>(layout.size()) * kF32;
  const auto [blocks_begin, blocks_end] = layout.blocks_range();
  const int64_t block = layout.block_floats();
  const int blocks = layout.end_layer() - layout.first_layer();
  const uint64_t outside_blocks =
      static_cast<uint64_t>(layout.size() - (blocks_end - blocks_begin)) * kF32;
  const bool sharded = cfg.optimizer.sharding == parallel::Sharding::Weights;
  if (cfg.model_state && sharded) {
    // Each rank's slices (weights and moments) live in the tier, staged through the store's
    // slots; in memory too: the gathered blocks and the gradients.
    const int64_t slice = parallel::ShardedBlocks::slice_floats(block, R);
    n.parameters = outside_blocks;
    n.staging = parallel::BlockStore::staging_bytes(slice, slice, 1);
    if (const int r = cfg.resident_blocks.value_or(0); r > 0)
      n.staging += static_cast<uint64_t>(std::min(r, blocks)) *
                   parallel::BlockStore::resident_block_bytes(slice, slice);
    n.sharded = parallel::ShardedBlocks::slot_bytes(block, blocks, M, cfg.gather_ahead_blocks());
    n.tier = static_cast<uint64_t>(blocks) * 3 * static_cast<uint64_t>(slice) * kF32;
  } else if (cfg.model_state) {
    // The blocks live in the tier; in memory: the embeddings and ln_f, and the store's slots.
    const uint64_t block_bytes = static_cast<uint64_t>(block) * kF32;
    n.parameters = outside_blocks;
    // The moments sliced over the data-parallel ranks (ZeRO-1, the default schedule).
    const int64_t piece = (block + R - 1) / R;
    const uint64_t piece_bytes = static_cast<uint64_t>(piece) * kF32;
    n.staging = parallel::BlockStore::staging_bytes(block, piece, M);
    // --resident-blocks N: those blocks' weights and moments too (the planner's choice fits
    // in --memory-budget, which is counted whole).
    if (const int r = cfg.resident_blocks.value_or(0); r > 0)
      n.staging += static_cast<uint64_t>(std::min(r, blocks)) *
                   parallel::BlockStore::resident_block_bytes(block, piece);
    // Each block's weights and moment piece, and with several micro-batches its gradients.
    n.tier = static_cast<uint64_t>(blocks) * ((M > 1 ? 2 : 1) * block_bytes + 2 * piece_bytes);
  } else if (sharded) {
    // The blocks' state as the sharded model state keeps it; the rest of the shard as usual.
    n.parameters = outside_blocks;
    n.sharded =
        parallel::ShardedBlocks::state_bytes(block, blocks, R, M, cfg.gather_ahead_blocks());
  }
  // In a file tier (--optimizer-state file:DIR) the moments are out of memory but for two
  // staging slots, which are not counted.
  if (!optimizer_in_file) n.optimizer = 2 * ((n.parameters / kF32 + R - 1) / R) * kF32;
  // The optimizer programs' own buffers, as measured on their runners: segments of one size
  // share their programs, whose buffers are the reduce-scatter's 1/dp result (the compiled
  // executor), and two whole-segment intermediates on the plan runner and the reference
  // interpreter; bf16 gradients are rounded into the program's own input; with clipping,
  // every segment's reduced gradient waits for the update.
  std::vector<int64_t> sizes;
  for (const parallel::SegmentBounds& s : parallel::optimizer_segments(
           layout, cfg.optimizer, cfg.model_state.has_value() || sharded)) {
    const int64_t len = s.end - s.begin;
    if (cfg.optimizer.clip_grad_norm) n.exchange += (len + R - 1) / R * kF32;
    if (std::find(sizes.begin(), sizes.end(), len) != sizes.end()) continue;
    sizes.push_back(len);
    const uint64_t l = static_cast<uint64_t>(len);
    n.exchange += (l + R - 1) / R * kF32;
    if (cfg.executor != exec::RunnerKind::Compiled) n.exchange += 2 * l * kF32;
    // An undecided auto: maybe bf16's.
    if (const DType d = cfg.grad_dtype.value_or(DType::BF16); d != DType::F32)
      n.exchange += l * dtype_size(d);
    n.largest_piece = std::max(n.largest_piece, l);
  }
  // With context parallelism a rank runs seq_len / cp tokens of each row, and its attention
  // holds the whole sequence's keys and values for the exchanges (one set for every layer).
  const int tokens = cfg.model.seq_len / g.cp;
  const nn::ChainLayout chain = parallel::ParallelGPT::chain_layout(
      cfg.model, g, parallel::GridCoord{0, tp, pp}, micro_rows, tokens, M);
  n.activations = ooc::MemorySchedule(chain, ooc::keep_all(chain.units)).peak_bytes();
  if (g.cp > 1) {
    const parallel::ContextSplit split(cfg.model.seq_len, g.cp, 0);
    const int kv_heads = cfg.model.n_kv_heads() / g.tp, head = cfg.model.head_size();
    const parallel::ContextOrder order = parallel::context_order_from_env();
    n.activations += parallel::ContextParallelAttention::buffer_bytes(
        split, micro_rows, cfg.model.n_heads / g.tp, kv_heads, head, {}, order);
    // The plan runner keeps two whole-sequence intermediates of the gather and the reduction (as
    // measured; counted for the interpreter too); the compiled executor's work in the attention's
    // buffers, and so the ring's shifts on every executor.
    if (cfg.executor != exec::RunnerKind::Compiled && order != parallel::ContextOrder::Ring)
      n.activations +=
          2 * static_cast<uint64_t>(micro_rows) * cfg.model.seq_len * 2 * kv_heads * head * kF32;
  }
  return n;
}

// Checkpoints move one whole tensor at a time through every rank, and the optimizer's moments
// one segment (m and v) at a time: the bytes of those buffers on a rank (0 without checkpoints).
uint64_t checkpoint_bytes(const TrainConfig& cfg, const RankNeed& n) {
  if (cfg.save_dir.empty() && cfg.resume_dir.empty() && cfg.init_from.empty()) return 0;
  int64_t largest_tensor = 0;
  for (const nn::ParamSpec& s : nn::gpt_parameter_specs(cfg.model))
    largest_tensor = std::max(largest_tensor, s.numel());
  return (static_cast<uint64_t>(largest_tensor) + 2 * n.largest_piece) * kF32;
}

// What --memory-budget holds beside the activations: the store's slots, and with --model-state
// the embeddings and ln_f (weights, gradients, moments) and a sharded state's gather and gradient
// slots, as the trainer reserves them.
uint64_t budget_holds(const TrainConfig& cfg, const RankNeed& n) {
  return cfg.model_state ? n.staging + n.sharded + 2 * n.parameters + n.optimizer : n.staging;
}

}  // namespace

std::string MemoryEstimate::str() const {
  std::vector<std::string> parts = {
      "parameters " + human_bytes(parameters), "gradients " + human_bytes(gradients),
      "optimizer state " + human_bytes(optimizer), "exchange buffers " + human_bytes(exchange),
      (activations_budgeted ? "activations (--memory-budget) " : "activations ") +
          human_bytes(activations)};
  if (sharded_blocks > 0)
    parts.push_back("sharded blocks (--shard weights) " + human_bytes(sharded_blocks));
  if (model_state_slots > 0) parts.push_back("model-state slots " + human_bytes(model_state_slots));
  if (model_state_host > 0)
    parts.push_back("model-state tier (host) " + human_bytes(model_state_host));
  if (checkpoint > 0) parts.push_back("checkpoint buffers " + human_bytes(checkpoint));
  return fmt::format("{} on this machine ({} rank{}: {})", human_bytes(total()), ranks,
                     ranks == 1 ? "" : "s", fmt::join(parts, ", "));
}

MemoryEstimate estimate_memory(const TrainConfig& cfg) {
  const parallel::GridShape& g = cfg.grid;
  // Each (tp rank, stage) pair's need; dp ranks repeat them.
  std::map<std::pair<int, int>, RankNeed> needs;
  for (int pp = 0; pp < g.pp; ++pp)
    for (int tp = 0; tp < g.tp; ++tp) needs[{tp, pp}] = rank_need(cfg, tp, pp);

  MemoryEstimate e;
  e.activations_budgeted = !cfg.memory_budget.empty();
  auto add = [&](const RankNeed& n, uint64_t times) {
    e.parameters += times * n.parameters;
    e.gradients += times * n.parameters;
    e.optimizer += times * n.optimizer;
    e.exchange += times * n.exchange;
    e.model_state_slots += times * n.staging;
    e.sharded_blocks += times * n.sharded;
    const bool host = cfg.model_state && cfg.model_state->kind == ooc::TierSpec::Kind::Host;
    (host ? e.model_state_host : e.model_state_disk) += times * n.tier;
    e.activations_in_core += times * n.activations;
    if (e.activations_budgeted) {
      // With --model-state the budget holds the model state in memory too: the store's slots and
      // the embeddings and ln_f (weights, gradients, moments).
      const uint64_t budget = parse_budget(cfg.memory_budget, n.activations);
      const uint64_t held = budget_holds(cfg, n);
      e.activations += times * (budget > held ? budget - held : 0);
    } else {
      e.activations += times * n.activations;
    }
    e.checkpoint += times * checkpoint_bytes(cfg, n);
  };
  if (cfg.backend == comm::Backend::Thread) {
    e.ranks = g.size();
    for (const auto& [where, n] : needs) add(n, static_cast<uint64_t>(g.replicas()));
  } else {
    e.ranks = comm::launched_local_ranks();
    const auto largest =
        std::max_element(needs.begin(), needs.end(), [](const auto& a, const auto& b) {
          const RankNeed &x = a.second, &y = b.second;
          return x.total() < y.total();
        });
    add(largest->second, static_cast<uint64_t>(e.ranks));
  }
  return e;
}

RankMemory rank_memory(const TrainConfig& cfg, int tp_rank, int stage) {
  const RankNeed n = rank_need(cfg, tp_rank, stage);
  const bool host = cfg.model_state && cfg.model_state->kind == ooc::TierSpec::Kind::Host;
  RankMemory r;
  r.fixed = 2 * n.parameters + n.optimizer + n.exchange + n.staging + n.sharded +
            (host ? n.tier : 0) + checkpoint_bytes(cfg, n);
  r.activations = n.activations;
  r.budget_holds = budget_holds(cfg, n);
  return r;
}

namespace {

// Under an address-space limit (ulimit -v) the threads' reservations count too (core's
// thread_reservations): OpenBLAS, left without room for its buffer, would spin at the first
// matmul instead of failing. One process's share: its ranks' data and its threads.
void check_address_space(const TrainConfig& cfg, const MemoryEstimate& e) {
  if (env_str("TANDEM_MEMORY_LIMIT", "") == "off") return;
  const std::optional<AddressSpace> as = address_space();
  if (!as) return;
  const int ranks = cfg.backend == comm::Backend::Thread ? cfg.grid.size() : 1;
  const uint64_t data =
      e.total() / static_cast<uint64_t>(std::max(1, e.ranks)) * static_cast<uint64_t>(ranks);
  // Each rank: its communication thread, and two transfer streams for each tier it uses.
  const int tiers = (cfg.memory_budget.empty() ? 0 : 1) + (cfg.model_state ? 1 : 0);
  const ThreadReservations threads =
      thread_reservations(ranks, blas_threads_for(cfg), ranks * (1 + 2 * tiers));
  if (data + threads.total() <= as->room()) return;
  user_error(
      "this run needs about {} of address space ({} of data, {} reserved: {}), but the "
      "address-space limit (ulimit -v) of {} leaves {} ({} mapped); OpenBLAS would hang "
      "without room for its buffers. Raise it (ulimit -v {} or more), give fewer BLAS threads "
      "(--threads 1), or bound memory with a cgroup (systemd-run --scope -p MemoryMax=SIZE)",
      human_bytes(data + threads.total()), human_bytes(data), human_bytes(threads.total()),
      threads.str(), human_bytes(as->limit), human_bytes(as->room()), human_bytes(as->mapped),
      (as->mapped + data + threads.total() + 1023) / 1024);
}

}  // namespace

int blas_threads_for(const TrainConfig& cfg) { return rank_threads(cfg, cfg.grid.size()); }

void check_memory(const TrainConfig& cfg) {
  const MemoryEstimate e = estimate_memory(cfg);
  // The data against the memory first (the room under ulimit -v among it), then the threads'
  // reservations against the address space.
  const std::optional<AvailableMemory> avail = available_memory();
  if (!avail || e.total() <= avail->bytes) return check_address_space(cfg, e);
  std::vector<std::string> advice;
  std::string note;
  const uint64_t fixed = e.total() - e.activations;
  if (fixed >= avail->bytes) {
    note = fmt::format(
        "; its parameters, gradients, optimizer state and exchange buffers alone "
        "need {}, which no --memory-budget changes",
        human_bytes(fixed));
    if (!cfg.model_state)
      advice.push_back(
          "keep the model's blocks (weights, gradients, optimizer state) in a file "
          "(--model-state file:DIR, docs/out-of-core.md)");
  } else if (!e.activations_budgeted)
    advice.push_back(fmt::format(
        "train out-of-core with --memory-budget (e.g. --memory-budget 25% keeps the saved "
        "activations in a quarter of their {}, the rest swapped or recomputed: "
        "docs/out-of-core.md)",
        human_bytes(e.activations_in_core)));
  else
    advice.push_back("give a smaller --memory-budget");
  advice.push_back(
      "use a smaller model (--layers, --d-model), batch (--batch) or sequence (--seq-len)");
  if (cfg.backend == comm::Backend::Thread)
    advice.push_back("spread the ranks over machines (--backend mpi under mpirun)");
  user_error(
      "this run needs about {}, but {} is available ({}){}. To fit, {}. "
      "TANDEM_MEMORY_LIMIT=SIZE states the memory available instead of what this machine "
      "reports (off: no check)",
      e.str(), human_bytes(avail->bytes), avail->source, note, fmt::join(advice, "; or "));
}

void check_eval_memory(const nn::GPTConfig& model, int rows, int seq_len) {
  const std::optional<AvailableMemory> avail = available_memory();
  if (!avail) return;
  nn::GPTConfig m = model;
  m.seq_len = seq_len;
  // The forward keeps every layer's buffers, as a training step that keeps them all does.
  const nn::ChainLayout chain = parallel::ParallelGPT::chain_layout(
      m, parallel::GridShape{}, parallel::GridCoord{}, rows, seq_len, 1);
  const uint64_t activations = ooc::MemorySchedule(chain, ooc::keep_all(chain.units)).peak_bytes();
  const uint64_t weights = static_cast<uint64_t>(nn::gpt_num_parameters(m)) * kF32;
  if (weights + activations <= avail->bytes) return;
  user_error(
      "this evaluation needs about {} (weights {}, activations {} for {} windows of {} tokens at "
      "a time), but {} is available ({}). To fit, give a smaller --batch (or --seq-len). "
      "TANDEM_MEMORY_LIMIT=SIZE states the memory available instead of what this machine "
      "reports (off: no check)",
      human_bytes(weights + activations), human_bytes(weights), human_bytes(activations), rows,
      seq_len, human_bytes(avail->bytes), avail->source);
}

std::string memory_line(const TrainConfig& cfg) {
  const MemoryEstimate e = estimate_memory(cfg);
  const std::optional<AvailableMemory> avail = available_memory();
  return fmt::format(
      "  memory estimate: {}; {}\n", e.str(),
      avail ? fmt::format("{} available ({})", human_bytes(avail->bytes), avail->source)
            : std::string("the available memory is unknown (not checked)"));
}

constexpr int kMostLayers = 1024;

std::string largest_model_line(const TrainConfig& cfg) {
  const std::optional<AvailableMemory> avail = available_memory();
  if (!avail) return "";
  std::optional<uint64_t> disk;
  if (cfg.model_state && cfg.model_state->kind == ooc::TierSpec::Kind::File) {
    struct statvfs fs {};
    if (::statvfs(cfg.model_state->dir.c_str(), &fs) == 0)
      disk = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  }
  // Layers come in multiples of the pipeline's stages; the need grows with them.
  const int stages = cfg.grid.pp;
  // A --stage-layers split is this model's: the larger ones are split evenly.
  auto need = [&](int layers) {
    TrainConfig c = cfg;
    c.model.n_layers = layers;
    c.grid.stage_layers.clear();
    return estimate_memory(c);
  };
  auto fits = [&](int layers) {
    const MemoryEstimate e = need(layers);
    return e.total() <= avail->bytes && (!disk || e.model_state_disk <= *disk);
  };
  if (!fits(stages)) return "";
  // Searched up to 1024 layers (GPT-3 has 96): the estimate's cost grows with the layers.
  const int most = std::max(1, kMostLayers / stages);
  int lo = 1, hi = 2;  // in stages: lo fits, hi does not (or is past the search)
  while (hi <= most && fits(hi * stages)) lo = hi, hi *= 2;
  if (hi > most) hi = most + 1;
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    (fits(mid * stages) ? lo : hi) = mid;
  }
  TrainConfig c = cfg;
  c.model.n_layers = lo * stages;
  c.grid.stage_layers.clear();
  const MemoryEstimate next = need((lo + 1) * stages);
  const bool by_disk = disk && next.model_state_disk > *disk && next.total() <= avail->bytes;
  return fmt::format(
      "largest model of this shape (d_model {}, {} heads, seq {}, {} tokens a step, this grid and "
      "these flags) this machine trains: {}{} layers, {:.2f} B parameters; bounded by {}\n",
      cfg.model.d_model, cfg.model.n_heads, cfg.model.seq_len, cfg.batch * cfg.model.seq_len,
      lo == most ? "at least " : "", c.model.n_layers,
      static_cast<double>(nn::gpt_num_parameters(c.model)) / 1e9,
      lo == most ? fmt::format("the search, which stops at {} layers", kMostLayers)
      : by_disk
          ? fmt::format("the disk of {} ({} free for the model state's tier)", cfg.model_state->dir,
                        human_bytes(*disk))
          : fmt::format("memory ({} available, {})", human_bytes(avail->bytes), avail->source));
}

}  // namespace tandem::train
