// Every output a run writes (--save, --metrics, --trace) is checked before the first step: a path
// that cannot be written is refused at once, with its flag and the reason, instead of after the
// whole run (when a bad --save would lose the trained model). Missing folders are created.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>

#include "tandem/io/checkpoint_series.h"
#include "train/test_util.h"

namespace tandem::train {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDir;
using testing::user_error_of;
namespace fs = std::filesystem;

// A run that would take hours: refusing it within seconds proves the check comes first.
TrainConfig endless() { return testing::tiny_run(1'000'000'000); }

// The error `c` is refused with, which must come before any step.
std::string path_refusal(const TrainConfig& c) {
  const auto begin = std::chrono::steady_clock::now();
  const std::string m = user_error_of([&] { train(c); });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count(), 30.0);
  return m;
}

TEST(OutputPaths, SaveUnderAFileIsRefusedBeforeTheFirstStep) {
  ScratchDir dir;
  testing::write_bytes(dir.path("file"), "x");
  TrainConfig c = endless();
  c.save_dir = dir.path("file/ck");
  EXPECT_EQ(path_refusal(c), "--save '" + dir.path("file/ck") + "': cannot create folder '" +
                                 dir.path("file/ck") + "': Not a directory");
}

TEST(OutputPaths, SaveThatIsAFile) {
  ScratchDir dir;
  testing::write_bytes(dir.path("ck"), "x");
  TrainConfig c = endless();
  c.save_dir = dir.path("ck");
  EXPECT_EQ(path_refusal(c),
            "--save '" + dir.path("ck") + "' is a file; give a folder for the checkpoints");
}

TEST(OutputPaths, SaveIntoASingleCheckpointIsRefused) {
  ScratchDir dir;
  TrainConfig first = testing::tiny_run(1);
  first.save_dir = dir.path("series");
  train(first);
  const std::string one = io::resolve_checkpoint(dir.path("series"));
  TrainConfig c = endless();
  c.save_dir = one;
  EXPECT_THAT(path_refusal(c),
              HasSubstr("--save '" + one + "' is itself a checkpoint (it holds meta.json)"));
}

TEST(OutputPaths, MetricsAndTraceUnderAFile) {
  ScratchDir dir;
  testing::write_bytes(dir.path("file"), "x");
  TrainConfig c = endless();
  c.metrics_path = dir.path("file/m.jsonl");
  EXPECT_EQ(path_refusal(c), "--metrics '" + dir.path("file/m.jsonl") +
                                 "': cannot create folder '" + dir.path("file") +
                                 "': Not a directory");
  c.metrics_path.clear();
  c.trace_path = dir.path("file/t.json");
  EXPECT_EQ(path_refusal(c), "--trace '" + dir.path("file/t.json") + "': cannot create folder '" +
                                 dir.path("file") + "': Not a directory");
}

TEST(OutputPaths, MetricsThatIsAFolder) {
  ScratchDir dir;
  TrainConfig c = endless();
  c.metrics_path = dir.path();
  EXPECT_EQ(path_refusal(c),
            "--metrics '" + dir.path() + "' is a folder; give the name of a file to write");
}

// Root writes anywhere, so the unwritable folder is tried by user nobody, in a child process.
TEST(OutputPaths, UnwritableFolders) {
  ScratchDir dir;
  fs::create_directories(dir.path("locked"));
  fs::permissions(dir.path("locked"), fs::perms::owner_all | fs::perms::group_read |
                                          fs::perms::group_exec | fs::perms::others_read |
                                          fs::perms::others_exec);
  for (const char* flag : {"--save", "--metrics", "--trace"}) {
    TrainConfig c = endless();
    const std::string path =
        dir.path(std::string("locked/") + (flag[2] == 's' ? "ck" : "out.json"));
    const std::string folder = flag[2] == 's' ? path : dir.path("locked");
    if (flag[2] == 's') c.save_dir = path;
    if (flag[2] == 'm') c.metrics_path = path;
    if (flag[2] == 't') c.trace_path = path;
    const std::string m =
        tandem::testing::user_error_in_child(tandem::testing::drop_root, [&] { train(c); });
    EXPECT_THAT(m, HasSubstr(std::string(flag) + " '" + path + "': cannot")) << m;
    EXPECT_THAT(m, HasSubstr("Permission denied")) << m;
  }
}

// Folders that do not exist yet are made, as mkdir -p would; what the run writes lands there.
TEST(OutputPaths, MissingFoldersAreCreated) {
  ScratchDir dir;
  TrainConfig c = testing::tiny_run(2);
  c.save_dir = dir.path("runs/a/ck");
  c.metrics_path = dir.path("logs/b/m.jsonl");
  c.trace_path = dir.path("traces/c/t.json");
  train(c);
  EXPECT_TRUE(fs::is_regular_file(dir.path("runs/a/ck/latest")));
  EXPECT_TRUE(fs::is_regular_file(dir.path("runs/a/ck/step-00000002/meta.json")));
  EXPECT_EQ(testing::read_bytes(dir.path("logs/b/m.jsonl")).find("{\"step\":1,"), 0u);
  EXPECT_TRUE(fs::is_regular_file(dir.path("traces/c/t.json")));
  // The write probes leave nothing behind.
  EXPECT_EQ(dir.list("logs/b"), std::vector<std::string>{"m.jsonl"});
}

}  // namespace
}  // namespace tandem::train
