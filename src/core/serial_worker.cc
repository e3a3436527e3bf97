// The in-order worker thread (see serial_worker.h).
#include "tandem/core/serial_worker.h"

#include <pthread.h>

#include <utility>

namespace tandem {

SerialWorker::SerialWorker(std::string name)
    : thread_([this, name = std::move(name)] { loop(name); }) {}

SerialWorker::~SerialWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t SerialWorker::submit(std::function<void()> job) {
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ticket = ++submitted_;
    if (error_) return ticket;  // a failed job drops what follows it
    queue_.push_back(std::move(job));
  }
  cv_.notify_all();
  return ticket;
}

void SerialWorker::wait_for(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return done_ >= ticket || error_; });
  if (error_) std::rethrow_exception(error_);
}

void SerialWorker::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [this] { return queue_.empty() && !busy_; });
  done_ = submitted_;  // jobs dropped after a failure count as done
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void SerialWorker::loop(const std::string& name) {
  ::pthread_setname_np(::pthread_self(), name.substr(0, 15).c_str());
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    std::function<void()> job = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    std::exception_ptr failed;
    try {
      job();
    } catch (...) {
      failed = std::current_exception();
    }
    lock.lock();
    busy_ = false;
    ++done_;
    if (failed && !error_) {
      error_ = failed;
      queue_.clear();
    }
    cv_.notify_all();
  }
}

}  // namespace tandem
