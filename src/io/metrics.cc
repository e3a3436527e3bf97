// The JSON-lines metrics writer.
#include "tandem/io/metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "tandem/core/error.h"
#include "tandem/core/file_io.h"

namespace tandem::io {

void PhaseTimer::add(std::string_view phase, double seconds) {
  for (auto& [name, s] : phases_)
    if (name == phase) {
      s += seconds;
      return;
    }
  phases_.emplace_back(std::string(phase), seconds);
}

PhaseTimer::Scope::Scope(PhaseTimer* timer, std::string_view phase)
    : timer_(timer), phase_(phase), begin_(Clock::now()) {}

PhaseTimer::Scope::~Scope() {
  timer_->add(phase_, std::chrono::duration<double>(Clock::now() - begin_).count());
}

double PhaseTimer::total() const {
  double t = 0;
  for (const auto& [name, s] : phases_) t += s;
  return t;
}

std::string metrics_json_line(const StepMetrics& m) {
  // Insertion order, so every line reads step, loss, ... in the same order.
  nlohmann::ordered_json j;
  j["step"] = m.step;
  j["loss"] = m.loss;
  if (m.val_loss) j["val_loss"] = *m.val_loss;
  j["tokens_per_s"] = m.tokens_per_s;
  if (!m.phase_s.empty()) {
    nlohmann::ordered_json phases = nlohmann::ordered_json::object();
    for (const auto& [name, s] : m.phase_s) phases[name] = s;
    j["phase_s"] = std::move(phases);
  }
  for (const auto& [name, v] : m.extra) j[name] = v;
  return j.dump();  // NaN and infinities come out as null
}

namespace {

// The length of the file up to and including its last newline: what remains once a partial last
// line (a run stopped mid-write, by a full disk or a kill) is cut off. Reads backwards from the
// end.
off_t complete_lines_length(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    user_error("cannot read metrics file '{}': {}", path, std::strerror(errno));
  char buf[4096];
  for (off_t end = st.st_size; end > 0;) {
    const off_t begin = end > static_cast<off_t>(sizeof(buf)) ? end - sizeof(buf) : 0;
    const size_t want = static_cast<size_t>(end - begin);
    const IoResult r = pread_full(fd, buf, want, static_cast<uint64_t>(begin));
    if (!r.ok() || r.done < want)
      user_error("cannot read metrics file '{}': {}", path,
                 !r.ok() ? std::strerror(r.error) : "it shrank while being read");
    for (ssize_t i = static_cast<ssize_t>(want) - 1; i >= 0; --i)
      if (buf[i] == '\n') return begin + i + 1;
    end = begin;
  }
  return 0;
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  // Appending reads the end of the file too (below). O_NOFOLLOW: a link at the path is refused,
  // never written through; O_NONBLOCK: a pipe there does not hang the open (refused below).
  // O_TRUNC only once the file is known to be a regular one.
  fd_ = ::open(
      path.c_str(),
      O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | (append ? O_RDWR | O_APPEND : O_WRONLY),
      0644);
  if (fd_ < 0) {
    const int err = errno;
    if (err == ELOOP) refuse_symlink(path, "cannot write metrics file: ");
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    const std::string folder = parent.empty() ? std::string(".") : parent.string();
    if (err == ENOENT)
      user_error("cannot write metrics file '{}': folder '{}' does not exist", path, folder);
    user_error("cannot write metrics file '{}': {}", path, std::strerror(err));
  }
  struct stat opened {};
  if (::fstat(fd_, &opened) != 0 || !S_ISREG(opened.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    user_error("cannot write metrics file '{}': it is not a regular file", path);
  }
  if (!append && ::ftruncate(fd_, 0) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    user_error("cannot write metrics file '{}': {}", path, std::strerror(err));
  }
  // A resumed run continues after the last whole line, so that the next line starts on its own.
  if (append) {
    struct stat st {};
    const off_t keep = complete_lines_length(fd_, path);
    if (::fstat(fd_, &st) == 0 && keep < st.st_size && ::ftruncate(fd_, keep) != 0)
      user_error("cannot cut the partial last line of metrics file '{}': {}", path,
                 std::strerror(errno));
  }
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsWriter::write(const StepMetrics& m) {
  const std::string line = metrics_json_line(m) + "\n";
  const IoResult r = write_all(fd_, line.data(), line.size());
  if (!r.ok()) user_error("cannot write metrics file '{}': {}", path_, std::strerror(r.error));
}

}  // namespace tandem::io
