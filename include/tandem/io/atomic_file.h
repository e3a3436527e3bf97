// Crash-safe writes: a file replaced atomically (temporary file, fsync, rename, fsync the folder)
// and a folder of files replaced atomically (the checkpoint), so that a crash, a full disk or an
// unwritable folder never leaves a half-written file where a good one was.
//
// Folder replacement (replace_folder_atomic), for a folder DIR in folder P:
//   1. write every file into P/DIR.tmp-<pid>-<random> (each fsync'd), fsync that folder;
//   2. if DIR does not exist: rename DIR.tmp-<pid> to DIR; fsync P;
//      else: swap the two names in one step (renameat2 with RENAME_EXCHANGE); fsync P;
//   3. remove the old contents (now under DIR.tmp-<pid>) and stale DIR.tmp-* / DIR.old-* folders
//      that earlier, interrupted saves left behind.
// A crash before step 2 leaves DIR untouched (the old folder, complete); after step 2, DIR is the
// new folder, complete. Filesystems without RENAME_EXCHANGE (some network and parallel
// filesystems) take two renames instead, DIR -> DIR.old-<pid>-<random> then the temporary -> DIR;
// a crash between them leaves no DIR but a complete DIR.old-..., which resolve_folder() finds. So
// a reader that opens resolve_folder(DIR) always sees either the old folder or the new one, whole.
// One writer per folder at a time: concurrent writers to the same DIR are not supported, but none
// removes another's temporary folder: the leftovers step 3 removes are those whose writer is gone
// (FolderClaim).
// Every temporary name is drawn at random and created exclusively (core/file_io.h), so nothing
// planted in P is opened or blocks a save; a DIR or a file that is a symbolic link is refused.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/core/file_io.h"

namespace tandem::io {

// A file being written under a temporary name next to its destination; commit() puts it in
// place. Destroyed without commit() (an exception, an early return), it removes the temporary
// and the destination keeps its previous contents. Every failure is a UserError naming the
// destination and the reason, e.g. "cannot write 'ckpt/meta.json': No space left on device; the
// previous file is unchanged".
class AtomicFile {
 public:
  // `shown_as` is the name errors give the file (default: `path`); a file written inside a
  // temporary folder is shown under the name it will have once the folder is in place.
  explicit AtomicFile(std::string path, std::string shown_as = {});
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes);
  void write(std::string_view text) { write(text.data(), text.size()); }
  // Rewrites bytes already written, [offset, offset + bytes) (a header whose values are known only
  // once the data is in, as the safetensors writer's checksums).
  void write_at(size_t offset, const void* data, size_t bytes);
  // fsync the file, close it, rename it over the destination, fsync the folder.
  void commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return file_.temp_path(); }
  size_t bytes_written() const { return written_; }

 private:
  [[noreturn]] void fail(int err);

  std::string path_;
  std::string shown_;
  ReplacementFile file_;
  size_t written_ = 0;
  bool had_previous_ = false;
  bool committed_ = false;
};

// Replaces the file at `path` with `contents`, atomically.
void write_file_atomic(const std::string& path, std::string_view contents);

// The whole contents of a file. `what` names it in errors: "data file 'x.txt' does not exist".
std::string read_file(const std::string& path, std::string_view what = "file");

// fsync a folder, so that a rename or a new entry in it survives a power cut.
void fsync_folder(const std::string& dir);

// One file of a folder written by replace_folder_atomic: its name inside the folder, and a
// function that writes its bytes (without committing; the caller commits).
struct FolderFile {
  std::string name;
  std::function<void(AtomicFile&)> write;
};

// For fault-injection tests: `after(stage)` runs after each step of the procedure above (stages
// "wrote <file>", "renamed", "exchanged", "moved old aside", "removed old"), so a test
// can kill the process there; `use_exchange = false` takes the two-rename path.
struct FolderWriteHooks {
  std::function<void(std::string_view stage)> after;
  bool use_exchange = true;
};

// Replaces folder `dir` by one holding exactly `files`, atomically (see the top of this file).
// A failure leaves `dir` as it was and throws a UserError that says so.
void replace_folder_atomic(const std::string& dir, const std::vector<FolderFile>& files,
                           const FolderWriteHooks& hooks = {});

// A temporary folder's claim by the process writing it: an flock held on the folder itself (the
// lock moves with the folder when it is renamed) for as long as the writer lives. Leftovers are
// only folders nobody claims, so a running writer's folder is never taken for debris, whatever
// process ids say (a writer in another pid namespace, a reused id).
class FolderClaim {
 public:
  FolderClaim() = default;
  ~FolderClaim();
  FolderClaim(const FolderClaim&) = delete;
  FolderClaim& operator=(const FolderClaim&) = delete;
  // Claims the folder at `path` (opened without following a link); 0 or the errno (a filesystem
  // without flock: the pid in the folder's name is then its only protection).
  int claim(const std::string& path);

 private:
  int fd_ = -1;
};

// Removes from `parent` what interrupted writes of folder `base` left: "<base>.tmp-<pid>-<random>"
// and "<base>.old-<pid>-<random>" whose writer is gone (nobody claims the folder, and its pid is
// not running or is this process's). Best effort: what cannot be removed stays.
void remove_leftovers(const std::string& parent, const std::string& base);

// The same procedure for a caller that writes the files itself, at its own pace (a checkpoint
// streamed tensor by tensor): the constructor checks `dir` and creates DIR.tmp-<pid> (step 1),
// open_file() and close_file() write each file, commit() swaps the folder in (steps 2 and 3).
// Destroyed without commit(), it removes the temporary folder and `dir` keeps its old contents.
// `dir` itself may not be a symbolic link (a UserError says so).
class FolderReplacement {
 public:
  explicit FolderReplacement(const std::string& dir, FolderWriteHooks hooks = {});
  ~FolderReplacement();
  FolderReplacement(const FolderReplacement&) = delete;
  FolderReplacement& operator=(const FolderReplacement&) = delete;

  // A new file `name` of the folder; several may be open at once. Errors show it under its final
  // name (DIR/name).
  AtomicFile& open_file(const std::string& name);
  // Commits a file open_file() gave (stage "wrote <name>").
  void close_file(AtomicFile& file);
  // Swaps the folder in; every file must be closed.
  void commit();

  // "; the previous contents of 'DIR' are unchanged" (empty for a new folder): what a failure
  // before commit() adds to its message.
  const std::string& unchanged_note() const { return unchanged_; }

 private:
  void stage(std::string_view name) const;

  std::string dir_;
  std::string target_, parent_, base_, tmp_;
  FolderWriteHooks hooks_;
  bool existed_ = false;
  bool committed_ = false;
  std::string unchanged_;
  FolderClaim claim_;  // on tmp_, while this writes it
  std::vector<std::unique_ptr<AtomicFile>> open_;
};

// The folder to read for `dir`: `dir` itself when it exists; else the complete previous folder a
// save interrupted between its two renames left as `dir`.old-<pid>-<random>; else `dir` (so that
// the caller reports it missing).
std::string resolve_folder(const std::string& dir);

}  // namespace tandem::io
