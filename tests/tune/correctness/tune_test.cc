// The autotuner end to end on in-process ranks: it checks every schedule against the reference,
// picks the schedule with the smallest median (made known here by slowing the others down), drops
// schedules whose results are wrong or whose set-up fails, and a second tune of the same key
// reads the cache and compiles nothing. The final round times the leading schedules again in
// turns and picks by those times (made known here by scripting each schedule's delay).
#include "tandem/tune/tune.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "support/slowed_runner.h"
#include "tandem/core/error.h"
#include "tandem/dsl/dsl.h"
#include "tandem/exec/jit.h"
#include "tandem/schedule/enumerate.h"
#include "tune/tune_testing.h"

namespace tandem::tune {
namespace {

// An executor that runs the plan runner but makes chosen schedules slower, wrong, or unable to
// set up, so that the tuner's choices have a known right answer.
struct Rigged {
  std::string fast;    // every other schedule sleeps `delay` per run
  std::string wrong;   // its results are off by 1 in one element
  std::string broken;  // its set-up throws
  std::chrono::milliseconds delay{15};
};

class RiggedExecutor final : public Executor {
 public:
  explicit RiggedExecutor(Rigged r)
      : r_(std::move(r)), inner_(executor_of(exec::RunnerKind::Plan)) {}
  std::string name() const override { return "rigged"; }
  std::unique_ptr<exec::Runner> prepare(const schedule::Plan& plan, comm::Communicator& comm,
                                        const dsl::SymbolMap& symbols,
                                        size_t chunk_bytes) override {
    if (plan.name == r_.broken) user_error("cannot set up '{}' (on purpose)", plan.name);
    testing::SlowedRunner::Alter wrong;
    if (plan.name == r_.wrong)
      wrong = [](exec::TensorMap& out) {
        if (out.empty()) return;
        const Tensor& t = out.begin()->second;
        if (t.numel() > 0) t.set(t.numel() / 2, t.get(t.numel() / 2) + 1.0f);
      };
    return std::make_unique<testing::SlowedRunner>(
        inner_->prepare(plan, comm, symbols, chunk_bytes),
        plan.name == r_.fast ? std::chrono::milliseconds(0) : r_.delay, std::move(wrong));
  }

 private:
  Rigged r_;
  std::unique_ptr<Executor> inner_;
};

// An executor that runs the plan runner and then sleeps a scripted delay per schedule: `first`
// while a schedule is set up for the first time on a rank (its check and first pass, when the
// check sizes are the tuned ones), `final` once set up again (the final round). Each rank logs the
// schedules it runs in the final round, in order.
struct Script {
  std::map<std::string, std::pair<int, int>> ms;  // name -> (first, final) delay in ms
  int other_ms = 60;                              // the first-pass delay of the unlisted schedules
};

class ScriptedExecutor final : public Executor {
 public:
  explicit ScriptedExecutor(Script s)
      : s_(std::move(s)), inner_(executor_of(exec::RunnerKind::Plan)) {}
  std::string name() const override { return "scripted"; }
  std::unique_ptr<exec::Runner> prepare(const schedule::Plan& plan, comm::Communicator& comm,
                                        const dsl::SymbolMap& symbols,
                                        size_t chunk_bytes) override {
    int generation = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      generation = ++prepared_[{plan.name, comm.rank()}];
    }
    auto it = s_.ms.find(plan.name);
    const int delay = it == s_.ms.end() ? s_.other_ms
                      : generation == 1 ? it->second.first
                                        : it->second.second;
    std::vector<std::string>* log = nullptr;
    if (generation > 1) {
      std::lock_guard<std::mutex> lock(mu_);
      log = &final_log_[comm.rank()];
    }
    // Only this rank's thread touches its log.
    return std::make_unique<testing::SlowedRunner>(
        inner_->prepare(plan, comm, symbols, chunk_bytes), std::chrono::milliseconds(delay),
        testing::SlowedRunner::Alter{}, [log, name = plan.name] {
          if (log != nullptr) log->push_back(name);
        });
  }
  // The schedules rank `rank` ran in the final round, warm-up included, in order.
  std::vector<std::string> final_log(int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    return final_log_[rank];
  }

