// The files a run will write (--save, --metrics, --trace), checked before its first step, so that a
// bad path is refused at once instead of after hours of training; and the lock that keeps a second
// run from writing the same --save folder. Internal to train/.
#pragma once

#include <string>

#include "tandem/train/train_config.h"

namespace tandem::train::detail {

// Creates the folders the outputs go in (as mkdir -p does) and proves each writable by writing
// there; a path that cannot be written is a UserError naming its flag, the path and the reason.
// On MPI only world rank 0 writes, so only it calls this.
void check_outputs(const TrainConfig& cfg);

// The name of the lock file in a --save folder.
inline constexpr const char* kSaveLockFile = ".tandem-lock";

// Holds an exclusive flock(2) on DIR/.tandem-lock (holding this process's pid) while it lives, so
// that two runs never write one --save folder (each would remove the other's temporary folders
// and step folders). A folder another run holds is a UserError naming that run's pid. The lock
// file is removed when the lock is let go. On a filesystem without flock (some NFS mounts) the
// folder is not locked. On MPI only world rank 0 writes, so only it holds the lock. Once held, the
// temporary files and folders of saves killed part-way are removed.
class SaveFolderLock {
 public:
  explicit SaveFolderLock(const std::string& dir);
  ~SaveFolderLock();
  SaveFolderLock(const SaveFolderLock&) = delete;
  SaveFolderLock& operator=(const SaveFolderLock&) = delete;

 private:
  static void remove_temporaries(const std::string& dir);
  std::string path_;
  int fd_ = -1;
};

}  // namespace tandem::train::detail
