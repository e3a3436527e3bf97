// What a user reads when tuning or emitting goes wrong: bad sizes, repetitions, schedule and
// executor names, rank counts, and the same through the `tandem` command (one line, non-zero exit).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "support/cli.h"
#include "tandem/core/error.h"
#include "tandem/dsl/dsl.h"
#include "tandem/tune/tune.h"
#include "tune/tune_testing.h"

namespace tandem::tune {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

TuneOptions quick(dsl::SymbolMap sizes) {
  TuneOptions o;
  o.sizes = std::move(sizes);
  o.reps = 1;
  o.warmup = 0;
  o.executor = executor_of(exec::RunnerKind::Plan);
  o.write_cache = false;
  o.read_cache = false;
  return o;
}

TEST(TuneErrors, Sizes) {
  const dsl::Program adam = dsl::workloads::adam();
  EXPECT_EQ(error_of([&] { tune_threads(adam, 2, quick({})); }),
            "program 'adam': symbol 'N' is not bound; give its extent (e.g. --size N=1024)");
  EXPECT_EQ(error_of([&] {
              tune_threads(adam, 2, quick({{"N", 4}, {"B", 2}}));
            }),
            "program 'adam' has no symbol 'B' (its symbols: N)");
  EXPECT_EQ(error_of([&] {
              tune_threads(adam, 2, quick({{"N", -4}}));
            }),
            "program 'adam': symbol 'N' = -4; extents must be >= 0");
}

TEST(TuneErrors, RepetitionsAndWarmup) {
  const dsl::Program adam = dsl::workloads::adam();
  TuneOptions o = quick({{"N", 4}});
  o.reps = 0;
  EXPECT_EQ(error_of([&] { tune_threads(adam, 2, o); }), "tune: --reps must be at least 1 (got 0)");
  o.reps = 1;
  o.warmup = -1;
  EXPECT_EQ(error_of([&] { tune_threads(adam, 2, o); }),
            "tune: the warm-up count must be >= 0 (got -1)");
  o.warmup = 1;
  o.blocks = {0};
  EXPECT_EQ(error_of([&] { tune_threads(adam, 2, o); }),
            "tune: --blocks 0: an overlap needs at least 1 block");
  o.blocks = {};
  o.chunk_bytes = {0};
  EXPECT_EQ(error_of([&] { tune_threads(adam, 2, o); }),
            "tune: --chunks 0: a chunk is at least 1 byte");
  o.chunk_bytes = {};
  o.budget_s = -1;
  EXPECT_EQ(error_of([&] { tune_threads(adam, 2, o); }),
            "tune: --budget must be >= 0 seconds (got -1)");
}

TEST(TuneErrors, ScheduleAndExecutorNames) {
  const dsl::Program adam = dsl::workloads::adam();
  const std::string e = error_of([&] { schedule::schedule_by_name(adam, "fastest"); });
  EXPECT_EQ(e.rfind("program 'adam': schedule 'fastest': 'fastest' is not a schedule part; a "
                    "schedule name is ",
                    0),
            0u)
      << e;
  TuneOptions o = quick({{"N", 4}});
  o.only = {"AR-C", "nope"};
  const std::string e2 = error_of([&] { tune_threads(adam, 2, o); });
  EXPECT_EQ(e2.rfind("program 'adam': schedule 'nope': 'nope' is not a schedule part; ", 0), 0u)
      << e2;
  EXPECT_EQ(error_of([] { executor_by_name("fast"); }),
            "--executor 'fast': the executors are compiled, plan, reference");
}

TEST(TuneErrors, RanksThatDoNotFitTheGroups) {
  const std::string e = error_of([] {
    tune_threads(dsl::workloads::pipeline_stage(), 3, quick({{"B", 2}, {"K", 2}, {"H", 2}}));
  });
  EXPECT_EQ(e,
            "program 'pipeline_stage' has 2 groups, but 3 ranks were asked for; the ranks split "
            "into 2 equal "
            "groups of consecutive ranks, so tune it on a multiple of 2 ranks");
}

// ---------------------------------------------------------------------------- the command

struct CliCase {
  std::string args;
  std::string message;  // the one line after "tandem: error: " (a prefix of it)
};

TEST(TuneCliErrors, OneLineAndNonZeroExit) {
  testing::TempCacheDir dir("cli-errors");
  const std::vector<CliCase> cases = {
      {"tune nosuch --ranks 2",
       "unknown workload 'nosuch'; the workloads are: adam, lamb, megatron_layer, pipeline_stage"},
      {"tune adam --ranks 0", "--ranks must be at least 1 (got 0)"},
      {"tune adam --backend tcp", "--backend 'tcp' is not a backend; choose thread or mpi"},
      {"tune adam --size M=4", "--size M=4: workload 'adam' has no symbol 'M' (its symbols: N)"},
      {"tune adam --size N=4x", "--size N=4x: '4x' is not an extent;"},
      {"tune megatron_layer --size 1 2 3 4",
       "--size: 4 bare extent(s) given, but workload 'megatron_layer' has 3"},
      {"tune adam --size N=64 --reps 0", "--reps must be at least 1 (got 0)"},
      {"tune adam --size N=64 --budget -1", "--budget must be >= 0 seconds (got -1)"},
      {"tune megatron_layer --blocks 0,2", "--blocks 0: an overlap needs at least 1 block"},
      {"tune adam --chunks 0", "--chunks 0: a chunk is at least 1 byte"},
      {"tune adam --chunks 64Q", "--chunks: '64Q' is not an extent;"},
      {"tune adam --executor fast",
       "--executor 'fast': the executors are compiled, plan, reference"},
      {"tune adam --dtype f64", "unknown dtype 'f64'"},
      {"tune gather_weights --dtype bf16", "--dtype bf16: gather_weights moves f32 weights only"},
      {"tune adam --wire bf16",
       "--wire bf16: only the layers (megatron_layer, pipeline_stage) take a wire dtype"},
      {"tune megatron_layer --wire f64", "unknown dtype 'f64'"},
      {"tune adam --size N=64 --schedules 'fused(nothing)'",
       "program 'adam': schedule 'fused(nothing)': 'fused(nothing)' is not a schedule part; "},
      {"tune pipeline_stage --ranks 3 --size 2 2 2 --executor plan",
       "program 'pipeline_stage' has 2 groups, but 3 ranks were asked for"},
      {"emit adam --schedule nope --target cpp",
       "program 'adam': schedule 'nope': 'nope' is not a schedule part; "},
      {"emit megatron_layer --schedule 'ol(MM,AR-C)|AR-C'",
       "program 'megatron_layer': schedule 'ol(MM,AR-C)|AR-C' has 2 parts"},
      {"emit adam --schedule AR-C --target rocm",
       "--target 'rocm' is not a target; targets: cpp, cuda"},
      {"emit adam --schedule AR-C --target cuda",
       "--target cuda writes a folder: give it with -o DIR"},
      {"emit pipeline_stage --schedule AR-C --target cuda -o unused --ranks 3",
       "--ranks 3: program 'pipeline_stage' has 2 groups; give multiples of 2"},
      {"emit lamb2 --schedule AR-C", "unknown workload 'lamb2'; the workloads are: "},
      {"emit adam --schedule AR-C --target cuda -o unused --ranks 0",
       "--ranks 0: a rank count is at least 1"},
      {"emit adam --schedule AR-C --target cuda -o unused --sizes N=0",
       "--size N=0: an extent is at least 1"},
      {"tune adam --size N=0", "--size N=0: an extent is at least 1"},
  };
  for (const CliCase& c : cases) {
    const testing::CommandResult r = testing::run_tandem(c.args);
    EXPECT_EQ(r.status, 1) << c.args << "\n" << r.output;
    EXPECT_EQ(r.output.rfind("tandem: error: " + c.message, 0), 0u) << c.args << "\n" << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << c.args << "\n" << r.output;
  }
}

// -o naming a folder that cannot be made is the user's error, in one line; with --target cpp the
// source is written into the folder rather than -o being ignored.
TEST(TuneCliErrors, EmitOutputFolders) {
  testing::TempCacheDir dir("emit-out");
  const std::string file = (dir.path() / "a-file").string();
  std::ofstream(file) << "x";
  for (const std::string target : {"cuda", "cpp"}) {
    const testing::CommandResult r = testing::run_tandem("emit adam --schedule AR-C --target " +
                                                         target + " -o '" + file + "/sub'");
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_EQ(r.output,
              "tandem: error: -o " + file + "/sub: cannot create the folder: Not a directory\n");
  }
  const std::string out = (dir.path() / "out").string();
  const testing::CommandResult r =
      testing::run_tandem("emit adam --schedule AR-C --target cpp -o '" + out + "'");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output, "wrote " + out + "/adam_AR_C.cpp\n");
  EXPECT_NE(
      testing::run_tandem("emit adam --schedule AR-C --target cpp").output.find("extern \"C\""),
      std::string::npos);
  std::ifstream f(out + "/adam_AR_C.cpp");
  const std::string written((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(written, testing::run_tandem("emit adam --schedule AR-C --target cpp").output);
}

// A CUDA emit refused for its rank counts or its sizes writes nothing: not even the folder.
TEST(TuneCliErrors, ARefusedEmitWritesNothing) {
  testing::TempCacheDir dir("emit-refused");
  const std::string out = (dir.path() / "out").string();
  for (const std::string bad : {"--ranks 0", "--size N=0", "--sizes N=0"}) {
    const testing::CommandResult r =
        testing::run_tandem("emit adam --schedule AR-C --target cuda -o '" + out + "' " + bad);
    EXPECT_EQ(r.status, 1) << bad << "\n" << r.output;
    EXPECT_FALSE(std::filesystem::exists(out)) << bad;
  }
}

// Every candidate failing its set-up with the same UserError (a cache folder that cannot be
// written, a compiler that does not run) is that UserError, not an internal error.
class RefusingExecutor final : public Executor {
 public:
  std::string name() const override { return "refusing"; }
  std::unique_ptr<exec::Runner> prepare(const schedule::Plan&, comm::Communicator&,
                                        const dsl::SymbolMap&, size_t) override {
    user_error("cannot write the JIT cache folder '/ro/cache': Read-only file system");
  }
};

TEST(TuneErrors, TheSameSetUpErrorForEveryCandidateIsTheUsers) {
  TuneOptions o = quick({{"N", 64}});
  o.executor = std::make_shared<RefusingExecutor>();
  // Each rank raises it; run_ranks names the first to.
  const std::string e = error_of([&] { tune_threads(dsl::workloads::adam(), 2, o); });
  EXPECT_THAT(e, ::testing::EndsWith("tune: program 'adam': set-up failed: cannot write the JIT "
                                     "cache folder '/ro/cache': Read-only file system"));
}

// Each candidate failing with its own UserError (a read-only cache folder: each schedule's
// kernel in a shard folder of its own) is the user's too: the first is said. It was "internal
// error ... this is a bug".
class RefusingEachExecutor final : public Executor {
 public:
  std::string name() const override { return "refusing each"; }
  std::unique_ptr<exec::Runner> prepare(const schedule::Plan& plan, comm::Communicator&,
                                        const dsl::SymbolMap&, size_t) override {
    user_error("cannot create the cache folder '/ro/cache/{}': Permission denied",
               plan.name.size());
  }
};

TEST(TuneErrors, SetUpErrorsOfTheUserForEveryCandidateAreTheUsers) {
  TuneOptions o = quick({{"N", 64}});
  o.executor = std::make_shared<RefusingEachExecutor>();
  const std::string e = error_of([&] { tune_threads(dsl::workloads::adam(), 2, o); });
  EXPECT_THAT(e, ::testing::HasSubstr("tune: program 'adam': set-up failed: cannot create the "
                                      "cache folder '/ro/cache/"));
  EXPECT_THAT(e, ::testing::MatchesRegex(".*Permission denied \\(schedule .*; the other [0-9]+ "
                                         "failed alike\\)"));
}

TEST(TuneCliErrors, FlagsCli11Rejects) {
  for (const std::string args : {"tune adam --ranks two", "tune", "tune adam --bogus", "emit"}) {
    const testing::CommandResult r = testing::run_tandem(args);
    EXPECT_NE(r.status, 0) << args << "\n" << r.output;
    EXPECT_FALSE(r.output.empty()) << args;
  }
  const testing::CommandResult r = testing::run_tandem("tune adam --ranks two");
  EXPECT_NE(r.output.find("--ranks"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace tandem::tune
