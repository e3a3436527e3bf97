// The one description of a run's settings: every field of TrainConfig, and of the model and the
// optimizer it holds, with the flag that gives it, whether the ranks of a job must agree on it,
// its value as the ranks compare it, where meta.json keeps it and how the start-up lines state it.
// What is derived from it: the start-up check that the ranks agree, meta.json's model config,
// hyper-parameters and extra, a configuration written back as flags, and the start-up lines that
// list the settings not at their defaults and each auto's decision with its reason. A test holds
// the tables to the structs: a field added without an entry fails it. Internal to train/.
#pragma once

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/data/data.h"
#include "tandem/train/train_config.h"

namespace tandem::train::detail {

// Whether the ranks of a job must give a setting the same value.
enum class Ranks {
  Agree,      // compared at start-up (check_ranks_agree): ranks that differ stop the job
  MayDiffer,  // each process its own: a host's threads, its console, what a test asks back
  PerField,   // a struct whose fields each say (TrainConfig's model and optimizer)
};

// Where meta.json keeps a setting (io::RunMeta).
enum class Meta {
  None,             // not written
  Own,              // a field of RunMeta of its own: rng_seed, optimizer, the data's source
  ModelConfig,      // "model_config" (model_config_to_json)
  Hyperparameters,  // "optimizer"."hyperparameters"
  Extra,            // "extra"
};

// How the start-up lines state a setting (startup_lines).
enum class Startup {
  Listed,   // by the table: its flag and value when not the default's, an auto's with its reason
  OwnLine,  // by a line of report.cc's own (the header's model and grid, the learning rate, ...)
};

// Where an auto setting stands, for the start-up lines.
struct AutoState {
  bool undecided = false;  // left to tandem and not decided: it does not apply to this run
  std::string reason;      // why it was decided so; "" when given
};

// One field of the settings struct `S`. Its value as the ranks compare it may read `Context`
// too (the run's data is compared by what the corpus holds, not by its path).
template <typename S, typename... Context>
struct Setting {
  std::string_view field;  // the member, as the struct declares it
  std::string_view name;   // the flag that gives it ("--batch"), or what it is when none does
  Ranks ranks = Ranks::Agree;
  std::string (*text)(const S&, const Context&...) = nullptr;  // the value compared (Agree)
  Meta meta = Meta::None;
  std::string_view key = {};                   // its key in that part of meta.json
  nlohmann::json (*json)(const S&) = nullptr;  // its value there (null: left out)
  // The flags that give this value, none at the default (for a configuration the plan across
  // grids chooses); null where nothing writes the setting back as flags.
  std::vector<std::string> (*flags)(const S&) = nullptr;
  // Listed settings with a `text` show at start-up (settings with none are each process's own).
  Startup startup = Startup::Listed;
  // An auto's (Auto<T>) state; null for other settings.
  AutoState (*auto_state)(const S&) = nullptr;
};

using ModelSetting = Setting<nn::GPTConfig>;
using OptimizerSetting = Setting<parallel::OptimizerConfig>;
using RunSetting = Setting<TrainConfig, data::Corpus>;

// Every field of nn::GPTConfig, of parallel::OptimizerConfig and of TrainConfig, in the order
// the structs declare them. TrainConfig's `model` and `optimizer` entries stand for the two
// tables before it.
std::span<const ModelSetting> model_settings();
std::span<const OptimizerSetting> optimizer_settings();
std::span<const RunSetting> run_settings();

// The settings every rank must share, as (name, value) pairs in the tables' order.
std::vector<std::pair<std::string, std::string>> agreeing_settings(const TrainConfig& config,
                                                                   const data::Corpus& corpus);

// Exchanges agreeing_settings() over `world` (a collective: every rank calls it) and, where any
// differ, throws on every rank the same comm::CollectiveError naming each flag, the ranks and
// their values: "the ranks disagree on --steps: ranks 0 and 2 give 30, rank 1 gives 40".
void check_ranks_agree(comm::Communicator& world, const TrainConfig& config,
                       const data::Corpus& corpus);

// The same check over the named fields of TrainConfig only (each one the ranks compare, whose
// value does not read the data; "model" and "optimizer" stand for their tables' fields): for
// what must agree before the rest can be compared, such as whether --grid auto is planned or a
// dtype's auto decided (collectives the ranks must all make or all skip).
void check_ranks_agree_on(comm::Communicator& world, const TrainConfig& config,
                          std::initializer_list<std::string_view> fields);

// The start-up lines the tables give (for world rank 0 to print): "  other settings: --steps 30,
// --eval-every 0", every Listed setting whose value is not a default TrainConfig's, as its name
// and its value as the ranks compare it (the settings are about fifty and most stay at their
// defaults, and report.cc's own lines state the model, grid, precision, learning rate, programs
// and memory: what else differs is what is worth a line; `tandem train`'s own defaults, 300 steps,
// show); then a line for each auto decided, "  --grad-dtype f32 (reason)". An auto not decided
// does not apply to the run and is left out. "" when there is nothing to say.
std::string startup_lines(const TrainConfig& config, const data::Corpus& corpus);

// One part of meta.json: the settings the tables place there, by their keys.
nlohmann::json model_config_json(const nn::GPTConfig& model);
nlohmann::json meta_json(Meta part, const TrainConfig& config);

// The flags that give `config`'s values of the named fields, in the order named.
std::vector<std::string> flags_for(const TrainConfig& config,
                                   std::span<const std::string_view> fields);

}  // namespace tandem::train::detail
