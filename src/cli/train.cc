// `tandem train`: trains a GPT-2 model on a byte corpus or token shards across in-process or MPI
// ranks (flags into a TrainConfig; the loop is train/trainer). `tandem plan`: the same model, grid
// and memory flags, but only the out-of-core plan is made and reported; with --ranks N, the plan
// across grids (train/grid_plan.h), which `tandem train --grid auto` takes.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "choices.h"
#include "commands.h"
#include "tandem/comm/communicator.h"
#include "tandem/core/bytes.h"
#include "tandem/core/error.h"
#include "tandem/data/token_corpus.h"
#include "tandem/io/checkpoint.h"
#include "tandem/train/grid_plan.h"
#include "tandem/train/hf_folder.h"
#include "tandem/train/trainer.h"

namespace tandem::cli {
namespace {

// A preset's block (the family and its sizes: n_layers, n_heads, d_model, seq_len and the Llama
// fields), batch, and the peak learning rate and warm-up that train it (lr 0: the width's,
// train::width_learning_rate).
struct ModelPreset {
  nn::GPTConfig block;
  int64_t batch;
  double lr = 0;
  int64_t warmup = 30;
};

ModelPreset gpt2_shape(int layers, int heads, int d_model, int seq_len, int64_t batch,
                       double lr = 0, int64_t warmup = 30) {
  nn::GPTConfig c;
  c.n_layers = layers;
  c.n_heads = heads;
  c.d_model = d_model;
  c.seq_len = seq_len;
  return {c, batch, lr, warmup};
}

// Models of hundreds of millions of parameters warm up longer than the small ones.
constexpr int64_t kLargeWarmup = 100;

// A Llama-family shape as published (config.json's fields); the context trained at is 2048.
ModelPreset llama_shape(int layers, int heads, int kv_heads, int d_model, int ffn, double theta,
                        float eps, bool tied, bool qkv_bias = false, bool llama3_scaling = false,
                        double lr = 0) {
  nn::GPTConfig c;
  c.arch = nn::Arch::Llama;
  c.n_layers = layers;
  c.n_heads = heads;
  c.kv_heads = kv_heads;
  c.d_model = d_model;
  c.ffn = ffn;
  c.rope_theta = theta;
  c.norm_eps = eps;
  c.tie_embeddings = tied;
  c.qkv_bias = qkv_bias;
  if (llama3_scaling) c.rope_scaling = {nn::RopeType::Llama3, 32.0, 1.0, 4.0, 8192};
  c.seq_len = 2048;
  return {c, 8, lr, kLargeWarmup};
}

constexpr const char* kPresetNames =
    "tiny, small, gpt2, gpt2-medium, gpt2-large, gpt2-xl, smollm-135m, smollm-360m, "
    "qwen2.5-0.5b, tinyllama-1.1b, llama-3.2-1b and llama-3.2-3b";

// tiny: seconds on one core (tests, smoke runs). small: the default run, a minute on 2 cores.
// gpt2 ... gpt2-xl: GPT-2's published shapes (124M, 350M, 774M, 1.5B parameters with its 50257
// tokens); GPT-2's paper gives no learning rates, so theirs are GPT-3's (its table 2.1) for the
// nearest size. The Llama family's published shapes (their config.json), and TinyLlama's
// published learning rate; the others publish none, and take the width's. The vocabulary is never
// the preset's: it is the data's (docs/data.md). Warm-ups are for runs of hundreds of steps (the
// published ones assume 10^5).
ModelPreset preset(const std::string& name) {
  if (name == "tiny") return gpt2_shape(2, 2, 64, 64, 8);
  if (name == "small") return gpt2_shape(4, 4, 128, 64, 16);
  if (name == "gpt2") return gpt2_shape(12, 12, 768, 1024, 8, 6e-4, kLargeWarmup);
  if (name == "gpt2-medium") return gpt2_shape(24, 16, 1024, 1024, 8, 3e-4, kLargeWarmup);
  if (name == "gpt2-large") return gpt2_shape(36, 20, 1280, 1024, 8, 2.5e-4, kLargeWarmup);
  if (name == "gpt2-xl") return gpt2_shape(48, 25, 1600, 1024, 8, 2e-4, kLargeWarmup);
  if (name == "smollm-135m") return llama_shape(30, 9, 3, 576, 1536, 10000.0, 1e-5f, true);
  if (name == "smollm-360m") return llama_shape(32, 15, 5, 960, 2560, 10000.0, 1e-5f, true);
  if (name == "qwen2.5-0.5b")
    return llama_shape(24, 14, 2, 896, 4864, 1000000.0, 1e-6f, true, /*qkv_bias=*/true);
  if (name == "tinyllama-1.1b")
    return llama_shape(22, 32, 4, 2048, 5632, 10000.0, 1e-5f, false, false, false, 4e-4);
  if (name == "llama-3.2-1b")
    return llama_shape(16, 32, 8, 2048, 8192, 500000.0, 1e-5f, true, false, /*llama3=*/true);
  if (name == "llama-3.2-3b")
    return llama_shape(28, 24, 8, 3072, 8192, 500000.0, 1e-5f, true, false, /*llama3=*/true);
  user_error("--model {}: the presets are {}", name, kPresetNames);
}

// --rope-scaling: none, or llama3:FACTOR,LOW,HIGH,ORIGINAL (Llama 3.1's rope_scaling fields
// factor, low_freq_factor, high_freq_factor, original_max_position_embeddings).
nn::RopeScaling parse_rope_scaling(const std::string& text) {
  if (text == "none") return {};
  const std::string usage =
      "--rope-scaling is none or llama3:FACTOR,LOW,HIGH,ORIGINAL (e.g. llama3:32,1,4,8192)";
  if (text.rfind("llama3:", 0) != 0) user_error("--rope-scaling {}: {}", text, usage);
  std::istringstream in(text.substr(7));
  nn::RopeScaling r;
  r.type = nn::RopeType::Llama3;
  char c1 = 0, c2 = 0, c3 = 0;
  if (!(in >> r.factor >> c1 >> r.low_freq_factor >> c2 >> r.high_freq_factor >> c3 >>
        r.original_max_position_embeddings) ||
      c1 != ',' || c2 != ',' || c3 != ',' || !in.eof())
    user_error("--rope-scaling {}: {}", text, usage);
  return r;
}

// The plan across grids: --ranks, --memory-per-rank, --link-gbps (both commands), --grid (train).
struct GridFlags {
  bool grid = false;  // train: --grid auto
  int ranks = 0;
  std::string memory_per_rank;
  std::optional<double> link_gbps;
  CLI::Option *grid_opt = nullptr, *ranks_opt = nullptr, *memory_opt = nullptr, *link_opt = nullptr;
};

struct TrainFlags {
  std::string model = "small";
  int layers = 0, heads = 0, d_model = 0, seq_len = 0;
  int64_t batch = 0;
  float dropout = 0.0f;
  // The block's family and the Llama fields.
  std::string arch;
  int kv_heads = 0, ffn = 0;
  float norm_eps = 0.0f;
  double rope_theta = 0.0;
  std::string rope_scaling;
  bool qkv_bias = false, tie_embeddings = true;
  train::TrainConfig cfg;
  bool quiet = false;
  std::string comm_timeout;  // --comm-timeout, checked by comm::parse_comm_timeout
  GridFlags across;
  CLI::Option *lr = nullptr, *warmup = nullptr;  // tandem train's, to tell whether they were given
};

// The model's size from the preset and the flags given (a resumed run: from its checkpoint).
struct SizeOptions {
  CLI::Option *model, *layers, *heads, *d_model, *seq_len, *batch, *dropout;
  CLI::Option *arch, *kv_heads, *ffn, *norm_eps, *rope_theta, *rope_scaling, *qkv_bias,
      *tie_embeddings;
  // The Llama-only flags given.
  std::vector<const CLI::Option*> llama_flags() const {
    std::vector<const CLI::Option*> given;
    for (const CLI::Option* o : {kv_heads, ffn, norm_eps, rope_theta, rope_scaling, qkv_bias})
      if (o->count() > 0) given.push_back(o);
    return given;
  }
};

SizeOptions add_size_flags(CLI::App* cmd, TrainFlags& f) {
  return {
      cmd->add_option("--model", f.model,
                      fmt::format("Model preset: {} (--layers etc. override its sizes; the "
                                  "vocabulary is the data's)",
                                  kPresetNames))
          ->capture_default_str(),
      cmd->add_option("--layers", f.layers, "Transformer blocks (overrides the preset)"),
      cmd->add_option("--heads", f.heads, "Attention heads"),
      cmd->add_option("--d-model", f.d_model, "Model width"),
      cmd->add_option("--seq-len", f.seq_len, "Tokens per sequence"),
      cmd->add_option("--batch", f.batch, "Sequences per step (the global batch)"),
      cmd->add_option("--dropout", f.dropout, "Dropout probability (GPT-2's three sites)"),
      cmd->add_option("--arch", f.arch,
                      "The block's family: gpt2 (LayerNorm, learned positions, GELU) or llama "
                      "(RMSNorm, rotary positions, SwiGLU, grouped-query attention); default: "
                      "the preset's")
          ->check(CLI::IsMember({"gpt2", "llama"})),
      cmd->add_option("--kv-heads", f.kv_heads,
                      "Llama: key/value heads, dividing --heads (1: multi-query; default: "
                      "--heads)"),
      cmd->add_option("--ffn", f.ffn, "Llama: the SwiGLU MLP's width (default: 4 x --d-model)"),
      cmd->add_option("--norm-eps", f.norm_eps, "Llama: RMSNorm's epsilon (default 1e-5)"),
      cmd->add_option("--rope-theta", f.rope_theta,
                      "Llama: the rotary positions' base (default 10000)"),
      cmd->add_option("--rope-scaling", f.rope_scaling,
                      "Llama: the rotary frequencies' scaling: none or "
                      "llama3:FACTOR,LOW,HIGH,ORIGINAL (Llama 3.1 and 3.2: llama3:32,1,4,8192)"),
      cmd->add_flag("--qkv-bias", f.qkv_bias,
                    "Llama: q/k/v projections with a bias (Qwen2; --qkv-bias=false: none)"),
      cmd->add_option("--tie-embeddings", f.tie_embeddings,
                      "The LM head is the token embedding (true; GPT-2 always) or its own "
                      "matrix (false; Llama only)")};
}

void add_grid_flags(CLI::App* cmd, train::TrainConfig& c) {
  cmd->add_option("--dp", c.grid.dp, "Data-parallel ranks")->capture_default_str();
  cmd->add_option("--tp", c.grid.tp, "Tensor-parallel ranks (must divide --heads)")
      ->capture_default_str();
  cmd->add_option("--pp", c.grid.pp, "Pipeline stages (at most --layers)")->capture_default_str();
  cmd->add_option("--cp", c.grid.cp,
                  "Context-parallel ranks each sequence is split over (--seq-len a multiple of "
                  "2 x cp; inside each data-parallel rank)")
      ->capture_default_str();
  add_choice(cmd, "--stage-layers", c.grid.stage_layers, parse_stage_layers,
             "The layers of each pipeline stage, --pp counts summing to --layers, e.g. 3,5 "
             "(default: as even as they go; the first stage also holds the embeddings, the last "
             "the final norm and the LM head)",
             "even");
  cmd->add_option("--micro-batches", c.micro_batches,
                  "Micro-batches per step and data-parallel rank (0: automatic: 1, or with --pp "
                  "about 2 x pp, a count that divides the rows)")
      ->capture_default_str();
  cmd->add_option("--threads", c.blas_threads,
                  "BLAS threads (0: hardware threads / in-process ranks)")
      ->capture_default_str();
}

CLI::Option* add_memory_flags(CLI::App* cmd, train::TrainConfig& c) {
  cmd->add_option("--memory-budget", c.memory_budget,
                  "Train out-of-core: the fast-tier bytes for saved activations and scratch, e.g. "
                  "600MiB, 2GiB, or 25% "
                  "(of the in-core need) "
                  "(docs/out-of-core.md)");
  auto* tier =
      add_choice(cmd, "--slow-tier", c.slow_tier, parse_slow_tier,
                 "Where swapped activations go: host, or file:DIR (O_DIRECT)", c.slow_tier.str());
  cmd->add_option("--ooc-plan", c.ooc_plan,
                  "Use this out-of-core plan instead of the planner's, e.g. KKSRKKSR/p1 (a letter "
                  "per half block: attention, MLP, ...)");
  add_choice(cmd, "--model-state", c.model_state, parse_model_state,
             "Where the blocks' weights, gradients and optimizer state live: memory, host (a slow "
             "tier in host memory) or file:DIR (an O_DIRECT file), streamed block by block "
             "through a few slots; a model larger than memory trains (docs/out-of-core.md)",
             "memory");
  add_choice(cmd, "--resident-blocks", c.resident_blocks, parse_resident_blocks,
             "With --model-state: how many of each stage's blocks stay in memory instead of "
             "streaming (their reads and write-backs leave the step), or auto: as many as "
             "shorten the predicted step within --memory-budget (none without a budget)",
             "auto");
  return tier;
}

// --init-from: the block the flags ask for (a --model preset's, or --layers etc.) must be the
// folder's config.json's, and its vocabulary the data's; --seq-len may be shorter than its
// positions. Each disagreement names the flag and the file's field.
void check_init_from_flags(const train::TrainConfig& cfg, const nn::GPTConfig& hf,
                           const std::string& preset_name, const SizeOptions& o) {
  const std::string file = (std::filesystem::path(cfg.init_from) / "config.json").string();
  const nn::GPTConfig& m = cfg.model;
  const std::map<std::string_view, const CLI::Option*> option = {
      {"--arch", o.arch},
      {"--layers", o.layers},
      {"--heads", o.heads},
      {"--d-model", o.d_model},
      {"--kv-heads", o.kv_heads},
      {"--ffn", o.ffn},
      {"--norm-eps", o.norm_eps},
      {"--rope-theta", o.rope_theta},
      {"--rope-scaling", o.rope_scaling},
      {"--qkv-bias", o.qkv_bias},
      {"--tie-embeddings", o.tie_embeddings}};
  const std::vector<train::HfFieldDifference> differ = train::hf_block_differences(hf, m);
  if (!differ.empty()) {
    const train::HfFieldDifference& d = differ.front();
    const std::string by =
        option.at(d.flag)->count() > 0
            ? fmt::format("{} {}", d.flag, d.run_value)
            : fmt::format("--model {} ({} {})", preset_name, d.flag.substr(2), d.run_value);
    user_error("{} disagrees with '{}', which has {} {}", by, file, d.field, d.folder_value);
  }
  const train::HfFieldNames f = train::hf_field_names(hf.arch);
  if (m.seq_len > hf.max_positions)
    user_error("--seq-len {} disagrees with '{}', which has {} {}: at most {}", m.seq_len, file,
               f.positions, hf.max_positions, hf.max_positions);
  if (m.vocab_size != hf.vocab_size)
    user_error(
        "the vocabulary of {} ({} tokens) disagrees with '{}', which has vocab_size {}: train on "
        "token shards encoded with the folder's tokenizer",
        cfg.data.empty() ? "the synthetic corpus" : fmt::format("--data '{}'", cfg.data),
        m.vocab_size, file, hf.vocab_size);
}

// The block's family and Llama fields from the preset (or checkpoint), then the flags given.
void set_block(nn::GPTConfig& m, const nn::GPTConfig& from, const TrainFlags& flags,
               const SizeOptions& o) {
  m.arch = from.arch;
  m.kv_heads = from.kv_heads;
  m.ffn = from.ffn;
  m.norm_eps = from.norm_eps;
  m.rope_theta = from.rope_theta;
  m.rope_scaling = from.rope_scaling;
  m.qkv_bias = from.qkv_bias;
  m.tie_embeddings = from.tie_embeddings;
  m.n_layers = o.layers->count() ? flags.layers : from.n_layers;
  m.n_heads = o.heads->count() ? flags.heads : from.n_heads;
  m.d_model = o.d_model->count() ? flags.d_model : from.d_model;
  m.seq_len = o.seq_len->count() ? flags.seq_len : from.seq_len;
  if (o.arch->count() > 0) {
    const nn::Arch asked = flags.arch == "llama" ? nn::Arch::Llama : nn::Arch::Gpt2;
    if (asked != from.arch && o.model->count() > 0)
      user_error("--arch {} disagrees with --model {}, a {} model", flags.arch, flags.model,
                 nn::arch_name(from.arch));
    m.arch = asked;
  }
  if (!m.llama()) {
    const auto given = o.llama_flags();
    if (!given.empty() || (o.tie_embeddings->count() > 0 && !flags.tie_embeddings))
      user_error("{} is a Llama field: add --arch llama (or a Llama --model)",
                 given.empty() ? std::string("--tie-embeddings false") : given.front()->get_name());
    return;
  }
  // Values a field would read as "the default" are refused by the flag's name.
  if (o.kv_heads->count() > 0 && flags.kv_heads < 1)
    user_error("--kv-heads {} must be at least 1 (1: multi-query attention)", flags.kv_heads);
  if (o.ffn->count() > 0 && flags.ffn < 1) user_error("--ffn {} must be at least 1", flags.ffn);
  if (o.norm_eps->count() > 0 && !(flags.norm_eps > 0 && std::isfinite(flags.norm_eps)))
    user_error("--norm-eps {} must be a positive number", flags.norm_eps);
  if (o.rope_theta->count() > 0 && !(flags.rope_theta > 0 && std::isfinite(flags.rope_theta)))
    user_error("--rope-theta {} must be a positive number", flags.rope_theta);
  if (o.kv_heads->count() > 0) m.kv_heads = flags.kv_heads;
  if (o.ffn->count() > 0) m.ffn = flags.ffn;
  if (o.norm_eps->count() > 0) m.norm_eps = flags.norm_eps;
  if (o.rope_theta->count() > 0) m.rope_theta = flags.rope_theta;
  if (o.rope_scaling->count() > 0) m.rope_scaling = parse_rope_scaling(flags.rope_scaling);
  if (o.qkv_bias->count() > 0) m.qkv_bias = flags.qkv_bias;
  if (o.tie_embeddings->count() > 0) m.tie_embeddings = flags.tie_embeddings;
}

// The TrainConfig the flags describe.
train::TrainConfig config_of(const TrainFlags& flags, const SizeOptions& o, const CLI::Option* tier,
                             bool grid_plan = false) {
  train::TrainConfig cfg = flags.cfg;
  ModelPreset p = preset(flags.model);
  nn::GPTConfig& m = cfg.model;
  float dropout = flags.dropout;
  // A resumed run takes the checkpoint's model and batch unless flags say otherwise (and then
  // the trainer refuses a model that does not match).
  bool from_checkpoint = false;
  std::optional<double> resumed_lr;
  std::optional<int64_t> resumed_warmup;
  std::optional<nn::GPTConfig> hf;                         // --init-from: the folder's model
  if (!cfg.init_from.empty() && cfg.resume_dir.empty()) {  // both: refused by validate()
    hf = train::hf_model_config(cfg.init_from);
    if (o.model->count() == 0) p.block = *hf;
    m.max_positions = hf->max_positions;
    if (o.dropout->count() == 0) dropout = hf->dropout;
    from_checkpoint = true;
  }
  if (!cfg.resume_dir.empty()) {
    // Its meta.json and headers only: the tensors are read when the ranks restore them.
    const io::RunMeta meta = io::CheckpointReader(cfg.resume_dir, false).meta();
    const nn::GPTConfig saved =
        train::model_config_from_json(meta.model_config, "checkpoint '" + cfg.resume_dir + "'");
    // --model names sizes as --layers does: a preset other than the checkpoint's model is
    // refused as a mismatch (below, by the trainer), not silently replaced by the checkpoint's.
    if (o.model->count() == 0) p.block = saved;
    if (meta.extra.contains("batch") && meta.extra["batch"].is_number_integer())
      p.batch = meta.extra["batch"].get<int64_t>();
    // A resumed run follows its schedule unless --lr or --warmup says otherwise.
    const nlohmann::json& h = meta.optimizer_hparams;
    if (h.contains("lr") && h["lr"].is_number()) resumed_lr = h["lr"].get<double>();
    if (h.contains("warmup") && h["warmup"].is_number_integer())
      resumed_warmup = h["warmup"].get<int64_t>();
    m.max_positions = saved.max_positions;
    if (o.dropout->count() == 0) dropout = saved.dropout;
    from_checkpoint = true;
  }
  set_block(m, p.block, flags, o);
  if (!from_checkpoint) m.max_positions = m.seq_len;
  m.dropout = dropout;
  m.vocab_size = data::data_vocab_size(cfg.data);
  if (hf) check_init_from_flags(cfg, *hf, flags.model, o);
  cfg.batch = o.batch->count() ? flags.batch : p.batch;
  // The peak learning rate and warm-up: the flags', else a resumed run's, else the preset's (its
  // rate only at its own width), else the width's.
  const bool lr_given = flags.lr != nullptr && flags.lr->count() > 0;
  if (!lr_given && resumed_lr) {
    cfg.lr = *resumed_lr;
    cfg.lr_choice = "the checkpoint's";
  } else if (!lr_given && p.lr > 0 && m.d_model == p.block.d_model) {
    cfg.lr = p.lr;
    cfg.lr_choice = fmt::format("--model {}'s", flags.model);
  } else if (!lr_given) {
    cfg.lr = train::width_learning_rate(m.d_model);
    cfg.lr_choice = fmt::format("the default for d_model {}", m.d_model);
  }
  if (flags.warmup == nullptr || flags.warmup->count() == 0)
    cfg.warmup = resumed_warmup ? *resumed_warmup : p.warmup;
  cfg.progress = !flags.quiet;
  if (!flags.comm_timeout.empty())
    cfg.comm_timeout_s = comm::parse_comm_timeout(flags.comm_timeout, "--comm-timeout");
  if (tier->count() > 0 && cfg.memory_budget.empty() && !grid_plan)
    user_error("--slow-tier needs --memory-budget: without a budget everything stays in memory");
  return cfg;
}

void add_across_flags(CLI::App* cmd, GridFlags& g) {
  g.ranks_opt = cmd->add_option(
      "--ranks", g.ranks,
      "Plan across grids: every dp x tp x pp of this many ranks, with the sharding, model-state "
      "placement and out-of-core plan that fit --memory-per-rank (docs/training.md, \"Choosing a "
      "grid\")");
  g.memory_opt = cmd->add_option(
      "--memory-per-rank", g.memory_per_rank,
      "With --ranks: the memory each rank may use, e.g. 4GiB (default: the memory available "
      "here over the ranks on this machine)");
  g.link_opt = cmd->add_option(
      "--link-gbps", g.link_gbps,
      "With --ranks: the link between ranks in Gbit/s, for ranks on several hosts (default: "
      "measured in-process)");
}

// --ranks, --memory-per-rank (its text read) and --link-gbps: what the plan across grids is asked.
train::TrainConfig::GridAuto grid_request(const GridFlags& g) {
  train::TrainConfig::GridAuto r{g.ranks, std::nullopt, g.link_gbps};
  if (g.memory_per_rank.empty()) return r;
  try {
    const uint64_t bytes = parse_bytes(g.memory_per_rank);
    if (bytes == 0) user_error("must be more than 0");
    r.memory_per_rank = bytes;
  } catch (const UserError& e) {
    user_error("--memory-per-rank: {}", e.what());
  }
  return r;
}

// The flags of the plan across grids checked: outside the mode (`needs` names the flag that turns
// it on) none of its own; in it (`mode` names it), none of what it chooses (`chosen`: the flags
// naming the grid and what the plan decides).
void check_across_flags(const GridFlags& g, bool across, const std::string& needs,
                        const std::string& mode, const std::vector<const CLI::Option*>& chosen) {
  if (!across) {
    for (const CLI::Option* o : {g.ranks_opt, g.memory_opt, g.link_opt})
      if (o != nullptr && o->count() > 0) user_error("{} needs {}", o->get_name(), needs);
    return;
  }
  train::check_plan_ranks(g.ranks);
  // From a slow WAN to past any network built: a rate outside gives a step time of hundreds of
  // digits, or of none.
  constexpr double kLeastGbps = 1e-3, kMostGbps = 1e6;
  if (g.link_gbps && !(*g.link_gbps >= kLeastGbps && *g.link_gbps <= kMostGbps))
    user_error("--link-gbps {} must be a number of Gbit/s from {} to {}", *g.link_gbps, kLeastGbps,
               kMostGbps);
  for (const CLI::Option* o : chosen)
    if (o->count() > 0)
      user_error("{} plans across grids and chooses {}: leave it out", mode, o->get_name());
}

train::GridPlan plan_across(const GridFlags& g, const train::TrainConfig& base) {
  const uint64_t limit = train::plan_memory_per_rank(grid_request(g), base.backend);
  return train::plan_grids(base, g.ranks, limit, train::measure_rates(base, g.ranks, g.link_gbps));
}

}  // namespace

void add_train(CLI::App& app, TrainRun run) {
  auto flags = std::make_shared<TrainFlags>();
  train::TrainConfig& c = flags->cfg;
  // The default run: 4 in-process ranks, 2-way data- and 2-way tensor-parallel.
  c.grid = {2, 2, 1};

  auto* cmd =
      app.add_subcommand("train", "Train a GPT-2 model, data-, tensor- and pipeline-parallel");
  const SizeOptions sizes = add_size_flags(cmd, *flags);
  cmd->add_option("--steps", c.steps, "Train until this many optimizer steps")
      ->capture_default_str();
  flags->lr = cmd->add_option("--lr", c.lr,
                              "Peak learning rate (default: the preset's, else 3e-3 up to "
                              "--d-model 128 and 0.384 / d_model wider; a resumed run's own)");
  flags->warmup = cmd->add_option("--warmup", c.warmup,
                                  "Linear warm-up steps, then cosine decay (default: the "
                                  "preset's, 30 or 100; a resumed run's own)");
  cmd->add_option("--min-lr-ratio", c.min_lr_ratio, "Final learning rate as a fraction of --lr")
      ->capture_default_str();
  cmd->add_option("--seed", c.seed, "Seed of initialisation, batches and dropout")
      ->capture_default_str();
  add_choice(cmd, "--optimizer", c.optimizer.kind, parse_optimizer, "adamw or lamb",
             parallel::optimizer_name(c.optimizer.kind));
  cmd->add_option("--beta1", c.optimizer.beta1, "Adam's beta1")->capture_default_str();
  cmd->add_option("--beta2", c.optimizer.beta2, "Adam's beta2")->capture_default_str();
  cmd->add_option("--eps", c.optimizer.eps, "Adam's epsilon")->capture_default_str();
  cmd->add_option("--weight-decay", c.optimizer.weight_decay, "Decoupled weight decay")
      ->capture_default_str();
  add_choice(cmd, "--grad-dtype", c.grad_dtype, parse_grad_dtype,
             "Gradients in the optimizer program: f32, bf16 (half the bytes reduced; f32 master "
             "weights), or auto (the faster of the two in the autotuner's records: --tune makes "
             "them)",
             dtype_name(c.grad_dtype.value()));
  add_choice(cmd, "--tp-dtype", c.tp_dtype, parse_tp_dtype,
             "What the tensor-parallel exchanges carry (--tp 2 or more): f32, bf16 (the epilogue's "
             "all-reduce and the backward's input-gradient sum in half the bytes; needs "
             "--precision bf16), or auto (the faster of the two in the autotuner's records: "
             "--tune makes them)",
             dtype_name(c.tp_dtype.value()));
  add_choice(cmd, "--grad-exchange", c.optimizer.exchange, parse_grad_exchange,
             "overlap: each bucket's data-parallel exchange and update start as soon as the "
             "backward is done "
             "with it; after: everything after the backward",
             parallel::grad_exchange_name(c.optimizer.exchange));
  cmd->add_option(
      "--bucket-mb", c.optimizer.bucket_mb,
      fmt::format("MiB of gradients per data-parallel exchange (whole blocks; default {})",
                  parallel::kDefaultBucketMiB));
  cmd->add_option("--clip-grad-norm", c.optimizer.clip_grad_norm,
                  "Scale the gradient down to this norm when its norm is larger (over the whole "
                  "model; off unless "
                  "given)");
  add_choice(cmd, "--shard", c.optimizer.sharding, parse_sharding,
             "What each data-parallel rank keeps 1/dp of: moments (ZeRO-1: the optimizer's "
             "moments) or weights (ZeRO-3: the blocks' weights, gradients and moments, each "
             "block's weights gathered before its forward and backward; docs/training.md)",
             parallel::sharding_name(c.optimizer.sharding));
  add_choice(cmd, "--gather-ahead", c.gather_ahead, parse_gather_ahead,
             "With --shard weights: how many blocks ahead of the one computing their weights are "
             "gathered (each adds a gathered block's memory), or auto: the fewest whose compute "
             "covers one gather, by the performance model's rates (docs/training.md)",
             "auto");
  add_choice(cmd, "--optimizer-state", c.optimizer.state_tier, parse_optimizer_state,
             "Where Adam's moments live: memory, host (a slow tier in host memory) or file:DIR (an "
             "O_DIRECT "
             "file), streamed through two staging slots around each bucket's update",
             "memory");
  add_grid_flags(cmd, c);
  add_precision_flag(cmd, c.model.matmul);
  add_attention_flag(cmd, c.model.attention);
  add_choice(cmd, "--backend", c.backend, parse_backend,
             "thread (ranks in this process) or mpi (under mpirun)", comm::backend_name(c.backend));
  add_choice(cmd, "--executor", c.executor, parse_executor,
             "How the DSL programs run: compiled (JIT), plan or reference",
             exec::runner_kind_name(c.executor));
  cmd->add_flag("--tune", c.tune, "Autotune every program's schedule for this run first (cached)");
  cmd->add_option(
      "--data", c.data,
      "Train on this text file (bytes as tokens) or folder of token shards (written by tandem "
      "tokenize); default: the built-in synthetic corpus");
  cmd->add_option("--val-fraction", c.validation_fraction,
                  "Fraction of the data held out for validation")
      ->capture_default_str();
  cmd->add_option("--eval-every", c.eval_every, "Validation loss every N steps (0: never)")
      ->capture_default_str();
  cmd->add_option("--eval-batches", c.eval_batches, "Batches per validation")
      ->capture_default_str();
  cmd->add_option("--save", c.save_dir,
                  "Write a checkpoint to DIR/step-<N> at the end (DIR/latest names the newest)");
  cmd->add_option("--save-every", c.save_every, "Also every N steps");
  cmd->add_option("--keep-checkpoints", c.keep_checkpoints,
                  "Keep the newest N checkpoints in --save DIR")
      ->capture_default_str();
  cmd->add_option(
      "--resume", c.resume_dir,
      "Continue from the checkpoint in DIR, or the newest of a --save folder (its model "
      "unless flags say otherwise)");
  cmd->add_option(
      "--init-from", c.init_from,
      "Start from the weights of a Hugging Face GPT-2, Llama or Qwen2 folder (config.json and "
      "model.safetensors or its shards, f32, bf16 or f16): its model, a fresh optimizer, step 0 "
      "(docs/training.md)");
  cmd->add_option("--metrics", c.metrics_path, "Write one JSON line per step to FILE");
  cmd->add_option("--trace", c.trace_path, "Write a Chrome trace (Perfetto) to FILE");
  cmd->add_flag("--quiet", flags->quiet, "Only the summary, no progress lines");
  cmd->add_option(
      "--comm-timeout", flags->comm_timeout,
      "Seconds a rank waits for its peers in one collective before the run fails naming "
      "the ranks that did not arrive (0: forever; default TANDEM_COMM_TIMEOUT, else 600)");
  CLI::Option* tier = add_memory_flags(cmd, c);
  GridFlags& g = flags->across;
  g.grid_opt = add_choice(
      cmd, "--grid", g.grid, parse_grid,
      "auto: train on the grid `tandem plan --ranks N` recommends (with --ranks N, and "
      "--memory-per-rank; it also chooses --shard and --memory-budget, and may stream the "
      "blocks to --model-state's tier)",
      "");
  add_across_flags(cmd, g);
  cmd->callback([flags, sizes, tier, cmd, run] {
    if (cmd->get_option("--val-fraction")->count() > 0 && data::is_shard_folder(flags->cfg.data))
      user_error(
          "--val-fraction applies to a text file; the validation split of '{}' was chosen by "
          "tandem tokenize (its --val-fraction)",
          flags->cfg.data);
    const GridFlags& g = flags->across;
    const bool across = g.grid;
    if (across && g.ranks_opt->count() == 0)
      user_error("--grid auto needs --ranks N: the number of ranks to choose a grid for");
    check_across_flags(
        g, across, "--grid auto", "--grid auto",
        {cmd->get_option("--dp"), cmd->get_option("--tp"), cmd->get_option("--pp"),
         cmd->get_option("--cp"), cmd->get_option("--stage-layers"), cmd->get_option("--shard"),
         cmd->get_option("--memory-budget"), cmd->get_option("--ooc-plan")});
    train::TrainConfig cfg = config_of(*flags, sizes, tier, across);
    if (across) cfg.grid_auto = grid_request(g);  // planned when the run is resolved
    if (run) return run(cfg);
    const train::TrainResult r = train::train(cfg);
    if (r.stopped_by_signal != 0) throw StoppedBySignal{r.stopped_by_signal};
  });
}

void add_plan(CLI::App& app, PlanRun run) {
  auto flags = std::make_shared<TrainFlags>();
  train::TrainConfig& c = flags->cfg;
  c.grid = {1, 1, 1};
  c.eval_every = 0;
  c.plan_only = true;
  auto* cmd = app.add_subcommand("plan",
                                 "Plan out-of-core training under a memory budget: per half block "
                                 "keep, swap or recompute, with the "
                                 "predicted step time and peak beside every single strategy's; "
                                 "with --ranks N, every grid of N ranks that fits "
                                 "--memory-per-rank, fastest first");
  const SizeOptions sizes = add_size_flags(cmd, *flags);
  add_grid_flags(cmd, c);
  add_precision_flag(cmd, c.model.matmul);
  add_attention_flag(cmd, c.model.attention);
  CLI::Option* tier = add_memory_flags(cmd, c);
  cmd->add_option("--trace", c.trace_path,
                  "Write the predicted timeline as a Chrome trace (Perfetto) to FILE");
  add_across_flags(cmd, flags->across);
  cmd->callback([flags, sizes, tier, cmd, run] {
    const GridFlags& g = flags->across;
    const bool across = g.ranks_opt->count() > 0;
    check_across_flags(g, across, "--ranks N", "--ranks",
                       {cmd->get_option("--dp"), cmd->get_option("--tp"), cmd->get_option("--pp"),
                        cmd->get_option("--cp"), cmd->get_option("--stage-layers"),
                        cmd->get_option("--memory-budget"), cmd->get_option("--ooc-plan"),
                        cmd->get_option("--trace")});
    if (!across) {
      if (cmd->get_option("--memory-budget")->count() == 0)
        user_error(
            "tandem plan needs --memory-budget (the out-of-core plan of one grid), or --ranks N "
            "(the plan across grids)");
      train::TrainConfig cfg = config_of(*flags, sizes, tier);
      if (run.one_grid) return run.one_grid(cfg);
      train::train(cfg);
      return;
    }
    train::TrainConfig cfg = config_of(*flags, sizes, tier, true);
    cfg.plan_only = false;
    const train::GridPlan plan = plan_across(g, cfg);
    if (run.across) return run.across(plan);
    std::cout << train::grid_plan_report(plan) << std::flush;
  });
}

}  // namespace tandem::cli
