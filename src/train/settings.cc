// The run's settings described once (the tables below), and what is derived from them: the
// ranks' agreement, compared flag by flag with a disagreement named; meta.json's parts; flags.
#include "settings.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <optional>

#include "tandem/comm/agree.h"
#include "tandem/core/error.h"

namespace tandem::train::detail {
namespace {

// ------------------------------------------------------------------------ the entries' helpers

template <typename P>
struct MemberOf;
template <typename S, typename T>
struct MemberOf<T S::*> {
  using Struct = S;
};
template <auto M>
using Owner = typename MemberOf<decltype(M)>::Struct;

template <typename T>
constexpr bool kOptional = false;
template <typename T>
constexpr bool kOptional<std::optional<T>> = true;
template <typename T>
constexpr bool kAuto = false;
template <typename T>
constexpr bool kAuto<Auto<T>> = true;

// A value as the ranks compare it: as fmt prints it, a dtype by its name, an empty text "none",
// an unset optional "unset", an undecided auto "auto".
template <typename T>
std::string value_text(const T& v) {
  if constexpr (std::is_same_v<T, DType>)
    return std::string(dtype_name(v));
  else if constexpr (std::is_same_v<T, std::string>)
    return v.empty() ? std::string("none") : v;
  else if constexpr (kOptional<T>)
    return v ? value_text(*v) : std::string("unset");
  else if constexpr (kAuto<T>)
    return v.known() ? value_text(v.value()) : std::string("auto");
  else
    return fmt::format("{}", v);
}
template <auto M, typename... Context>
std::string shown(const Owner<M>& s, const Context&...) {
  return value_text(s.*M);
}
// Member M as meta.json keeps it (an unset optional left out).
template <auto M>
nlohmann::json member_json(const Owner<M>& s) {
  const auto& v = s.*M;
  if constexpr (kOptional<std::decay_t<decltype(v)>>)
    return v ? nlohmann::json(*v) : nlohmann::json();
  else if constexpr (kAuto<std::decay_t<decltype(v)>>)
    return v.known() ? nlohmann::json(v.value()) : nlohmann::json();
  else
    return v;
}
// Member M's state, an Auto<T>'s.
template <auto M>
AutoState auto_state(const Owner<M>& s) {
  return {.undecided = (s.*M).is_auto() && !(s.*M).known(), .reason = (s.*M).reason()};
}
// Member M as meta.json keeps it for a Llama model only (GPT-2's config.json has no such key).
template <auto M>
nlohmann::json llama_json(const nn::GPTConfig& c) {
  return c.llama() ? nlohmann::json(c.*M) : nlohmann::json();
}

template <typename S>
struct SettingOf;
template <>
struct SettingOf<nn::GPTConfig> {
  using type = ModelSetting;
};
template <>
struct SettingOf<parallel::OptimizerConfig> {
  using type = OptimizerSetting;
};
template <>
struct SettingOf<TrainConfig> {
  using type = RunSetting;
};

// Member M, which the ranks must agree on, compared as shown() prints it, and kept in meta.json's
// `part` (unless None) under the field's own name.
template <auto M>
typename SettingOf<Owner<M>>::type agreed(std::string_view field, std::string_view name,
                                          Meta part = Meta::None) {
  typename SettingOf<Owner<M>>::type s{.field = field, .name = name, .text = shown<M>};
  if constexpr (kAuto<std::decay_t<decltype(std::declval<Owner<M>>().*M)>>)
    s.auto_state = auto_state<M>;
  if (part != Meta::None) {
    s.meta = part;
    s.key = field;
    s.json = member_json<M>;
  }
  return s;
}

// A setting a start-up line of report.cc's own states.
template <typename S>
S own_line(S s) {
  s.startup = Startup::OwnLine;
  return s;
}

// ------------------------------------------------------------------------------------ tables

using nn::GPTConfig;
using parallel::OptimizerConfig;

const ModelSetting kModel[] = {
    agreed<&GPTConfig::vocab_size>("vocab_size", "the vocabulary", Meta::ModelConfig),
    own_line(agreed<&GPTConfig::n_layers>("n_layers", "--layers", Meta::ModelConfig)),
    own_line(agreed<&GPTConfig::n_heads>("n_heads", "--heads", Meta::ModelConfig)),
    own_line(agreed<&GPTConfig::d_model>("d_model", "--d-model", Meta::ModelConfig)),
    own_line(agreed<&GPTConfig::seq_len>("seq_len", "--seq-len", Meta::ModelConfig)),
    own_line(agreed<&GPTConfig::max_positions>("max_positions", "the model's positions",
                                               Meta::ModelConfig)),
    agreed<&GPTConfig::dropout>("dropout", "--dropout", Meta::ModelConfig),
    // The type chosen, not the flag: --precision auto may choose differently on another CPU.
    // Not a property of the weights, so checkpoints do not record it.
    {.field = "matmul",
     .name = "--precision",
     .text =
         [](const GPTConfig& c) { return std::string(c.matmul == DType::BF16 ? "bf16" : "fp32"); },
     .startup = Startup::OwnLine},
    {.field = "arch",
     .name = "--arch",
     .text = [](const GPTConfig& c) { return std::string(nn::arch_name(c.arch)); },
     .meta = Meta::ModelConfig,
     .key = "arch",
     .json =
         [](const GPTConfig& c) {
           return c.llama() ? nlohmann::json(nn::arch_name(c.arch)) : nlohmann::json();
         },
     .startup = Startup::OwnLine},
    {.field = "kv_heads",
     .name = "--kv-heads",
     .text = [](const GPTConfig& c) { return fmt::format("{}", c.n_kv_heads()); },
     .meta = Meta::ModelConfig,
     .key = "kv_heads",
     .json =
         [](const GPTConfig& c) {
           return c.llama() ? nlohmann::json(c.n_kv_heads()) : nlohmann::json();
         },
     .startup = Startup::OwnLine},
    {.field = "ffn",
     .name = "--ffn",
     .text = [](const GPTConfig& c) { return fmt::format("{}", c.mlp_width()); },
     .meta = Meta::ModelConfig,
     .key = "ffn",
     .json =
         [](const GPTConfig& c) {
           return c.llama() ? nlohmann::json(c.mlp_width()) : nlohmann::json();
         },
     .startup = Startup::OwnLine},
    {.field = "norm_eps",
     .name = "--norm-eps",
     .text = shown<&GPTConfig::norm_eps>,
     .meta = Meta::ModelConfig,
     .key = "norm_eps",
     .json = llama_json<&GPTConfig::norm_eps>},
    {.field = "rope_theta",
     .name = "--rope-theta",
     .text = shown<&GPTConfig::rope_theta>,
     .meta = Meta::ModelConfig,
     .key = "rope_theta",
     .json = llama_json<&GPTConfig::rope_theta>},
    {.field = "rope_scaling",
     .name = "--rope-scaling",
     .text =
         [](const GPTConfig& c) {
           const nn::RopeScaling& r = c.rope_scaling;
           return r.type == nn::RopeType::Llama3
                      ? fmt::format("llama3:{},{},{},{}", r.factor, r.low_freq_factor,
                                    r.high_freq_factor, r.original_max_position_embeddings)
                      : std::string("none");
         },
     .meta = Meta::ModelConfig,
     .key = "rope_scaling",
     .json =
         [](const GPTConfig& c) {
           const nn::RopeScaling& r = c.rope_scaling;
           if (!c.llama() || r.type != nn::RopeType::Llama3) return nlohmann::json();
           return nlohmann::json{
               {"rope_type", "llama3"},
               {"factor", r.factor},
               {"low_freq_factor", r.low_freq_factor},
               {"high_freq_factor", r.high_freq_factor},
               {"original_max_position_embeddings", r.original_max_position_embeddings}};
         }},
    {.field = "qkv_bias",
     .name = "--qkv-bias",
     .text = shown<&GPTConfig::qkv_bias>,
     .meta = Meta::ModelConfig,
     .key = "qkv_bias",
     .json = llama_json<&GPTConfig::qkv_bias>},
    {.field = "tie_embeddings",
     .name = "--tie-embeddings",
     .text = shown<&GPTConfig::tie_embeddings>,
     .meta = Meta::ModelConfig,
     .key = "tie_embeddings",
     .json = llama_json<&GPTConfig::tie_embeddings>},
    // How attention is computed, not what: the weights do not depend on it, so checkpoints do
    // not record it (a run may resume with the other kernel). The ranks agree on it as on the
    // sizes: what a block saves, and so the memory plan, follows it.
    {.field = "attention",
     .name = "--attention",
     .text = [](const GPTConfig& c) { return std::string(nn::attention_kernel_name(c.attention)); },
     .startup = Startup::OwnLine},
};

// The hyper-parameters meta.json records besides the learning rate's schedule.
const OptimizerSetting kOptimizer[] = {
    {.field = "kind",
     .name = "--optimizer",
     .text = [](const OptimizerConfig& o) { return std::string(parallel::optimizer_name(o.kind)); },
     .meta = Meta::Own,
     .key = "optimizer",
     .startup = Startup::OwnLine},
    // Left at f32 in a TrainConfig (validate() checks): its grad_dtype is the setting, given to
    // the optimizer once decided.
    {.field = "grad_dtype",
     .name = "the optimizer's copy of --grad-dtype",
     .ranks = Ranks::MayDiffer},
    agreed<&OptimizerConfig::beta1>("beta1", "--beta1", Meta::Hyperparameters),
    agreed<&OptimizerConfig::beta2>("beta2", "--beta2", Meta::Hyperparameters),
    agreed<&OptimizerConfig::eps>("eps", "--eps", Meta::Hyperparameters),
    agreed<&OptimizerConfig::weight_decay>("weight_decay", "--weight-decay", Meta::Hyperparameters),
    {.field = "exchange",
     .name = "--grad-exchange",
     .text =
         [](const OptimizerConfig& o) {
           return std::string(parallel::grad_exchange_name(o.exchange));
         },
     .startup = Startup::OwnLine},
    agreed<&OptimizerConfig::bucket_mb>("bucket_mb", "--bucket-mb"),
    {.field = "state_tier",
     .name = "--optimizer-state",
     .text =
         [](const OptimizerConfig& o) {
           return o.state_tier ? o.state_tier->str() : std::string("memory");
         },
     .startup = Startup::OwnLine},
    own_line(agreed<&OptimizerConfig::clip_grad_norm>("clip_grad_norm", "--clip-grad-norm",
                                                      Meta::Hyperparameters)),
    {.field = "sharding",
     .name = "--shard",
     .text =
         [](const OptimizerConfig& o) { return std::string(parallel::sharding_name(o.sharding)); },
     .flags =
         [](const OptimizerConfig& o) {
           return o.sharding == parallel::Sharding::Weights
                      ? std::vector<std::string>{"--shard", "weights"}
                      : std::vector<std::string>{};
         },
     .startup = Startup::OwnLine},
};

using data::Corpus;

// A reason a value was chosen ("" when it was given): the value itself is compared.
constexpr Ranks kReason = Ranks::MayDiffer;

const RunSetting kRun[] = {
    {.field = "model", .name = "the model", .ranks = Ranks::PerField},
    own_line(agreed<&TrainConfig::batch>("batch", "--batch", Meta::Extra)),
    agreed<&TrainConfig::steps>("steps", "--steps", Meta::Extra),
    own_line(agreed<&TrainConfig::lr>("lr", "--lr", Meta::Hyperparameters)),
    own_line(agreed<&TrainConfig::warmup>("warmup", "--warmup", Meta::Hyperparameters)),
    own_line(agreed<&TrainConfig::min_lr_ratio>("min_lr_ratio", "--min-lr-ratio",
                                                Meta::Hyperparameters)),
    {.field = "seed",
     .name = "--seed",
     .text = shown<&TrainConfig::seed>,
     .meta = Meta::Own,
     .key = "rng_seed"},
    {.field = "optimizer", .name = "the optimizer", .ranks = Ranks::PerField},
    // The value given, or decided (when the run is resolved, before the ranks start).
    {.field = "grad_dtype",
     .name = "--grad-dtype",
     .text = shown<&TrainConfig::grad_dtype>,
     .meta = Meta::Hyperparameters,
     .key = "grad_dtype",
     .json =
         [](const TrainConfig& c) {
           return nlohmann::json(dtype_name(c.grad_dtype.value_or(DType::F32)));
         },
     .auto_state = auto_state<&TrainConfig::grad_dtype>},
    agreed<&TrainConfig::tp_dtype>("tp_dtype", "--tp-dtype"),
    {.field = "grid",
     .name = "the grid (--dp, --tp, --pp, --cp, --stage-layers)",
     .text = [](const TrainConfig& c, const Corpus&) { return c.grid.str(); },
     .meta = Meta::Extra,
     .key = "grid",
     // cp where it is not 1 and the stages' layers where given, so that the meta of a run
     // without them stays as it was.
     .json =
         [](const TrainConfig& c) {
           nlohmann::json j{{"dp", c.grid.dp}, {"tp", c.grid.tp}, {"pp", c.grid.pp}};
           if (c.grid.cp != 1) j["cp"] = c.grid.cp;
           if (!c.grid.stage_layers.empty()) j["stage_layers"] = c.grid.stage_layers.counts();
           return j;
         },
     .flags =
         [](const TrainConfig& c) {
           std::vector<std::string> f{"--dp", std::to_string(c.grid.dp),
                                      "--tp", std::to_string(c.grid.tp),
                                      "--pp", std::to_string(c.grid.pp)};
           if (c.grid.cp != 1) f.insert(f.end(), {"--cp", std::to_string(c.grid.cp)});
           if (!c.grid.stage_layers.empty())
             f.insert(f.end(), {"--stage-layers", c.grid.stage_layers.str()});
           return f;
         },
     .startup = Startup::OwnLine},
    // What the plan across grids was asked (rank 0 plans; the grid it chose is compared above).
    {.field = "grid_auto",
     .name = "--grid auto (--ranks, --memory-per-rank, --link-gbps)",
     .text =
         [](const TrainConfig& c, const Corpus&) {
           if (!c.grid_auto) return std::string("off");
           const TrainConfig::GridAuto& g = *c.grid_auto;
           return fmt::format(
               "{} ranks, {} a rank, link {}", g.ranks,
               g.memory_per_rank ? fmt::format("{} bytes", *g.memory_per_rank)
                                 : std::string("the memory available"),
               g.link_gbps ? fmt::format("{} Gbit/s", *g.link_gbps) : std::string("measured"));
         },
     .startup = Startup::OwnLine},
    // The count a step uses (0 asks for the automatic one).
    {.field = "micro_batches",
     .name = "--micro-batches",
     .text = [](const TrainConfig& c,
                const Corpus&) { return fmt::format("{}", c.micro_batch_count()); },
     .meta = Meta::Extra,
     .key = "micro_batches",
     .json = [](const TrainConfig& c) { return nlohmann::json(c.micro_batch_count()); },
     // A count given (or chosen by the plan across grids); none for the automatic one.
     .flags =
         [](const TrainConfig& c) {
           return c.micro_batches > 0
                      ? std::vector<std::string>{"--micro-batches", std::to_string(c.micro_batches)}
                      : std::vector<std::string>{};
         },
     .startup = Startup::OwnLine},
    {.field = "backend",
     .name = "--backend",
     .text = [](const TrainConfig& c,
                const Corpus&) { return std::string(comm::backend_name(c.backend)); },
     .startup = Startup::OwnLine},
    {.field = "executor",
     .name = "--executor",
     .text = [](const TrainConfig& c,
                const Corpus&) { return std::string(exec::runner_kind_name(c.executor)); },
     .startup = Startup::OwnLine},
    {.field = "tune",
     .name = "--tune",
     .text = [](const TrainConfig& c, const Corpus&) { return std::string(c.tune ? "on" : "off"); },
     .startup = Startup::OwnLine},
    // The data by what it holds (its path may differ from host to host).
    {.field = "data",
     .name = "--data",
     .text =
         [](const TrainConfig&, const Corpus& corpus) {
           return fmt::format("{} tokens, fingerprint {}",
                              corpus.train.size() + corpus.validation.size(),
                              corpus.fingerprint_hex());
         },
     .meta = Meta::Own,
     .key = "data",
     .startup = Startup::OwnLine},
    agreed<&TrainConfig::synthetic_bytes>("synthetic_bytes", "the synthetic corpus's size"),
    agreed<&TrainConfig::validation_fraction>("validation_fraction", "--val-fraction", Meta::Extra),
    agreed<&TrainConfig::eval_every>("eval_every", "--eval-every"),
    agreed<&TrainConfig::eval_batches>("eval_batches", "--eval-batches"),
    // The outputs: rank 0 alone writes them, but every rank must mean the same run.
    agreed<&TrainConfig::save_dir>("save_dir", "--save"),
    agreed<&TrainConfig::save_every>("save_every", "--save-every"),
    agreed<&TrainConfig::keep_checkpoints>("keep_checkpoints", "--keep-checkpoints"),
    own_line(agreed<&TrainConfig::resume_dir>("resume_dir", "--resume")),
    own_line(agreed<&TrainConfig::init_from>("init_from", "--init-from")),
    agreed<&TrainConfig::metrics_path>("metrics_path", "--metrics"),
    agreed<&TrainConfig::trace_path>("trace_path", "--trace"),
    {.field = "blas_threads", .name = "--threads (each host's cores)", .ranks = Ranks::MayDiffer},
    // The timeout in force: the flag, else TANDEM_COMM_TIMEOUT, else the default.
    {.field = "comm_timeout_s",
     .name = "--comm-timeout",
     .text = [](const TrainConfig&,
                const Corpus&) { return fmt::format("{}", comm::comm_timeout_s()); }},
    {.field = "out", .name = "where world rank 0 prints", .ranks = Ranks::MayDiffer},
    {.field = "progress", .name = "--quiet", .ranks = Ranks::MayDiffer},
    {.field = "keep_weights",
     .name = "the final weights returned (tests)",
     .ranks = Ranks::MayDiffer},
    {.field = "on_step", .name = "the per-step callback (Python's)", .ranks = Ranks::MayDiffer},
    {.field = "memory_budget",
     .name = "--memory-budget",
     .text = shown<&TrainConfig::memory_budget>,
     .flags =
         [](const TrainConfig& c) {
           return c.memory_budget.empty()
                      ? std::vector<std::string>{}
                      : std::vector<std::string>{"--memory-budget", c.memory_budget};
         },
     .startup = Startup::OwnLine},
    {.field = "slow_tier",
     .name = "--slow-tier",
     .text = [](const TrainConfig& c, const Corpus&) { return c.slow_tier.str(); }},
    {.field = "ooc_plan",
     .name = "--ooc-plan",
     .text =
         [](const TrainConfig& c, const Corpus&) {
           return c.ooc_plan.empty() ? std::string("the planner's") : c.ooc_plan;
         }},
    {.field = "model_state",
     .name = "--model-state",
     .text =
         [](const TrainConfig& c, const Corpus&) {
           return c.model_state ? c.model_state->str() : std::string("memory");
         },
     .flags =
         [](const TrainConfig& c) {
           return c.model_state ? std::vector<std::string>{"--model-state", c.model_state->str()}
                                : std::vector<std::string>{};
         },
     .startup = Startup::OwnLine},
    // The value given, or "auto" (decided in the rank's set-up, after its profile).
    agreed<&TrainConfig::resident_blocks>("resident_blocks", "--resident-blocks"),
    // The value given, or decided (by rank 0, before the ranks start).
    {.field = "gather_ahead",
     .name = "--gather-ahead",
     .text = shown<&TrainConfig::gather_ahead>,
     .flags =
         [](const TrainConfig& c) {
           return c.optimizer.sharding == parallel::Sharding::Weights
                      ? std::vector<std::string>{"--gather-ahead",
                                                 std::to_string(c.gather_ahead_blocks())}
                      : std::vector<std::string>{};
         },
     .auto_state = auto_state<&TrainConfig::gather_ahead>},
    {.field = "grid_choice", .name = "why the grid (--grid auto)", .ranks = kReason},
    {.field = "lr_choice", .name = "why --lr", .ranks = kReason},
    {.field = "plan_only",
     .name = "the command (train or plan)",
     .text = [](const TrainConfig& c,
                const Corpus&) { return std::string(c.plan_only ? "plan" : "train"); },
     .startup = Startup::OwnLine},
};

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

// The entries of `table` placed in `part`, into `j` by their keys (a null value left out).
template <typename Table, typename S>
void add_meta(nlohmann::json& j, const Table& table, Meta part, const S& s) {
  for (const auto& e : table)
    if (e.meta == part && e.json != nullptr)
      if (nlohmann::json v = e.json(s); !v.is_null()) j[std::string(e.key)] = std::move(v);
}

}  // namespace

std::span<const ModelSetting> model_settings() { return kModel; }
std::span<const OptimizerSetting> optimizer_settings() { return kOptimizer; }
std::span<const RunSetting> run_settings() { return kRun; }

namespace {

// The entries of `table` the ranks compare, as (name, value) pairs into `out`.
template <typename Table, typename... In>
void add_agreeing(std::vector<std::pair<std::string, std::string>>& out, const Table& table,
                  const In&... in) {
  for (const auto& e : table)
    if (e.ranks == Ranks::Agree && e.text != nullptr)
      out.emplace_back(std::string(e.name), e.text(in...));
}

// One entry of kRun as the ranks compare it: the model's and the optimizer's, their tables'.
void add_agreeing(std::vector<std::pair<std::string, std::string>>& out, const RunSetting& e,
                  const TrainConfig& c, const data::Corpus& corpus) {
  if (e.field == "model")
    add_agreeing(out, kModel, c.model);
  else if (e.field == "optimizer")
    add_agreeing(out, kOptimizer, c.optimizer);
  else if (e.ranks == Ranks::Agree)
    out.emplace_back(std::string(e.name), e.text(c, corpus));
}

}  // namespace

std::vector<std::pair<std::string, std::string>> agreeing_settings(const TrainConfig& c,
                                                                   const data::Corpus& corpus) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const RunSetting& e : kRun) add_agreeing(out, e, c, corpus);
  return out;
}