 private:
  Script s_;
  std::unique_ptr<Executor> inner_;
  std::mutex mu_;
  std::map<std::pair<std::string, int>, int> prepared_;
  std::map<int, std::vector<std::string>> final_log_;
};

std::vector<std::string> names_of(const dsl::Program& p) {
  std::vector<std::string> out;
  for (const auto& s : schedule::enumerate_schedules(p)) out.push_back(s.name);
  return out;
}

TuneOptions small(int64_t n) {
  TuneOptions o;
  o.sizes = {{"N", n}};
  o.reps = 3;
  o.warmup = 1;
  return o;
}

TEST(Tune, PicksTheScheduleWithTheSmallestMedian) {
  testing::TempCacheDir dir("pick");
  const dsl::Program adam = dsl::workloads::adam(DType::BF16);
  const auto names = names_of(adam);
  ASSERT_GE(names.size(), 3u);
  // Whichever schedule is made the fast one wins: the last, then one in the middle. The others
  // sleep 50 ms a run, more than a busy machine's scheduling delays, so the median decides.
  for (const std::string& fast : {names.back(), names[names.size() / 2]}) {
    TuneOptions o = small(1001);
    o.executor =
        std::make_shared<RiggedExecutor>(Rigged{fast, "", "", std::chrono::milliseconds(50)});
    o.write_cache = false;
    const TuneResult r = tune_threads(adam, 2, o);
    EXPECT_FALSE(r.from_cache);
    EXPECT_EQ(r.record.winner, fast);
    ASSERT_EQ(r.record.candidates.size(), names.size());
    for (size_t i = 0; i < names.size(); ++i) {
      const CandidateTiming& c = r.record.candidates[i];
      EXPECT_EQ(c.name, names[i]);
      EXPECT_TRUE(c.ok) << c.name << ": " << c.error;
      EXPECT_EQ(c.times.size(), 3u);
      // Never slower than the best it timed.
      EXPECT_LE(r.winner().median(), c.median()) << c.name;
      EXPECT_FALSE(c.retimed()) << c.name;  // no other schedule near the fast one
    }
    EXPECT_EQ(r.baseline().name, "AR-C");
    EXPECT_DOUBLE_EQ(r.speedup(r.baseline()), 1.0);
    EXPECT_GT(r.speedup(r.winner()), 1.0);
    EXPECT_TRUE(r.cache_file.empty());
    EXPECT_FALSE(std::filesystem::exists(dir.path() / "tune"));
  }
}

// Three schedules lead the first pass within the margin (a, then b and c 15 and 30 ms behind); in
// the final round b is the fastest. The tuner times the leaders again in turns, b wins, and the
// schedules outside the margin (d, 5x behind, like the rest) are not timed again. With a cap of
// two, only the two fastest of the first pass (a and b) are. The gaps are wide enough that a busy
// machine's oversleeping does not reorder them.
TEST(Tune, FinalRoundTimesTheLeadersInTurnsAndPicksByTheirMedian) {
  testing::TempCacheDir dir("final");
  const dsl::Program adam = dsl::workloads::adam(DType::F32);
  const auto names = names_of(adam);
  ASSERT_GE(names.size(), 6u);
  const std::string a = names[1], b = names[2], c = names[3], d = names[4];
  for (const int cap : {4, 2}) {
    SCOPED_TRACE(fmt::format("final_max {}", cap));
    Script script;
    script.ms = {{a, {40, 120}}, {b, {55, 40}}, {c, {70, 80}}, {d, {200, 200}}};
    script.other_ms = 200;
    auto executor = std::make_shared<ScriptedExecutor>(script);
    TuneOptions o = small(1001);
    o.executor = executor;
    o.write_cache = false;
    o.final_margin = 1.25;  // the cut at 90 ms: c (70) 20 ms inside, d (200) far outside
    o.final_max = cap;
    o.final_reps = 4;
    o.chunk_bytes = {};  // the final round alone in the log
    const TuneResult r = tune_threads(adam, 2, o);
    ASSERT_EQ(r.record.check_sizes, o.sizes);  // one set-up per schedule before the final round
    const std::vector<std::string> finalists =
        cap == 4 ? std::vector<std::string>{a, b, c} : std::vector<std::string>{a, b};
    for (const CandidateTiming& t : r.record.candidates) {
      EXPECT_TRUE(t.ok) << t.name << ": " << t.error;
      EXPECT_EQ(t.times.size(), 3u) << t.name;
      const bool finalist =
          std::find(finalists.begin(), finalists.end(), t.name) != finalists.end();
      EXPECT_EQ(t.final_times.size(), finalist ? 4u : 0u) << t.name;
    }
    EXPECT_EQ(r.record.winner, b);
    EXPECT_EQ(r.record.final_reps, 4);
    EXPECT_EQ(r.record.final_max, cap);
    EXPECT_DOUBLE_EQ(r.record.final_margin, 1.25);
    // a led the first pass, but b's interleaved median is the smallest.
    EXPECT_LT(r.record.candidates[1].median(), r.record.candidates[2].median());
    EXPECT_LT(r.winner().final_median(), r.record.candidates[1].final_median());
    // In turns: one warm-up turn, then four timed ones, each over the finalists in order; and
    // every rank ran the same finalists in the same order.
    std::vector<std::string> turns;
    for (int i = 0; i < 1 + 4; ++i) turns.insert(turns.end(), finalists.begin(), finalists.end());
    EXPECT_EQ(executor->final_log(0), turns);
    EXPECT_EQ(executor->final_log(1), turns);
  }
}

// One schedule far ahead of the rest: no final round, the first pass decides.
TEST(Tune, NoFinalRoundWhenOneScheduleLeadsClearly) {
  testing::TempCacheDir dir("nofinal");
  const dsl::Program adam = dsl::workloads::adam(DType::F32);
  const auto names = names_of(adam);
  Script script;
  script.ms = {{names[1], {5, 5}}};
  script.other_ms = 30;
  auto executor = std::make_shared<ScriptedExecutor>(script);
  TuneOptions o = small(1001);
  o.executor = executor;
  o.write_cache = false;
  o.chunk_bytes = {};  // the final round alone in the log
  const TuneResult r = tune_threads(adam, 2, o);
  EXPECT_EQ(r.record.winner, names[1]);
  EXPECT_EQ(r.record.final_reps, 0);
  for (const auto& t : r.record.candidates) EXPECT_FALSE(t.retimed()) << t.name;
  EXPECT_TRUE(executor->final_log(0).empty());
}

TEST(Tune, WrongOrBrokenSchedulesNeverWin) {
  testing::TempCacheDir dir("wrong");
  const dsl::Program adam = dsl::workloads::adam(DType::F32);
  const auto names = names_of(adam);
  ASSERT_GE(names.size(), 3u);
  // The wrong schedule would be the fastest; the broken one cannot be set up.
  TuneOptions o = small(999);
  o.executor = std::make_shared<RiggedExecutor>(
      Rigged{names[1], names[1], names[2], std::chrono::milliseconds(5)});
  const TuneResult r = tune_threads(adam, 2, o);
  const CandidateTiming& wrong = r.record.candidates[1];
  EXPECT_FALSE(wrong.ok);
  EXPECT_NE(wrong.error.find("differs from the reference in 1 of"), std::string::npos)
      << wrong.error;
  EXPECT_TRUE(wrong.times.empty());
  const CandidateTiming& broken = r.record.candidates[2];
  EXPECT_FALSE(broken.ok);
  EXPECT_NE(broken.error.find("set-up failed: cannot set up '" + names[2] + "' (on purpose)"),
            std::string::npos)
      << broken.error;
  EXPECT_NE(r.record.winner, names[1]);
  EXPECT_NE(r.record.winner, names[2]);
  EXPECT_TRUE(r.winner().ok);
  // The failures are recorded in the cache, and the record reads back the same.
  TuneOptions again = o;
  const TuneResult cached = tune_threads(adam, 2, again);
  EXPECT_TRUE(cached.from_cache);
  EXPECT_EQ(cached.record.winner, r.record.winner);
  EXPECT_EQ(cached.record.candidates[1].error, wrong.error);
}

TEST(Tune, CompiledSecondTuneReadsTheCacheAndCompilesNothing) {
  testing::TempCacheDir dir("compiled");
  const dsl::Program adam = dsl::workloads::adam(DType::BF16);
  const auto names = names_of(adam);
  // The baseline and the fused schedule (compiling every schedule would take minutes).
  std::string fused;
  for (const auto& n : names)
    if (n.rfind("fused(RS-C-AG)", 0) == 0) fused = n;
  ASSERT_FALSE(fused.empty()) << "no fused(RS-C-AG) schedule among the enumerated ones";
  TuneOptions o = small(4099);
  o.only = {fused};
  const exec::JitStats s0 = exec::jit_stats();
  const TuneResult first = tune_threads(adam, 2, o);
  EXPECT_FALSE(first.from_cache);
  ASSERT_EQ(first.record.candidates.size(), 2u);
  EXPECT_EQ(first.record.candidates[0].name, "AR-C");
  EXPECT_EQ(first.record.candidates[1].name, fused);
  for (const auto& c : first.record.candidates) EXPECT_TRUE(c.ok) << c.name << ": " << c.error;
  EXPECT_EQ(first.record.key.executor, "compiled");
  EXPECT_EQ(first.record.key.backend, "thread");
  EXPECT_EQ(first.record.key.ranks, 2);
  EXPECT_GE(first.compiles, 2);  // a fresh JIT cache: each schedule compiled once
  EXPECT_EQ(exec::jit_stats().compiles - s0.compiles, first.compiles);
  EXPECT_TRUE(std::filesystem::exists(first.cache_file));
  EXPECT_EQ(first.cache_file.rfind(dir.str(), 0), 0u)
      << first.cache_file;  // under the JIT's folder

  const exec::JitStats s1 = exec::jit_stats();
  const TuneResult second = tune_threads(adam, 2, o);
  const exec::JitStats s2 = exec::jit_stats();
  EXPECT_TRUE(second.from_cache);
  EXPECT_EQ(second.compiles, 0);
  EXPECT_EQ(s2.compiles, s1.compiles);
  EXPECT_EQ(s2.disk_hits, s1.disk_hits);  // nothing even loaded
  EXPECT_EQ(s2.memory_hits, s1.memory_hits);
  EXPECT_EQ(second.record.winner, first.record.winner);
  EXPECT_EQ(second.record.candidates[1].times, first.record.candidates[1].times);
  EXPECT_EQ(second.record.candidates[1].final_times, first.record.candidates[1].final_times);
  EXPECT_EQ(second.record.final_reps, first.record.final_reps);

  // Retuning measures again, but the kernels come from the JIT's cache.
  o.read_cache = false;
  const TuneResult third = tune_threads(adam, 2, o);
  EXPECT_FALSE(third.from_cache);
  EXPECT_EQ(third.compiles, 0);
}

TEST(Tune, EveryKeyChangeRetunes) {
  testing::TempCacheDir dir("key");
  const dsl::Program adam = dsl::workloads::adam(DType::F32);
  TuneOptions o = small(100);
  o.executor = executor_of(exec::RunnerKind::Plan);
  o.reps = 1;
  EXPECT_FALSE(tune_threads(adam, 2, o).from_cache);
  EXPECT_TRUE(tune_threads(adam, 2, o).from_cache);
  EXPECT_FALSE(tune_threads(adam, 3, o).from_cache);                               // ranks
  EXPECT_FALSE(tune_threads(dsl::workloads::adam(DType::BF16), 2, o).from_cache);  // program
  TuneOptions bigger = o;
  bigger.sizes = {{"N", 101}};
  EXPECT_FALSE(tune_threads(adam, 2, bigger).from_cache);  // sizes
  TuneOptions other = o;
  other.executor = executor_of(exec::RunnerKind::Reference);
  EXPECT_FALSE(tune_threads(adam, 2, other).from_cache);  // executor
  EXPECT_TRUE(tune_threads(adam, 2, o).from_cache);
}

// Large sizes are checked at shrunk ones (the reference interpreter is slow), timed at their own.
TEST(Tune, ChecksAtShrunkSizesAndTimesAtTheTunedOnes) {
  testing::TempCacheDir dir("shrink");
  const dsl::Program adam = dsl::workloads::adam(DType::F32);
  TuneOptions o = small(40003);
  o.check_elements = 5000;
  o.executor = executor_of(exec::RunnerKind::Reference);
  o.reps = 1;
  o.warmup = 0;
  const TuneResult r = tune_threads(adam, 2, o);
  ASSERT_EQ(r.record.check_sizes.size(), 1u);
  const int64_t checked = r.record.check_sizes.at("N");
  EXPECT_LE(checked, 5000);
  EXPECT_GE(checked, 1000);
  EXPECT_EQ(checked % 8, 40003 % 8);  // the remainder modulo ranks x blocks is kept
  for (const auto& c : r.record.candidates) EXPECT_TRUE(c.ok) << c.name << ": " << c.error;
  // Small sizes are checked where they are timed.
  o.sizes = {{"N", 4000}};
  EXPECT_EQ(tune_threads(adam, 2, o).record.check_sizes.at("N"), 4000);
}

// Every schedule of the layer workloads passes the tuner's check with the plan runner, including
// schedules with sliced outputs and two groups (the pipeline on 4 ranks).
TEST(Tune, LayerWorkloadsPassTheirChecks) {
  testing::TempCacheDir dir("layers");
  TuneOptions o;
  o.sizes = {{"B", 12}, {"K", 10}, {"H", 6}};
  o.reps = 1;
  o.warmup = 0;
  o.executor = executor_of(exec::RunnerKind::Plan);
  for (const auto& [program, ranks] : {std::pair{dsl::workloads::megatron_layer(), 2},
                                       std::pair{dsl::workloads::megatron_layer(DType::BF16), 3},
                                       std::pair{dsl::workloads::pipeline_stage(), 4}}) {
    const TuneResult r = tune_threads(program, ranks, o);
    // Every enumerated schedule, then the winner's overlap at other block counts (if it overlaps).
    const auto names = names_of(program);
    ASSERT_GE(r.record.candidates.size(), names.size());
    for (size_t i = 0; i < r.record.candidates.size(); ++i)
      if (i < names.size())
        EXPECT_EQ(r.record.candidates[i].name, names[i]);
      else
        EXPECT_NE(r.record.candidates[i].name.find("ol["), std::string::npos)
            << r.record.candidates[i].name;
    for (const auto& c : r.record.candidates)
      EXPECT_TRUE(c.ok) << program.name() << " " << c.name << ": " << c.error;
  }
}

}  // namespace
}  // namespace tandem::tune
