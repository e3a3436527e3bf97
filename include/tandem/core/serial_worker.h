// A thread that runs submitted jobs one at a time, in submission order: tandem's one in-order
// worker. A rank's communication thread is one (the data-parallel gradient exchange runs on one
// while the backward goes on; a compiled pipeline's collectives run on one while the next block
// computes): jobs that communicate are issued in the same order on every rank because each rank
// submits them in its own deterministic order. The transfer engine's two streams are two more.
//
// Errors: the first exception a job throws is kept, the jobs queued after it are dropped (a rank
// whose collective failed must not start the next one), and wait() rethrows it. The destructor
// waits for the running job and drops the rest (call wait() first to finish them).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace tandem {

class SerialWorker {
 public:
  // `name` (at most 15 characters) names the thread for profilers and debuggers.
  explicit SerialWorker(std::string name = "tandem-worker");
  ~SerialWorker();
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;

  // Queues `job`; returns its ticket (1, 2, ... in submission order).
  uint64_t submit(std::function<void()> job);
  // Returns when every submitted job has run; rethrows the first job's exception (once; the
  // worker is usable again after).
  void wait();
  // Returns when the job of `ticket` (and so every job before it) has run; rethrows a failure
  // (kept for wait()) if one happened before it.
  void wait_for(uint64_t ticket);

 private:
  void loop(const std::string& name);

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool busy_ = false, stop_ = false;
  uint64_t submitted_ = 0, done_ = 0;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace tandem