namespace {

// Exchanges `mine` (the same flags, in the same order, on every rank) and throws on every rank
// the same error naming each flag the ranks give different values.
void check_values_agree(comm::Communicator& world,
                        const std::vector<std::pair<std::string, std::string>>& mine) {
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

}  // namespace

void check_ranks_agree(comm::Communicator& world, const TrainConfig& config,
                       const data::Corpus& corpus) {
  check_values_agree(world, agreeing_settings(config, corpus));
}

void check_ranks_agree_on(comm::Communicator& world, const TrainConfig& config,
                          std::initializer_list<std::string_view> fields) {
  std::vector<std::pair<std::string, std::string>> mine;
  size_t found = 0;
  for (const RunSetting& e : kRun)
    if (std::find(fields.begin(), fields.end(), e.field) != fields.end()) {
      TANDEM_CHECK(e.ranks != Ranks::MayDiffer && (e.text != nullptr || e.ranks == Ranks::PerField),
                   "{} is not a setting the ranks compare", e.field);
      TANDEM_CHECK(e.field != "data", "the data is compared with the corpus (check_ranks_agree)");
      add_agreeing(mine, e, config, data::Corpus{});
      ++found;
    }
  TANDEM_CHECK(found == fields.size(), "a field named twice or not in the table");
  check_values_agree(world, mine);
}

namespace {

// The Listed entries of `table` for the start-up lines: into `changed` as "flag value" where the
// value is not `defaults`'s, into `decided` as "flag value (reason)" where an auto was decided.
// An auto still undecided does not apply to this run (--tp-dtype with one tensor-parallel rank,
// --resident-blocks without a streamed model state): it is left out.
template <typename Table, typename S, typename... In>
void add_startup(std::vector<std::string>& changed, std::string& decided, const Table& table,
                 const S& s, const S& defaults, const In&... in) {
  for (const auto& e : table) {
    if (e.startup != Startup::Listed || e.text == nullptr) continue;
    const AutoState a = e.auto_state != nullptr ? e.auto_state(s) : AutoState{};
    if (a.undecided) continue;
    const std::string value = e.text(s, in...);
    if (!a.reason.empty())
      decided += fmt::format("  {} {} ({})\n", e.name, value, a.reason);
    else if (value != e.text(defaults, in...))
      changed.push_back(fmt::format("{} {}", e.name, value));
  }
}

}  // namespace

std::string startup_lines(const TrainConfig& c, const data::Corpus& corpus) {
  const TrainConfig defaults;
  std::vector<std::string> changed;
  std::string decided;
  for (const RunSetting& e : kRun) {
    if (e.field == "model")
      add_startup(changed, decided, kModel, c.model, defaults.model);
    else if (e.field == "optimizer")
      add_startup(changed, decided, kOptimizer, c.optimizer, defaults.optimizer);
    else
      add_startup(changed, decided, std::span(&e, 1), c, defaults, corpus);
  }
  std::string out;
  if (!changed.empty()) out = fmt::format("  other settings: {}\n", fmt::join(changed, ", "));
  return out + decided;
}

nlohmann::json model_config_json(const nn::GPTConfig& model) {
  nlohmann::json j = nlohmann::json::object();
  add_meta(j, kModel, Meta::ModelConfig, model);
  return j;
}

nlohmann::json meta_json(Meta part, const TrainConfig& config) {
  nlohmann::json j = nlohmann::json::object();
  add_meta(j, kModel, part, config.model);
  add_meta(j, kOptimizer, part, config.optimizer);
  add_meta(j, kRun, part, config);
  return j;
}

std::vector<std::string> flags_for(const TrainConfig& config,
                                   std::span<const std::string_view> fields) {
  std::vector<std::string> out;
  auto add = [&out](const auto& table, std::string_view field, const auto& s) {
    for (const auto& e : table)
      if (e.field == field) {
        TANDEM_CHECK(e.flags != nullptr, "the setting {} has no flags", field);
        for (std::string& f : e.flags(s)) out.push_back(std::move(f));
        return true;
      }
    return false;
  };
  for (std::string_view f : fields)
    if (!add(kRun, f, config) && !add(kOptimizer, f, config.optimizer))
      TANDEM_CHECK(add(kModel, f, config.model), "no setting {}", f);
  return out;
}

}  // namespace tandem::train::detail
