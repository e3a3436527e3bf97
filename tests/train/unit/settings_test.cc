// The settings table against the structs it describes (every field has an entry, saying whether
// the ranks must agree on it), and what is derived from it: meta.json's parts, the plan's flags,
// the start-up lines, and the start-up check that every rank was given the same training flags
// (in-process ranks, each handed its own config, agree or all fail with one message naming the
// flag, the ranks and their values).
#include "../../../src/train/settings.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tandem/comm/thread.h"
#include "tandem/train/grid_plan.h"
#include "train/test_util.h"

namespace tandem::train {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// ------------------------------------------------------------------ the table against the structs

template <typename T>
constexpr bool kIsAuto = false;
template <typename T>
constexpr bool kIsAuto<Auto<T>> = true;

template <typename T>
constexpr bool kIsFunction = false;
template <typename R, typename... A>
constexpr bool kIsFunction<std::function<R(A...)>> = true;

// Converts to the type of any member, in a braced initializer (`{AnyMember{}}`); an Auto<T>
// member takes it through its constructor from T, a std::function member as a null function
// (a conversion to either too would be ambiguous).
struct AnyMember {
  template <typename T>
  requires(!kIsAuto<T> && !kIsFunction<T>) operator T() const;
};

template <typename T, size_t... I>
constexpr bool braces_take(std::index_sequence<I...>) {
  return requires { T{{(void(I), AnyMember{})}...}; };
}

// The fields of the aggregate T: the most initializers T{...} takes, one a member.
template <typename T, size_t N = 0>
constexpr size_t field_count() {
  if constexpr (braces_take<T>(std::make_index_sequence<N + 1>()))
    return field_count<T, N + 1>();
  else
    return N;
}

struct FourFields {
  int a = 0;
  std::optional<double> b;
  std::string c;
  Auto<int> d;
};
static_assert(field_count<FourFields>() == 4);
// The grid entry (settings.cc) compares, keeps and writes back all five: dp, tp, pp, cp and the
// stages' layers.
static_assert(field_count<parallel::GridShape>() == 5);

// Each field of a struct has one entry, named once, which says whether the ranks agree on it and,
// when they must, how its value is compared; an entry placed in meta.json has a key and a value.
template <typename Table>
void expect_covers(const Table& table, size_t fields, const std::string& what) {
  EXPECT_EQ(table.size(), fields)
      << what << " has " << fields << " fields and the settings table (src/train/settings.cc) "
      << table.size() << " entries: give each field an entry saying whether the ranks must agree";
  std::set<std::string_view> names;
  for (const auto& e : table) {
    EXPECT_TRUE(names.insert(e.field).second) << what << "." << e.field << " has two entries";
    EXPECT_FALSE(e.name.empty()) << e.field;
    EXPECT_EQ(e.text != nullptr, e.ranks == detail::Ranks::Agree)
        << what << "." << e.field << ": a value is compared exactly when the ranks must agree";
    const bool in_json = e.meta != detail::Meta::None && e.meta != detail::Meta::Own;
    EXPECT_EQ(e.json != nullptr, in_json) << what << "." << e.field;
    EXPECT_EQ(!e.key.empty(), e.meta != detail::Meta::None) << what << "." << e.field;
  }
}

TEST(Settings, EveryFieldOfTheConfigHasAnEntry) {
  expect_covers(detail::model_settings(), field_count<nn::GPTConfig>(), "nn::GPTConfig");
  expect_covers(detail::optimizer_settings(), field_count<parallel::OptimizerConfig>(),
                "parallel::OptimizerConfig");
  expect_covers(detail::run_settings(), field_count<TrainConfig>(), "TrainConfig");
  std::vector<std::string_view> per_field;
  for (const detail::RunSetting& e : detail::run_settings())
    if (e.ranks == detail::Ranks::PerField) per_field.push_back(e.field);
  EXPECT_EQ(per_field, (std::vector<std::string_view>{"model", "optimizer"}));
}

TEST(Settings, TheAgreementComparesEverySettingTheRanksMustShare) {
  const TrainConfig c = testing::tiny_run(3);
  std::set<std::string> compared;
  for (const auto& [name, value] :
       detail::agreeing_settings(c, data::make_corpus(std::string(600, 'a'), "a")))
    EXPECT_TRUE(compared.insert(name).second) << name << " compared twice";
  size_t agreeing = 0;
  auto count = [&](const auto& table) {
    for (const auto& e : table)
      if (e.ranks == detail::Ranks::Agree) {
        ++agreeing;
        EXPECT_TRUE(compared.count(std::string(e.name))) << e.field;
      }
  };
  count(detail::model_settings());
  count(detail::optimizer_settings());
  count(detail::run_settings());
  EXPECT_EQ(compared.size(), agreeing);
  for (const char* name : {"--threads (each host's cores)", "--quiet"})
    EXPECT_FALSE(compared.count(name)) << name;
}

// A setting left to tandem: a given value has no reason and is never decided; an auto is decided
// once, with its reason, and is not read before.
TEST(AutoSetting, IsGivenOrDecidedOnceWithItsReason) {
  const Auto<int> given = 3;
  EXPECT_FALSE(given.is_auto());
  EXPECT_EQ(given.value(), 3);
  EXPECT_EQ(given.reason(), "");
  Auto<int> a;
  EXPECT_TRUE(a.is_auto());
  EXPECT_FALSE(a.known());
  EXPECT_EQ(a.value_or(1), 1);
  EXPECT_THROW(a.value(), InternalError);
  a.decide(2, "two, because");
  EXPECT_EQ(a.value(), 2);
  EXPECT_EQ(a.reason(), "two, because");
  EXPECT_TRUE(a.is_auto());
  EXPECT_THROW(a.decide(3, "again"), InternalError);
  Auto<int> g = 4;
  EXPECT_THROW(g.decide(5, "a given one"), InternalError);
}

// ------------------------------------------------------------------------------- start-up

// The start-up lines are the table's: every Listed setting whose value is not a default
// config's is named by its entry's name with its entry's text, none at its default is, an auto
// decided gets a line with the table's value and its reason, and one still undecided (it does not
// apply) is left out. A setting added to the table shows here without report.cc knowing it.
TEST(Settings, TheStartUpLinesComeFromTheTable) {
  const data::Corpus corpus = data::make_corpus(std::string(600, 'a'), "a");
  EXPECT_EQ(detail::startup_lines(TrainConfig{}, corpus), "")
      << "nothing differs from the defaults";
  TrainConfig c = testing::tiny_run(30);
  c.seed = 7;
  c.eval_every = 0;
  c.save_dir = "ck";
  c.model.dropout = 0.1f;
  c.optimizer.beta1 = 0.8;
  c.grad_dtype = Auto<DType>();
  c.grad_dtype.decide(DType::BF16, "--grad-dtype auto: because");
  c.tp_dtype = Auto<DType>();  // one tensor-parallel rank: never decided
  const std::string lines = detail::startup_lines(c, corpus);
  const std::string first = lines.substr(0, lines.find('\n'));
  EXPECT_THAT(first, HasSubstr("  other settings: "));
  const TrainConfig d;
  size_t listed = 0;
  auto check = [&](const auto& table, const auto& s, const auto& def, const auto&... in) {
    for (const auto& e : table) {
      if (e.text == nullptr || e.ranks == detail::Ranks::PerField || e.auto_state != nullptr)
        continue;
      const std::string item = fmt::format("{} {}", e.name, e.text(s, in...));
      const bool changed = e.text(s, in...) != e.text(def, in...);
      if (e.startup == detail::Startup::Listed && changed) {
        ++listed;
        EXPECT_THAT(first, HasSubstr(item)) << e.field;
      } else {
        EXPECT_THAT(first, Not(HasSubstr(item)))
            << e.field << (changed ? ": has a line of its own" : ": at its default");
      }
    }
  };
  check(detail::model_settings(), c.model, d.model);
  check(detail::optimizer_settings(), c.optimizer, d.optimizer);
  check(detail::run_settings(), c, d, corpus);
  // --steps, --seed, --eval-every, --save, the synthetic corpus's size, --dropout, --beta1.
  EXPECT_GE(listed, 7u);
  EXPECT_THAT(first, HasSubstr("--steps 30"));
  EXPECT_THAT(first, HasSubstr("--beta1 0.8"));
  EXPECT_THAT(first, Not(HasSubstr("--batch")))
      << "the header states the batch (an own-line setting)";
  EXPECT_THAT(lines, HasSubstr("\n  --grad-dtype bf16 (--grad-dtype auto: because)\n"));
  EXPECT_THAT(lines, Not(HasSubstr("--tp-dtype")));
}

// ------------------------------------------------------------------------------- meta.json

TEST(Settings, MetaJsonHoldsTheHyperparametersAndTheRun) {
  TrainConfig c = testing::tiny_run(30);
  c.optimizer.clip_grad_norm = 1.5;
  c.grad_dtype = DType::BF16;
  EXPECT_EQ(detail::meta_json(detail::Meta::Hyperparameters, c),
            (nlohmann::json{{"beta1", 0.9},
                            {"beta2", 0.95},
                            {"eps", 1e-8},
                            {"weight_decay", 0.0},
                            {"grad_dtype", "bf16"},
                            {"clip_grad_norm", 1.5},
                            {"lr", 1e-2},
                            {"warmup", 2},
                            {"min_lr_ratio", 0.1}}));
  c.optimizer.clip_grad_norm.reset();
  EXPECT_FALSE(detail::meta_json(detail::Meta::Hyperparameters, c).contains("clip_grad_norm"));
  c.grid = {2, 1, 2};
  EXPECT_EQ(detail::meta_json(detail::Meta::Extra, c),
            (nlohmann::json{{"batch", 4},
                            {"steps", 30},
                            {"micro_batches", c.micro_batch_count()},
                            {"grid", {{"dp", 2}, {"tp", 1}, {"pp", 2}}},
                            {"validation_fraction", 0.1}}));
}

TEST(Settings, MetaJsonHoldsAGpt2ModelsSizesAndALlamasFieldsToo) {
  nn::GPTConfig m = testing::tiny_run(1).model;
  const nlohmann::json gpt2 = {{"vocab_size", 256}, {"n_layers", 2}, {"n_heads", 2},
                               {"d_model", 16},     {"seq_len", 16}, {"max_positions", 16},
                               {"dropout", 0.0f}};
  EXPECT_EQ(detail::model_config_json(m), gpt2);
  m.arch = nn::Arch::Llama;
  m.kv_heads = 1;
  m.rope_scaling = {nn::RopeType::Llama3, 32.0, 1.0, 4.0, 8192};
  nlohmann::json llama = gpt2;
  llama.update({{"arch", "llama"},
                {"kv_heads", 1},
                {"ffn", 64},
                {"norm_eps", 1e-5f},
                {"rope_theta", 10000.0},
                {"rope_scaling",
                 {{"rope_type", "llama3"},
                  {"factor", 32.0},
                  {"low_freq_factor", 1.0},
                  {"high_freq_factor", 4.0},
                  {"original_max_position_embeddings", 8192}}},
                {"qkv_bias", false},
                {"tie_embeddings", true}});
  EXPECT_EQ(detail::model_config_json(m), llama);
}

TEST(Settings, AConfigurationIsWrittenBackAsTheFlagsThatAskForIt) {
  TrainConfig c = testing::tiny_run(1);
  c.grid = {2, 1, 2};
  static constexpr std::string_view kFields[] = {"grid", "sharding", "gather_ahead", "model_state",
                                                 "memory_budget"};
  EXPECT_EQ(detail::flags_for(c, kFields),
            (std::vector<std::string>{"--dp", "2", "--tp", "1", "--pp", "2"}));
  c.optimizer.sharding = parallel::Sharding::Weights;
  c.gather_ahead = 2;
  c.model_state = ooc::TierSpec{};
  c.memory_budget = "1GiB";
  EXPECT_EQ(detail::flags_for(c, kFields),
            (std::vector<std::string>{"--dp", "2", "--tp", "1", "--pp", "2", "--shard", "weights",
                                      "--gather-ahead", "2", "--model-state", "host",
                                      "--memory-budget", "1GiB"}));
}

// --cp is part of the grid: in meta.json, the flags and the ranks' comparison where it is not 1
// (a run without it writes what it always wrote).
TEST(Settings, TheGridsCpIsKeptWhereItIsGiven) {
  TrainConfig c = testing::tiny_run(1);
  c.grid = {2, 1, 1, 2};
  EXPECT_EQ(detail::meta_json(detail::Meta::Extra, c)["grid"],
            (nlohmann::json{{"dp", 2}, {"tp", 1}, {"pp", 1}, {"cp", 2}}));
  static constexpr std::string_view kGrid[] = {"grid"};
  EXPECT_EQ(detail::flags_for(c, kGrid),
            (std::vector<std::string>{"--dp", "2", "--tp", "1", "--pp", "1", "--cp", "2"}));
  bool compared = false;
  for (const auto& [name, value] :
       detail::agreeing_settings(c, data::make_corpus(std::string(600, 'a'), "a")))
    if (name == "the grid (--dp, --tp, --pp, --cp, --stage-layers)") {
      EXPECT_EQ(value, "dp=2 tp=1 pp=1 cp=2");
      compared = true;
    }
  EXPECT_TRUE(compared);
}

// --stage-layers likewise: in meta.json, the flags and the ranks' comparison where given.
TEST(Settings, TheStagesLayersAreKeptWhereTheyAreGiven) {
  TrainConfig c = testing::tiny_run(1);
  c.model.n_layers = 3;
  c.grid = {1, 1, 2};
  c.grid.stage_layers = {1, 2};
  EXPECT_EQ(detail::meta_json(detail::Meta::Extra, c)["grid"],
            (nlohmann::json{{"dp", 1}, {"tp", 1}, {"pp", 2}, {"stage_layers", {1, 2}}}));
  static constexpr std::string_view kGrid[] = {"grid"};
  EXPECT_EQ(detail::flags_for(c, kGrid), (std::vector<std::string>{"--dp", "1", "--tp", "1", "--pp",
                                                                   "2", "--stage-layers", "1,2"}));
  bool compared = false;
  for (const auto& [name, value] :
       detail::agreeing_settings(c, data::make_corpus(std::string(600, 'a'), "a")))
    if (name == "the grid (--dp, --tp, --pp, --cp, --stage-layers)") {
      EXPECT_EQ(value, "dp=1 tp=1 pp=2 stage-layers=1,2");
      compared = true;
    }
  EXPECT_TRUE(compared);
}

// --------------------------------------------------------------- the ranks' agreement

// Runs the check on `configs.size()` in-process ranks, rank r with configs[r] and corpora[r]
// (default: one corpus for all); "" when they agree, else the message (every rank must throw).
std::string disagreement(const std::vector<TrainConfig>& configs,
                         std::vector<data::Corpus> corpora = {}) {
  if (corpora.empty())
    corpora.assign(configs.size(), data::make_corpus(std::string(600, 'a'), "a"));
  const int n = static_cast<int>(configs.size());
  std::vector<std::string> messages(n);
  comm::run_ranks(n, [&](comm::Communicator& world) {
    const int r = world.rank();
    try {
      detail::check_ranks_agree(world, configs[r], corpora[r]);
    } catch (const comm::CollectiveError& e) {
      messages[r] = e.what();
    }
  });
  for (int r = 1; r < n; ++r) EXPECT_EQ(messages[r], messages[0]) << "rank " << r;
  return messages[0];
}

TEST(ConfigAgreement, RanksWithTheSameFlagsPass) {
  const TrainConfig c = testing::tiny_run(3);
  EXPECT_EQ(disagreement({c, c, c}), "");
  EXPECT_EQ(disagreement({c}), "");
}

TEST(ConfigAgreement, ADifferentStepCountIsNamedWithTheRanksAndValues) {
  TrainConfig c = testing::tiny_run(30);
  TrainConfig d = c;
  d.steps = 40;
  EXPECT_THAT(disagreement({c, d, c}),
              HasSubstr("the ranks disagree on --steps: ranks 0 and 2 give 30, rank 1 gives 40"));
}

TEST(ConfigAgreement, EveryDisagreeingFlagIsNamed) {
  TrainConfig c = testing::tiny_run(3);
  TrainConfig d = c;
  d.optimizer.kind = parallel::OptimizerKind::Lamb;
  d.lr = 0.5;
  d.seed = 7;
  d.save_dir = "elsewhere";
  d.model.matmul = DType::BF16;  // --precision auto on a CPU with native bf16 among ones without
  d.optimizer.sharding = parallel::Sharding::Weights;
  const std::string m = disagreement({c, c, c, d});
  EXPECT_THAT(m, HasSubstr("--optimizer: ranks 0-2 give adamw, rank 3 gives lamb"));
  EXPECT_THAT(m, HasSubstr("--lr: ranks 0-2 give 0.01, rank 3 gives 0.5"));
  EXPECT_THAT(m, HasSubstr("--seed: ranks 0-2 give 1, rank 3 gives 7"));
  EXPECT_THAT(m, HasSubstr("--save: ranks 0-2 give none, rank 3 gives elsewhere"));
  EXPECT_THAT(m, HasSubstr("--precision: ranks 0-2 give fp32, rank 3 gives bf16"));
  EXPECT_THAT(m, HasSubstr("--shard: ranks 0-2 give moments, rank 3 gives weights"));
  EXPECT_THAT(m, Not(HasSubstr("--steps")));
}

TEST(ConfigAgreement, DifferentDataIsNamedByItsFingerprint) {
  const TrainConfig c = testing::tiny_run(3);
  const std::string m = disagreement({c, c}, {data::make_corpus(std::string(600, 'a'), "a"),
                                              data::make_corpus(std::string(600, 'b'), "a")});
  EXPECT_THAT(m, HasSubstr("the ranks disagree on --data: rank 0 gives 600 tokens, fingerprint"));
}

// Under MPI each process resolves its own flags; rank 0 plans --grid auto in a broadcast the
// others must join, so ranks given an explicit grid beside it stop before, naming the grid.
TEST(ConfigAgreement, GridAutoOnSomeRanksStopsTheResolveOnEveryRank) {
  TrainConfig c = testing::tiny_run(3);
  c.grid = {2, 1, 1};
  TrainConfig a = c;
  a.grid_auto = TrainConfig::GridAuto{.ranks = 2, .memory_per_rank = 1ull << 30, .link_gbps = {}};
  std::vector<std::string> messages(2);
  comm::run_ranks(2, [&](comm::Communicator& world) {
    try {
      resolve(world.rank() == 0 ? a : c, &world);
    } catch (const comm::CollectiveError& e) {
      messages[world.rank()] = e.what();
    }
  });
  EXPECT_EQ(messages[1], messages[0]);
  EXPECT_THAT(messages[0], HasSubstr("the ranks disagree on --grid auto (--ranks, "
                                     "--memory-per-rank, --link-gbps): rank 0 gives 2 ranks"));
  EXPECT_THAT(messages[0], HasSubstr("rank 1 gives off"));
}

// Whether the dtypes' autos are decided in resolve decides which collectives follow too: ranks
// given --tp-dtype auto beside ranks given a dtype stop before them, naming the flag.
TEST(ConfigAgreement, ADtypeAutoOnSomeRanksStopsTheResolveOnEveryRank) {
  TrainConfig c = testing::tiny_run(3);
  c.grid = {1, 2, 1};
  c.model.matmul = DType::BF16;
  TrainConfig a = c;
  a.tp_dtype = Auto<DType>();
  std::vector<std::string> messages(2);
  comm::run_ranks(2, [&](comm::Communicator& world) {
    try {
      resolve(world.rank() == 0 ? a : c, &world);
    } catch (const comm::CollectiveError& e) {
      messages[world.rank()] = e.what();
    }
  });
  EXPECT_EQ(messages[1], messages[0]);
  EXPECT_THAT(messages[0],
              HasSubstr("the ranks disagree on --tp-dtype: rank 0 gives auto, rank 1 gives f32"));
}

TEST(ConfigAgreement, PerHostSettingsMayDiffer) {
  TrainConfig c = testing::tiny_run(3);
  TrainConfig d = c;
  d.blas_threads = 4;
  d.progress = !c.progress;
  EXPECT_EQ(disagreement({c, d}), "");
}

}  // namespace
}  // namespace tandem::train
