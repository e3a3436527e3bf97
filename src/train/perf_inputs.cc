// A run's configuration in the performance model's terms (perf/): its step's shape and what its
// rates depend on, and those rates from the cache.
#include <algorithm>
#include <thread>

#include "tandem/comm/mpi.h"
#include "tandem/exec/jit.h"
#include "tandem/train/grid_plan.h"

namespace tandem::train {

perf::StepShape step_shape(const TrainConfig& cfg) {
  perf::StepShape s;
  s.model = cfg.model;
  s.grid = cfg.grid;
  s.batch = cfg.batch;
  s.micro_batches = cfg.micro_batch_count();
  s.shard_weights = cfg.optimizer.sharding == parallel::Sharding::Weights;
  s.overlap_exchange = cfg.optimizer.exchange == parallel::GradExchange::Overlap;
  // An undecided auto is counted as f32: the plan runs before the dtypes are decided.
  s.tp_dtype = cfg.tp_dtype.value_or(DType::F32);
  s.grad_dtype = cfg.grad_dtype.value_or(DType::F32);
  s.state_streamed = cfg.model_state.has_value();
  return s;
}

int local_ranks(const TrainConfig& cfg, int ranks) {
  return std::max(1, cfg.backend == comm::Backend::Thread ? ranks : comm::launched_local_ranks());
}

int rank_threads(const TrainConfig& cfg, int ranks) {
  if (cfg.blas_threads > 0) return cfg.blas_threads;
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, hw / local_ranks(cfg, ranks));
}

perf::RateRequest rate_request(const TrainConfig& base, int ranks, std::optional<double> link_gbps,
                               bool tiers) {
  check_plan_ranks(ranks);
  perf::RateRequest q;
  q.model = base.model;
  q.rank_rows = std::max<int64_t>(1, base.batch / ranks);
  q.ranks = ranks;
  q.local_ranks = local_ranks(base, ranks);
  q.threads = rank_threads(base, ranks);
  q.link_gbps = link_gbps;
  q.tiers = tiers;
  q.swap_tier = base.slow_tier;
  q.state_tier = base.model_state;
  return q;
}

Rates measure_rates(const TrainConfig& base, int ranks, std::optional<double> link_gbps,
                    bool tiers) {
  bool cached = false;
  Rates r = perf::cached_rates(rate_request(base, ranks, link_gbps, tiers), exec::jit_cache_dir(),
                               &cached);
  // The report says where they came from: a plan that reads them agrees with the one that
  // measured them.
  if (cached) r.compute_source += "; read from the cache (TANDEM_PERF_REMEASURE=1 measures anew)";
  return r;
}

}  // namespace tandem::train
