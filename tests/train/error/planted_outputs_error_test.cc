// A run's outputs in a folder another user can write: a link planted at the --save folder's lock,
// at --metrics or at --trace is refused before the first step and its target is untouched (the
// lock used to truncate it and write the run's pid into it); a file planted at the name the write
// test used (.tandem-write-test-<pid>) no longer makes a run fail.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "tandem/core/error.h"
#include "train/test_util.h"

namespace tandem::train {
namespace {

using testing::ScratchDir;
using testing::user_error_of;
namespace fs = std::filesystem;

namespace planted_outputs_error_test {

std::string link_refusal(const std::string& before, const std::string& path) {
  return before + "'" + path +
         "' is a symbolic link: tandem does not write through links (remove it, or give another "
         "path)";
}

}  // namespace planted_outputs_error_test

using planted_outputs_error_test::link_refusal;

TEST(PlantedOutputs, ALinkAtTheLockIsRefusedAndItsTargetUntouched) {
  ScratchDir dir;
  testing::write_bytes(dir.path("victim"), "precious");
  fs::create_directories(dir.path("ck"));
  fs::create_symlink(dir.path("victim"), dir.path("ck/.tandem-lock"));
  TrainConfig c = testing::tiny_run(2);
  c.save_dir = dir.path("ck");
  EXPECT_EQ(
      user_error_of([&] { train(c); }),
      link_refusal("--save '" + dir.path("ck") + "': the lock file ", dir.path("ck/.tandem-lock")));
  EXPECT_EQ(testing::read_bytes(dir.path("victim")), "precious");
  EXPECT_TRUE(fs::is_symlink(dir.path("ck/.tandem-lock")));
}

TEST(PlantedOutputs, LinksAtMetricsAndTraceAreRefused) {
  ScratchDir dir;
  testing::write_bytes(dir.path("victim"), "precious");
  fs::create_symlink(dir.path("victim"), dir.path("m.jsonl"));
  fs::create_symlink(dir.path("victim"), dir.path("t.json"));
  TrainConfig c = testing::tiny_run(2);
  c.metrics_path = dir.path("m.jsonl");
  EXPECT_EQ(user_error_of([&] { train(c); }), link_refusal("--metrics ", dir.path("m.jsonl")));
  c.metrics_path.clear();
  c.trace_path = dir.path("t.json");
  EXPECT_EQ(user_error_of([&] { train(c); }), link_refusal("--trace ", dir.path("t.json")));
  EXPECT_EQ(testing::read_bytes(dir.path("victim")), "precious");
}

TEST(PlantedOutputs, PlantedNamesDoNotStopARun) {
  ScratchDir dir;
  fs::create_directories(dir.path("ck"));
  testing::write_bytes(dir.path("victim"), "precious");
  // What the write test and the first temporaries used to be called in this process.
  const std::string pid = std::to_string(::getpid());
  fs::create_symlink(dir.path("victim"), dir.path("ck/.tandem-write-test-" + pid));
  fs::create_symlink(dir.path("victim"), dir.path(".tandem-write-test-" + pid));
  fs::create_symlink(dir.path("victim"), dir.path("ck/.latest.tmp-" + pid + "-0"));
  TrainConfig c = testing::tiny_run(2);
  c.save_dir = dir.path("ck");
  c.metrics_path = dir.path("m.jsonl");
  train(c);
  EXPECT_TRUE(fs::exists(dir.path("ck/latest")));
  EXPECT_EQ(testing::read_bytes(dir.path("victim")), "precious");
  EXPECT_FALSE(fs::exists(dir.path("ck/.tandem-lock")));
}

}  // namespace
}  // namespace tandem::train
