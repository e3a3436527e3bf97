// What the performance model works from: rates measured on this machine once (GEMM at the
// model's shapes on a rank's threads, one block's other work, a link, the tiers, the optimizer's
// update, the step's work outside them) and cached per machine under tandem's cache folder, keyed
// by what they depend on.
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "tandem/nn/gpt.h"
#include "tandem/ooc/slow_tier.h"

namespace tandem::perf {

// A unit's measured time over what its matmuls take at the GEMM rate: what the rest of its
// operations (softmax, LayerNorm, GELU, the loss, copies) and the matmuls' smaller shapes add.
struct UnitFactor {
  double forward = 1, backward = 1;
};

struct Rates {
  // Per tensor-parallel degree (the shards' width): what a rank gets with every rank on its host
  // computing at once (cores and memory bandwidth shared), the rate the step model uses; and a
  // rank alone (the UnitFactors' reference, and the report's).
  std::map<int, double> gemm_flops_per_s;
  std::map<int, double> gemm_alone_flops_per_s;
  // The host's ranks and cores, for ranks that outnumber them: `host_ranks` share the host's
  // cores, `host_slots` of them compute at once on cores of their own (the hardware threads over
  // a rank's BLAS threads); and per tp degree the rate a rank computes at while the host's cores
  // are all busy (the ranks' summed rate in the measurement with all computing at once, over the
  // cores they shared: min(ranks, slots)). With more ranks than slots the step model charges a
  // rank's compute at that rate and the host's together at slots times it (perf/step_model.h).
  int host_ranks = 1;
  double host_slots = 1;
  std::map<int, double> gemm_core_flops_per_s;
  // For ranks that outnumber the cores: the host's cores (core-seconds, in host_slots' units) a
  // second of a rank's link time, and of its update, takes. The link measured in-process is its
  // threads copying and summing at once on the host's cores, each on a share of one (as the
  // in-process and MPI shared-memory transports move bytes); a stated link (a wire between
  // hosts) takes none. The update is one thread's loop, its rate measured shared likewise.
  double link_core_share = 0;
  double update_core_share = 0;
  UnitFactor attention, mlp, head;  // per half block and for ln_f + the LM head + loss
  double link_bytes_per_s = 0;      // a ring collective's bus bandwidth; a send's rate
  double link_latency_s = 0;        // per collective or hand-off
  ooc::TierBandwidth swap_tier;     // --slow-tier's: swapped activations
  ooc::TierBandwidth state_tier;    // --model-state's, when it names one
  // The optimizer's update: parameters a second one rank updates (AdamW's loop over weights,
  // gradients and both moments); 0 when not measured (the update then counts nothing).
  double update_params_per_s = 0;
  // The step's other work, outside the units' forward and backward (the head is in the last
  // unit's), the exchanges and the update (perf/step_model.h's stage_other_s says what it
  // covers): seconds a token of the embedding's forward and backward takes (the first stage's),
  // and gradients one rank zeroes a second (every rank's, before its step); 0 when not measured.
  double embedding_token_s = 0;
  double zero_floats_per_s = 0;
  std::string compute_source, link_source;  // how each was found, for the report
  std::string update_source, other_source;

  nlohmann::json to_json() const;
  // A UserError naming what is missing or not a positive number.
  static Rates from_json(const nlohmann::json& j);
};

// What the rates depend on, and so what their cache is keyed by.
struct RateRequest {
  nn::GPTConfig model;
  int64_t rank_rows = 1;  // sequences of the global batch a rank computes a step
  int ranks = 1;          // the run's ranks; tensor-parallel degrees are its divisors
  int local_ranks = 1;    // ranks computing at once on this machine (they share its cores)
  int threads = 1;        // BLAS threads a rank
  std::optional<double> link_gbps;  // stated (a multi-host run's link), else measured in-process
  bool tiers = true;                // measure the tiers (and the update)
  ooc::TierSpec swap_tier;
  std::optional<ooc::TierSpec> state_tier;

  // The cache's key: every field above and the machine's hardware threads, as JSON text.
  std::string key() const;
};

// Measures the rates on this machine in a few seconds: a GEMM of each tp degree's MLP shape at
// the request's threads, alone and with the local ranks computing at once (threads started
// together, each with its own operands, until one deadline: the slowest's rate, and their summed
// rate over the cores they shared, a core's; beyond 32 ranks, those 32's rate shared by all;
// windows alone and together alternate, and the medians of the rate alone and of the pairs'
// ratios are kept, so that the machine's drift does not read as contention), one block's halves
// and the head forward and backward at tp 1 for the UnitFactors (each run timed after one GEMM
// call, the median of the pairs' ratios), the embedding's
// forward and backward and the gradients' zeroing at the same tokens and model, an in-process
// all-reduce over min(ranks, 8) threads (unless the link is stated), and with `tiers` the tiers'
// bandwidth and the update's rate.
Rates measure_rates(const RateRequest& request);

// The rates cached for `request` under <cache_dir>/perf/ (private as core/private_cache.h says),
// else measured and stored there. A damaged file, or one holding another key, is measured again
// and replaced; TANDEM_PERF_REMEASURE=1 measures anew whatever is cached. `from_cache` says which.
// A cache that cannot be written is not an error: the rates measured are returned. `measure` is
// measure_rates but in tests.
using MeasureRates = std::function<Rates(const RateRequest&)>;
Rates cached_rates(const RateRequest& request, const std::string& cache_dir,
                   bool* from_cache = nullptr, const MeasureRates& measure = measure_rates);

// The cache's two halves, for cached_rates and its tests: the file's rates when it holds `key`
// (nullopt when absent, damaged or another key's), and writing them (0600, renamed into place).
std::optional<Rates> load_cached_rates(const std::string& cache_dir, const std::string& key);
void store_cached_rates(const std::string& cache_dir, const std::string& key, const Rates& rates);

}  // namespace tandem::perf
