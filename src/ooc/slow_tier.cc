// The slow tiers: anonymous host memory (memcpy), and an unlinked swap file read and written with
// pread/pwrite, O_DIRECT where the filesystem allows it so that swapped activations do not also
// fill the page cache.
#include "tandem/ooc/slow_tier.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <system_error>

#include "tandem/core/bytes.h"
#include "tandem/core/error.h"
#include "tandem/core/file_io.h"

namespace tandem::ooc {
namespace fs = std::filesystem;
namespace {

std::string errno_text(int err) { return std::strerror(err); }

void check_in_range(uint64_t offset, size_t bytes, uint64_t capacity) {
  TANDEM_CHECK(bytes <= capacity && offset <= capacity - bytes,
               "a transfer of {} bytes at offset {} runs past the end of a {}-byte slow tier",
               bytes, offset, capacity);
}

// A random name part, so that several processes (or several tiers of one process) sharing a
// folder never pick the same swap file name.
std::string random_suffix() {
  static constexpr std::string_view kChars = "abcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 generator{std::random_device{}()};
  std::string suffix(6, ' ');
  for (char& c : suffix) c = kChars[generator() % kChars.size()];
  return suffix;
}

// A process over its file-size limit (RLIMIT_FSIZE) is killed by SIGXFSZ unless the signal is
// ignored; ignored, the call fails with EFBIG and the user reads why. Left alone if the program
// installed its own handler. Set once for the process, never restored: restoring would race with
// another thread's fallocate.
void ignore_file_size_signal() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (::sigaction(SIGXFSZ, nullptr, &current) == 0 && !(current.sa_flags & SA_SIGINFO) &&
        current.sa_handler == SIG_DFL)
      ::signal(SIGXFSZ, SIG_IGN);
  });
}

// Host memory outside the fast arena's budget: it stands for the GPU case, where the fast tier is
// device memory and the slow tier is host memory. MAP_NORESERVE: pages are committed as they are
// first written, so a generous capacity costs nothing until activations are swapped into it.
class HostTier final : public SlowTier {
 public:
  HostTier(uint64_t bytes, std::string_view holds) : capacity_(round_up(bytes, kIoAlignment)) {
    if (capacity_ == 0) return;
    void* p = ::mmap(nullptr, capacity_, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
      user_error("slow tier host: cannot map {} ({} bytes) of host memory for {}: {}",
                 human_bytes(capacity_), capacity_, holds, errno_text(errno));
    memory_ = static_cast<char*>(p);
  }
  ~HostTier() override {
    if (memory_) ::munmap(memory_, capacity_);
  }
  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;

  void write(uint64_t offset, const void* src, size_t bytes) override {
    check_in_range(offset, bytes, capacity_);
    if (bytes) std::memcpy(memory_ + offset, src, bytes);
  }
  void read(uint64_t offset, void* dst, size_t bytes) override {
    check_in_range(offset, bytes, capacity_);
    if (bytes) std::memcpy(dst, memory_ + offset, bytes);
  }
  uint64_t capacity() const override { return capacity_; }
  std::string describe() const override { return "host memory"; }

 private:
  uint64_t capacity_;
  char* memory_ = nullptr;
};

// A swap file on a (fast) disk: the NVMe-offload case.
class FileTier final : public SlowTier {
 public:
  FileTier(const std::string& dir, uint64_t bytes, std::string_view holds)
      : capacity_(round_up(bytes, kIoAlignment)) {
    prepare_folder(dir);
    create_unlinked_file(dir);
    reserve_space(dir, holds);
  }
  ~FileTier() override {
    if (fd_ >= 0) ::close(fd_);
  }
  FileTier(const FileTier&) = delete;
  FileTier& operator=(const FileTier&) = delete;

  void write(uint64_t offset, const void* src, size_t bytes) override {
    check_transfer(offset, src, bytes);
    if (const IoResult r = pwrite_all(fd_, src, bytes, offset); !r.ok())
      fail("write", offset, bytes, errno_text(r.error));
    // Without O_DIRECT the written pages would stay cached, holding the very memory that swapping
    // out was meant to free; this starts their write-back and drops them once clean.
    if (!direct_ && bytes)
      ::posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(bytes),
                      POSIX_FADV_DONTNEED);
  }

  void read(uint64_t offset, void* dst, size_t bytes) override {
    check_transfer(offset, dst, bytes);
    const IoResult r = pread_full(fd_, dst, bytes, offset);
    if (!r.ok()) fail("read", offset, bytes, errno_text(r.error));
    if (r.done < bytes) fail("read", offset, bytes, "the file ended early");
  }

