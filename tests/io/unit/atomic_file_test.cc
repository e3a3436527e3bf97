// Atomic file and folder replacement: contents land whole, temporaries never linger, and a process
// killed at any step of a folder save leaves the old folder or the new one, complete.
#include "tandem/io/atomic_file.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <stdexcept>

#include "support/files.h"
#include "support/scratch.h"

namespace tandem::io {
namespace {

using testing::ScratchDir;

TEST(AtomicFile, WritesAndReplacesLeavingNoTemporaries) {
  ScratchDir dir;
  const std::string path = dir.path("a.txt");
  write_file_atomic(path, "first");
  EXPECT_EQ(read_file(path), "first");
  write_file_atomic(path, "second, longer");
  EXPECT_EQ(read_file(path), "second, longer");
  write_file_atomic(path, "");
  EXPECT_EQ(read_file(path), "");
  EXPECT_EQ(dir.list(), std::vector<std::string>{"a.txt"});
}

TEST(AtomicFile, AbandonedWriteKeepsThePreviousFile) {
  ScratchDir dir;
  const std::string path = dir.path("a.txt");
  write_file_atomic(path, "old");
  {
    AtomicFile f(path);
    f.write("new but never committed");
    EXPECT_EQ(f.bytes_written(), 23u);
    EXPECT_NE(f.temp_path(), path);
    EXPECT_EQ(std::filesystem::path(f.temp_path()).parent_path(),
              std::filesystem::path(path).parent_path());
    EXPECT_EQ(read_file(path), "old");  // nothing visible before commit
  }
  EXPECT_EQ(read_file(path), "old");
  EXPECT_EQ(dir.list(), std::vector<std::string>{"a.txt"});
}

TEST(AtomicFile, LargeWritesArriveWhole) {
  ScratchDir dir;
  std::string big(3 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 2654435761u >> 24);
  write_file_atomic(dir.path("big"), big);
  EXPECT_EQ(read_file(dir.path("big")), big);
}

std::vector<FolderFile> files_saying(const std::string& text) {
  return {{"one.txt", [text](AtomicFile& f) { f.write("1:" + text); }},
          {"two.txt", [text](AtomicFile& f) { f.write("2:" + text); }}};
}

TEST(ReplaceFolder, CreatesThenReplacesTheWholeFolder) {
  ScratchDir dir;
  const std::string target = dir.path("ckpt");
  replace_folder_atomic(target, files_saying("a"));
  EXPECT_EQ(read_file(target + "/one.txt"), "1:a");
  EXPECT_EQ(read_file(target + "/two.txt"), "2:a");
  testing::write_bytes(target + "/stray.txt", "left by hand");
  replace_folder_atomic(target + "/", files_saying("b"));  // a trailing slash names the same folder
  EXPECT_EQ(read_file(target + "/one.txt"), "1:b");
  EXPECT_EQ(dir.list("ckpt"), (std::vector<std::string>{"one.txt", "two.txt"}));
  EXPECT_EQ(dir.list(), std::vector<std::string>{"ckpt"});
  EXPECT_EQ(resolve_folder(target), target);
}

TEST(ReplaceFolder, AFailingWriterLeavesTheOldFolder) {
  ScratchDir dir;
  const std::string target = dir.path("ckpt");
  replace_folder_atomic(target, files_saying("a"));
  std::vector<FolderFile> bad = files_saying("b");
  bad.push_back({"three.txt", [](AtomicFile& f) {
                   f.write("partial");
                   throw std::runtime_error("writer failed");
                 }});
  EXPECT_THROW(replace_folder_atomic(target, bad), std::runtime_error);
  EXPECT_EQ(read_file(target + "/one.txt"), "1:a");
  EXPECT_EQ(dir.list(), std::vector<std::string>{"ckpt"});
}

// Runs replace_folder_atomic in a child process that dies (_exit: no destructors, no clean-up, as
// in a crash) right after `stage`. Returns whether the child reached that stage.
bool save_and_die_after(const std::string& target, const std::string& text,
                        const std::string& stage, bool use_exchange) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    FolderWriteHooks hooks;
    hooks.use_exchange = use_exchange;
    hooks.after = [&](std::string_view s) {
      if (s == stage) ::_exit(42);
    };
    try {
      replace_folder_atomic(target, files_saying(text), hooks);
    } catch (...) {
      ::_exit(1);
    }
    ::_exit(0);  // finished without reaching the stage
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status));
  return WIFEXITED(status) && WEXITSTATUS(status) == 42;
}

