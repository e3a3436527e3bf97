// Failed writes: a missing or non-folder parent, a full disk (simulated by a file size limit, which
// fails write(2) the same way), an unwritable folder; the previous file or folder survives and
// the message says what happened.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/files.h"
#include "support/scratch.h"
#include "tandem/io/atomic_file.h"

namespace tandem::io {
namespace {

using testing::FileSizeLimit;
using testing::ScratchDir;
using testing::user_error_of;

TEST(AtomicFileErrors, MissingFolder) {
  ScratchDir dir;
  const std::string path = dir.path("missing/sub/a.txt");
  EXPECT_EQ(user_error_of([&] { write_file_atomic(path, "x"); }),
            "cannot write '" + path + "': folder '" + dir.path("missing/sub") + "' does not exist");
}

TEST(AtomicFileErrors, ParentIsAFile) {
  ScratchDir dir;
  testing::write_bytes(dir.path("f"), "plain file");
  EXPECT_EQ(user_error_of([&] { write_file_atomic(dir.path("f/a.txt"), "x"); }),
            "cannot write '" + dir.path("f/a.txt") + "': '" + dir.path("f") + "' is not a folder");
}

TEST(AtomicFileErrors, DestinationIsAFolder) {
  ScratchDir dir;
  std::filesystem::create_directory(dir.path("d"));
  EXPECT_EQ(user_error_of([&] { write_file_atomic(dir.path("d"), "x"); }),
            "cannot write '" + dir.path("d") + "': Is a directory");
  EXPECT_EQ(dir.list(), std::vector<std::string>{"d"});
}

TEST(AtomicFileErrors, DiskFullKeepsThePreviousFile) {
  ScratchDir dir;
  const std::string path = dir.path("w.bin");
  write_file_atomic(path, "previous contents");
  {
    FileSizeLimit limit(4096);
    const std::string big(10000, 'x');
    EXPECT_EQ(user_error_of([&] { write_file_atomic(path, big); }),
              "cannot write '" + path + "': File too large; the previous file is unchanged");
  }
  EXPECT_EQ(read_file(path), "previous contents");
  EXPECT_EQ(dir.list(), std::vector<std::string>{"w.bin"});
  // A new file has no previous version to mention.
  {
    FileSizeLimit limit(4096);
    EXPECT_EQ(
        user_error_of([&] { write_file_atomic(dir.path("new.bin"), std::string(10000, 'y')); }),
        "cannot write '" + dir.path("new.bin") + "': File too large");
  }
  EXPECT_EQ(dir.list(), std::vector<std::string>{"w.bin"});
}

// Writes into a read-only folder as an unprivileged user (root writes anywhere). Returns the
// error message.
std::string write_as_unprivileged(const std::string& path) {
  return tandem::testing::user_error_in_child(tandem::testing::drop_root,
                                              [&] { write_file_atomic(path, "new"); });
}

TEST(AtomicFileErrors, UnwritableFolder) {
  ScratchDir dir;
  std::filesystem::create_directory(dir.path("ro"));
  write_file_atomic(dir.path("ro/a"), "old");
  ::chmod(dir.path("ro").c_str(), 0555);
  EXPECT_EQ(
      write_as_unprivileged(dir.path("ro/a")),
      "cannot write '" + dir.path("ro/a") + "': Permission denied; the previous file is unchanged");
  EXPECT_EQ(write_as_unprivileged(dir.path("ro/b")),
            "cannot write '" + dir.path("ro/b") + "': Permission denied");
  ::chmod(dir.path("ro").c_str(), 0755);
  EXPECT_EQ(read_file(dir.path("ro/a")), "old");
  EXPECT_EQ(dir.list("ro"), std::vector<std::string>{"a"});
}

std::vector<FolderFile> two_files(const std::string& text) {
  return {{"small.txt", [text](AtomicFile& f) { f.write(text); }},
          {"large.bin", [text](AtomicFile& f) { f.write(std::string(10000, text[0])); }}};
}

TEST(ReplaceFolderErrors, DiskFullKeepsThePreviousFolder) {
  ScratchDir dir;
  const std::string target = dir.path("ckpt");
  replace_folder_atomic(target, two_files("old"));
  {
    FileSizeLimit limit(4096);
    EXPECT_EQ(user_error_of([&] { replace_folder_atomic(target, two_files("new")); }),
              "cannot write '" + target +
                  "/large.bin': File too large; the previous contents of '" + target +
                  "' are unchanged");
  }
  EXPECT_EQ(read_file(target + "/small.txt"), "old");
  EXPECT_EQ(read_file(target + "/large.bin"), std::string(10000, 'o'));
  EXPECT_EQ(dir.list(), std::vector<std::string>{"ckpt"});
}

TEST(ReplaceFolderErrors, BadTargets) {
  ScratchDir dir;
  EXPECT_EQ(
      user_error_of([&] { replace_folder_atomic(dir.path("no/ckpt"), two_files("a")); }),
      "cannot write '" + dir.path("no/ckpt") + "': folder '" + dir.path("no") + "' does not exist");
  testing::write_bytes(dir.path("file"), "x");
  EXPECT_EQ(user_error_of([&] { replace_folder_atomic(dir.path("file"), two_files("a")); }),
            "cannot write '" + dir.path("file") + "': it exists and is not a folder");
  EXPECT_EQ(
      user_error_of([&] { replace_folder_atomic(dir.path("file/ckpt"), two_files("a")); }),
      "cannot write '" + dir.path("file/ckpt") + "': '" + dir.path("file") + "' is not a folder");
  EXPECT_EQ(dir.list(), std::vector<std::string>{"file"});
}

TEST(ReadFileErrors, MissingAndFolder) {
  ScratchDir dir;
  EXPECT_EQ(user_error_of([&] { read_file(dir.path("none.txt"), "data file"); }),
            "data file '" + dir.path("none.txt") + "' does not exist");
  EXPECT_EQ(user_error_of([&] { read_file(dir.path(), "data file"); }),
            "data file '" + dir.path() + "' is a folder, not a file");
}

}  // namespace
}  // namespace tandem::io
