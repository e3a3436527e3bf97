// A per-thread team of blocking helpers (see parallel.h).
#include "tandem/core/parallel.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "tandem/core/blas.h"

namespace tandem {
namespace {

// Whether this thread is inside a parallel region (or is a helper): nested calls run serially.
thread_local bool in_region = false;

class Team {
 public:
  ~Team() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : helpers_) t.join();
  }

  // Runs parts 1..parts-1 on helpers and part 0 here.
  void run(int parts, const std::function<void(int)>& body) {
    while (static_cast<int>(helpers_.size()) < parts - 1) {
      const int id = static_cast<int>(helpers_.size()) + 1;
      helpers_.emplace_back([this, id] { helper_loop(id); });
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      body_ = &body;
      parts_ = parts;
      pending_ = parts - 1;
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    std::exception_ptr mine;
    try {
      body(0);
    } catch (...) {
      mine = std::current_exception();
    }
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
    body_ = nullptr;
    if (mine) std::rethrow_exception(mine);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void helper_loop(int id) {
    in_region = true;
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      if (id >= parts_) continue;  // this region needs fewer helpers
      lock.unlock();
      std::exception_ptr error;
      try {
        (*body_)(id);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      if (error && !error_) error_ = error;
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> helpers_;
  const std::function<void(int)>* body_ = nullptr;
  int parts_ = 1;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
};

}  // namespace

int parallel_width() { return std::max(1, blas::num_threads()); }

bool in_parallel_region() { return in_region; }

void parallel_parts(int parts, const std::function<void(int)>& body) {
  if (parts <= 1 || in_region) {
    for (int part = 0; part < parts; ++part) body(part);
    return;
  }
  thread_local std::unique_ptr<Team> team = std::make_unique<Team>();
  in_region = true;
  try {
    team->run(parts, body);
  } catch (...) {
    in_region = false;
    throw;
  }
  in_region = false;
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
  if (n <= 0) return;
  const int64_t by_grain = std::max<int64_t>(1, n / std::max<int64_t>(1, grain));
  const int parts = static_cast<int>(std::min<int64_t>(parallel_width(), by_grain));
  parallel_parts(parts, [&](int part) {
    const int64_t begin = n * part / parts, end = n * (part + 1) / parts;
    if (begin < end) body(begin, end);
  });
}

}  // namespace tandem
