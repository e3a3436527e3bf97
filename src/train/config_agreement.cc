// Every rank's training settings gathered over the world and compared, a disagreement named flag
// by flag.
#include "config_agreement.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "tandem/comm/agree.h"
#include "tandem/core/tensor.h"

namespace tandem::train::detail {
namespace {

template <typename T>
std::string text(const std::optional<T>& v) {
  return v ? fmt::format("{}", *v) : std::string("unset");
}

// "rank 3", "ranks 0 and 2", "ranks 0-3 and 7": runs of consecutive ranks shortened.
std::string ranks_text(const std::vector<int>& ranks) {
  std::vector<std::string> runs;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    runs.push_back(j >= i + 2   ? fmt::format("{}-{}", ranks[i], ranks[j])
                   : j == i + 1 ? fmt::format("{}, {}", ranks[i], ranks[j])
                                : fmt::format("{}", ranks[i]));
    i = j + 1;
  }
  std::string list = runs.back();
  if (runs.size() > 1)
    list = fmt::format("{} and {}", fmt::join(runs.begin(), runs.end() - 1, ", "), runs.back());
  return (ranks.size() == 1 ? "rank " : "ranks ") + list;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> agreeing_settings(const TrainConfig& c,
                                                                   const data::Corpus& corpus) {
  const parallel::OptimizerConfig& o = c.optimizer;
  return {
      {"the command (train or plan)", c.plan_only ? "plan" : "train"},
      {"--layers", fmt::format("{}", c.model.n_layers)},
      {"--heads", fmt::format("{}", c.model.n_heads)},
      {"--d-model", fmt::format("{}", c.model.d_model)},
      {"--seq-len", fmt::format("{}", c.model.seq_len)},
      {"the model's positions", fmt::format("{}", c.model.max_positions)},
      {"the vocabulary", fmt::format("{}", c.model.vocab_size)},
      {"--dropout", fmt::format("{}", c.model.dropout)},
      {"--arch", std::string(nn::arch_name(c.model.arch))},
      {"--kv-heads", fmt::format("{}", c.model.n_kv_heads())},
      {"--ffn", fmt::format("{}", c.model.mlp_width())},
      {"--norm-eps", fmt::format("{}", c.model.norm_eps)},
      {"--rope-theta", fmt::format("{}", c.model.rope_theta)},
      {"--rope-scaling", c.model.rope_scaling.type == nn::RopeType::Llama3
                             ? fmt::format("llama3:{},{},{},{}", c.model.rope_scaling.factor,
                                           c.model.rope_scaling.low_freq_factor,
                                           c.model.rope_scaling.high_freq_factor,
                                           c.model.rope_scaling.original_max_position_embeddings)
                             : std::string("none")},
      {"--qkv-bias", c.model.qkv_bias ? "true" : "false"},
      {"--tie-embeddings", c.model.tie_embeddings ? "true" : "false"},
      // The type chosen, not the flag: --precision auto may choose differently on another CPU.
      {"--precision", c.model.matmul == DType::BF16 ? "bf16" : "fp32"},
      {"--batch", fmt::format("{}", c.batch)},
      {"--steps", fmt::format("{}", c.steps)},
      {"--lr", fmt::format("{}", c.lr)},
      {"--warmup", fmt::format("{}", c.warmup)},
      {"--min-lr-ratio", fmt::format("{}", c.min_lr_ratio)},
      {"--seed", fmt::format("{}", c.seed)},
      {"--optimizer", std::string(parallel::optimizer_name(o.kind))},
      {"--grad-dtype",
       c.grad_dtype_auto ? std::string("auto") : std::string(dtype_name(o.grad_dtype))},
      {"--tp-dtype", c.tp_dtype_auto ? std::string("auto") : std::string(dtype_name(c.tp_dtype))},
      {"--beta1", fmt::format("{}", o.beta1)},
      {"--beta2", fmt::format("{}", o.beta2)},
      {"--eps", fmt::format("{}", o.eps)},
      {"--weight-decay", fmt::format("{}", o.weight_decay)},
      {"--grad-exchange", std::string(parallel::grad_exchange_name(o.exchange))},
      {"--bucket-mb", text(o.bucket_mb)},
      {"--optimizer-state", o.state_tier ? o.state_tier->str() : "memory"},
      {"--clip-grad-norm", text(o.clip_grad_norm)},
      {"--shard", std::string(parallel::sharding_name(o.sharding))},
      {"--gather-ahead", fmt::format("{}", c.gather_ahead)},
      {"--dp", fmt::format("{}", c.grid.dp)},
      {"--tp", fmt::format("{}", c.grid.tp)},
      {"--pp", fmt::format("{}", c.grid.pp)},
      {"--micro-batches", fmt::format("{}", c.micro_batch_count())},
      {"--backend", std::string(comm::backend_name(c.backend))},
      {"--executor", std::string(exec::runner_kind_name(c.executor))},
      {"--tune", c.tune ? "on" : "off"},
      // The data by what it holds (its path may differ from host to host).
      {"--data",
       fmt::format("{} tokens, fingerprint {}", corpus.train.size() + corpus.validation.size(),
                   corpus.fingerprint_hex())},
      {"--val-fraction", fmt::format("{}", c.validation_fraction)},
      {"--eval-every", fmt::format("{}", c.eval_every)},
      {"--eval-batches", fmt::format("{}", c.eval_batches)},
      {"--save", c.save_dir.empty() ? "none" : c.save_dir},
      {"--save-every", fmt::format("{}", c.save_every)},
      {"--keep-checkpoints", fmt::format("{}", c.keep_checkpoints)},
      {"--resume", c.resume_dir.empty() ? "none" : c.resume_dir},
      {"--init-from", c.init_from.empty() ? "none" : c.init_from},
      {"--metrics", c.metrics_path.empty() ? "none" : c.metrics_path},
      {"--trace", c.trace_path.empty() ? "none" : c.trace_path},
      {"--comm-timeout", fmt::format("{}", comm::comm_timeout_s())},
      {"--memory-budget", c.memory_budget.empty() ? "none" : c.memory_budget},
      {"--slow-tier", c.slow_tier.str()},
      {"--model-state", c.model_state ? c.model_state->str() : "memory"},
      {"--resident-blocks", c.resident_blocks < 0 ? "auto" : std::to_string(c.resident_blocks)},
      {"--ooc-plan", c.ooc_plan.empty() ? "the planner's" : c.ooc_plan},
  };
}

void check_ranks_agree(comm::Communicator& world, const TrainConfig& config,
                       const data::Corpus& corpus) {
  const auto mine = agreeing_settings(config, corpus);
  nlohmann::json values = nlohmann::json::array();
  for (const auto& [flag, value] : mine) values.push_back(value);
  const std::vector<std::string> texts = comm::all_gather_strings(world, values.dump());
  std::vector<std::vector<std::string>> all;
  for (const std::string& t : texts) all.push_back(nlohmann::json::parse(t));
  std::vector<std::string> disagreements;
  for (size_t k = 0; k < mine.size(); ++k) {
    // The ranks giving each value, in the order of their first rank.
    std::vector<std::pair<std::string, std::vector<int>>> groups;
    for (int r = 0; r < static_cast<int>(all.size()); ++r) {
      const std::string& v = all[r].at(k);
      auto g =
          std::find_if(groups.begin(), groups.end(), [&](const auto& x) { return x.first == v; });
      if (g == groups.end())
        groups.push_back({v, {r}});
      else
        g->second.push_back(r);
    }
    if (groups.size() == 1) continue;
    std::vector<std::string> parts;
    for (const auto& [value, ranks] : groups)
      parts.push_back(
          fmt::format("{} give{} {}", ranks_text(ranks), ranks.size() == 1 ? "s" : "", value));
    disagreements.push_back(fmt::format("{}: {}", mine[k].first, fmt::join(parts, ", ")));
  }
  if (disagreements.empty()) return;
  throw comm::CollectiveError(fmt::format(
      "the ranks disagree on {}; every rank of a job must be started with the same flags",
      fmt::join(disagreements, "; and on ")));
}

}  // namespace tandem::train::detail