struct CrashCase {
  std::string stage;
  bool new_contents;  // whether the folder a reader finds holds the new save
};

void check_crash_safety(bool use_exchange, const std::vector<CrashCase>& cases) {
  for (const CrashCase& c : cases) {
    SCOPED_TRACE("killed after '" + c.stage + "'" + (use_exchange ? "" : " (two renames)"));
    ScratchDir dir;
    const std::string target = dir.path("ckpt");
    replace_folder_atomic(target, files_saying("old"));
    ASSERT_TRUE(save_and_die_after(target, "new", c.stage, use_exchange));
    // Whatever the reader finds is one save, whole: both files from the same save.
    const std::string found = resolve_folder(target);
    const std::string want = c.new_contents ? "new" : "old";
    EXPECT_EQ(read_file(found + "/one.txt"), "1:" + want);
    EXPECT_EQ(read_file(found + "/two.txt"), "2:" + want);
    // The next save succeeds and sweeps away what the crash left behind.
    replace_folder_atomic(target, files_saying("next"));
    EXPECT_EQ(read_file(target + "/two.txt"), "2:next");
    EXPECT_EQ(dir.list(), std::vector<std::string>{"ckpt"});
  }
}

TEST(ReplaceFolder, KilledAtAnyStepWithTheAtomicSwap) {
  // Find out whether this filesystem can swap two folders in one step.
  ScratchDir probe;
  std::vector<std::string> stages;
  replace_folder_atomic(probe.path("p"), files_saying("a"));
  FolderWriteHooks hooks;
  hooks.after = [&](std::string_view s) { stages.emplace_back(s); };
  replace_folder_atomic(probe.path("p"), files_saying("b"), hooks);
  if (std::find(stages.begin(), stages.end(), "exchanged") == stages.end())
    GTEST_SKIP() << "this filesystem has no RENAME_EXCHANGE; the two-rename test covers it";
  EXPECT_EQ(stages, (std::vector<std::string>{"wrote one.txt", "wrote two.txt", "exchanged",
                                              "removed old"}));
  check_crash_safety(true, {{"wrote one.txt", false},
                            {"wrote two.txt", false},
                            {"exchanged", true},
                            {"removed old", true}});
}

TEST(ReplaceFolder, KilledAtAnyStepWithTwoRenames) {
  check_crash_safety(false, {{"wrote one.txt", false},
                             {"wrote two.txt", false},
                             {"moved old aside", false},  // found under ckpt.old-<pid>
                             {"renamed", true},
                             {"removed old", true}});
}

TEST(ReplaceFolder, KilledDuringTheFirstSave) {
  ScratchDir dir;
  const std::string target = dir.path("ckpt");
  ASSERT_TRUE(save_and_die_after(target, "new", "wrote two.txt", true));
  EXPECT_FALSE(std::filesystem::exists(target));
  EXPECT_EQ(resolve_folder(target), target);  // nothing to find: the caller reports it missing
  ASSERT_TRUE(save_and_die_after(target, "new", "renamed", true));
  EXPECT_EQ(read_file(target + "/one.txt"), "1:new");
}

// A process id that is no longer running: a child's, once it has exited.
long atomic_file_dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

// What a save removes beside its folder: leftovers of writers that are gone, never a folder a
// writer claims (a writer in another pid namespace looks gone by its pid), nor another folder's.
TEST(ReplaceFolder, RemovesOnlyLeftoversNobodyClaims) {
  ScratchDir dir;
  const std::string dead = std::to_string(atomic_file_dead_pid());
  for (const std::string& name :
       {"ckpt.tmp-" + dead + "-abc", "ckpt.old-" + dead + "-def", "ckpt.tmp-" + dead + "-claimed",
        std::string("ckpt.tmp-1-notours"), "other.tmp-" + dead + "-abc"})
    std::filesystem::create_directories(dir.path(name) + "/sub");
  FolderClaim claim;
  ASSERT_EQ(claim.claim(dir.path("ckpt.tmp-" + dead + "-claimed")), 0);
  replace_folder_atomic(dir.path("ckpt"), {{"a.txt", [](AtomicFile& f) { f.write("a"); }}});
  // pid 1 (init) runs: its folder stays too.
  EXPECT_EQ(dir.list(),
            (std::vector<std::string>{"ckpt", "ckpt.tmp-1-notours", "ckpt.tmp-" + dead + "-claimed",
                                      "other.tmp-" + dead + "-abc"}));
}

}  // namespace
}  // namespace tandem::io