  uint64_t capacity() const override { return capacity_; }
  std::string describe() const override {
    return fmt::format("file {} ({})", path_,
                       direct_ ? "O_DIRECT" : "buffered: the filesystem refuses O_DIRECT");
  }

 private:
  // The folder exists (created with its parents if need be) and is a folder.
  static void prepare_folder(const std::string& dir) {
    if (dir.empty()) user_error("slow tier 'file:' names no folder; write 'file:DIR'");
    std::error_code ec;
    const bool exists = fs::exists(dir, ec);
    if (exists && !fs::is_directory(dir, ec))
      user_error("slow tier folder '{}' is not a folder", dir);
    if (!exists && !fs::create_directories(dir, ec) && ec)
      user_error("slow tier folder '{}' cannot be created: {}", dir, ec.message());
  }

  void create_unlinked_file(const std::string& dir) {
    for (int attempt = 0;; ++attempt) {
      path_ =
          (fs::path(dir) / fmt::format("tandem-swap-{}-{}", ::getpid(), random_suffix())).string();
      const int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | (direct_ ? O_DIRECT : 0);
      fd_ = retry_on_eintr([&] { return ::open(path_.c_str(), flags, 0600); });
      if (fd_ >= 0) break;
      const int err = errno;
      if (err == EEXIST && attempt < 100) continue;
      if (err == EINVAL && direct_) {
        // The kernel creates the file before it checks O_DIRECT support (O_EXCL guarantees the
        // name was ours), so the refused attempt leaves an empty file behind.
        ::unlink(path_.c_str());
        direct_ = false;
        continue;
      }
      if (err == EACCES || err == EPERM || err == EROFS)
        user_error("slow tier folder '{}' is not writable: {}", dir, errno_text(err));
      user_error("slow tier folder '{}': cannot create a swap file: {}", dir, errno_text(err));
    }
    // Unlinked now, the file lives exactly as long as the descriptor: a crash or kill -9 leaves
    // nothing behind to fill the disk.
    if (::unlink(path_.c_str()) != 0) {
      const int err = errno;
      ::close(fd_);
      fd_ = -1;
      user_error("slow tier folder '{}': cannot unlink the new swap file '{}': {}", dir, path_,
                 errno_text(err));
    }
  }

  // Reserves the whole capacity now: a full disk (or quota, or file-size limit) is reported before
  // training starts, not in the middle of a step.
  void reserve_space(const std::string& dir, std::string_view holds) {
    if (capacity_ == 0) return;
    ignore_file_size_signal();
    if (const int err = allocate_all(fd_, capacity_); err != 0) {
      ::close(fd_);
      fd_ = -1;
      user_error("slow tier {}: cannot reserve {} ({} bytes) for {}: {}", dir,
                 human_bytes(capacity_), capacity_, holds, errno_text(err));
    }
  }

  void check_transfer(uint64_t offset, const void* memory, size_t bytes) const {
    check_in_range(offset, bytes, capacity_);
    TANDEM_CHECK(reinterpret_cast<uintptr_t>(memory) % kIoAlignment == 0 &&
                     offset % kIoAlignment == 0 && bytes % kIoAlignment == 0,
                 "file tier transfers need {}-byte alignment: memory {}, offset {}, {} bytes",
                 kIoAlignment, memory, offset, bytes);
  }

  [[noreturn]] void fail(std::string_view verb, uint64_t offset, size_t bytes,
                         const std::string& reason) const {
    user_error("slow tier file '{}': cannot {} {} bytes at offset {}: {}", path_, verb, bytes,
               offset, reason);
  }

  uint64_t capacity_;
  std::string path_;
  int fd_ = -1;
  bool direct_ = true;
};

}  // namespace

TierSpec TierSpec::parse(std::string_view text) {
  if (text == "host") return {};
  if (text.starts_with("file:") && text.size() > 5)
    return TierSpec{.kind = Kind::File, .dir = std::string(text.substr(5))};
  user_error(
      "slow tier '{}' not understood; write 'host' (host memory) or 'file:DIR' (a swap file "
      "in folder DIR)",
      text);
}

std::string TierSpec::str() const { return kind == Kind::Host ? "host" : "file:" + dir; }

std::unique_ptr<SlowTier> open_slow_tier(const TierSpec& spec, uint64_t bytes,
                                         std::string_view holds) {
  if (spec.kind == TierSpec::Kind::Host) return std::make_unique<HostTier>(bytes, holds);
  return std::make_unique<FileTier>(spec.dir, bytes, holds);
}

}  // namespace tandem::ooc
