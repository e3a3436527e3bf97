// Helpers shared by the train/ tests: a scratch folder per test, and catching the UserError a
// call must raise so its message can be compared with what a user should read.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/train/trainer.h"
#include "support/scratch.h"

namespace tandem::train::testing {

using tandem::testing::ScratchDir;
using tandem::testing::user_error_of;


// A model small enough that a step takes milliseconds on one core, trained on the synthetic
// corpus by one in-process rank, printing nothing.
inline TrainConfig tiny_run(int64_t steps) {
  TrainConfig c;
  c.model.n_layers = 2;
  c.model.n_heads = 2;
  c.model.d_model = 16;
  c.model.seq_len = 16;
  c.model.max_positions = 16;
  c.batch = 4;
  c.steps = steps;
  c.lr = 1e-2;
  c.warmup = 2;
  c.grid = {1, 1, 1};
  c.synthetic_bytes = 1 << 14;
  c.eval_every = 0;
  c.progress = false;
  c.blas_threads = 1;
  c.executor = "plan";  // no JIT compile: these runs are about files, not speed
  static std::ostringstream sink;  // the summary lines, unread
  c.out = &sink;
  return c;
}

// Two runs' final weights (keep_weights) and losses, equal bit for bit.
inline void expect_bitwise(const TrainResult& a, const TrainResult& b, const std::string& what) {
  ASSERT_EQ(a.weights.size(), b.weights.size()) << what;
  size_t differ = 0;
  for (size_t i = 0; i < a.weights.size(); ++i) differ += a.weights[i] != b.weights[i];
  EXPECT_EQ(differ, 0u) << what << ": weights differ in " << differ << " of " << a.weights.size();
  EXPECT_EQ(a.losses, b.losses) << what;
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}


// While alive, writing a file past `bytes` fails with EFBIG ("File too large") the way a full disk
// fails with ENOSPC: the same write(2) error path, without needing a full disk.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &saved_);
    old_handler_ = ::signal(SIGXFSZ, SIG_IGN);  // else the kernel kills the process
    rlimit lim = saved_;
    lim.rlim_cur = bytes;
    EXPECT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    ::signal(SIGXFSZ, old_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit saved_{};
  sighandler_t old_handler_;
};

}  // namespace tandem::train::testing
