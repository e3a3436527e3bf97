// The swap engine: two worker threads, one per direction, each draining its queue in order and
// reporting completions (and failures) to waiters through one condition variable.
#include "tandem/ooc/swap_engine.h"

#include <pthread.h>

#include <utility>

#include "tandem/core/error.h"

namespace tandem::ooc {

SwapEngine::SwapEngine(SlowTier& tier) : tier_(tier) {
  writes_.thread = std::thread([this] { serve(writes_); });
  try {
    reads_.thread = std::thread([this] { serve(reads_); });
  } catch (...) {
    stop();
    throw;
  }
  // Named so that a profiler or a debugger shows which stream a thread serves.
  ::pthread_setname_np(writes_.thread.native_handle(), "tandem-swap-out");
  ::pthread_setname_np(reads_.thread.native_handle(), "tandem-swap-in");
}

SwapEngine::~SwapEngine() { stop(); }

void SwapEngine::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  for (Stream* stream : {&writes_, &reads_}) {
    stream->has_work.notify_one();
    if (stream->thread.joinable()) stream->thread.join();
  }
}

SwapEngine::Ticket SwapEngine::write_async(uint64_t offset, const void* src, size_t bytes,
                                           std::string label) {
  // The write stream only reads through this pointer; Transfer keeps one pointer type for both.
  return submit(writes_, offset, const_cast<void*>(src), bytes, std::move(label));
}

SwapEngine::Ticket SwapEngine::read_async(uint64_t offset, void* dst, size_t bytes,
                                          std::string label) {
  return submit(reads_, offset, dst, bytes, std::move(label));
}

SwapEngine::Ticket SwapEngine::submit(Stream& stream, uint64_t offset, void* memory, size_t bytes,
                                      std::string label) {
  // Checked here rather than on the worker, so that the report points at the caller's mistake.
  const uint64_t capacity = tier_.capacity();
  TANDEM_CHECK(bytes <= capacity && offset <= capacity - bytes,
               "{} of {} bytes at offset {} ('{}') runs past the end of a {}-byte slow tier",
               stream.write ? "swap-out" : "swap-in", bytes, offset, label, capacity);
  std::lock_guard lock(mutex_);
  TANDEM_CHECK(!stopping_, "transfer submitted to a swap engine being destroyed");
  const Ticket ticket = next_ticket_++;
  pending_.insert(ticket);
  stream.queue.push_back(Transfer{ticket, offset, memory, bytes, std::move(label)});
  stream.has_work.notify_one();
  return ticket;
}

void SwapEngine::serve(Stream& stream) {
  std::unique_lock lock(mutex_);
  for (;;) {
    stream.has_work.wait(lock, [&] { return stopping_ || !stream.queue.empty(); });
    if (stream.queue.empty()) return;  // stopping, and everything queued is done
    Transfer transfer = std::move(stream.queue.front());
    stream.queue.pop_front();
    std::exception_ptr error = stream.error;
    Span span{stream.write, std::move(transfer.label), transfer.bytes, {}, {}};
    if (!error) {
      lock.unlock();
      span.begin = std::chrono::steady_clock::now();
      try {
        if (stream.write)
          tier_.write(transfer.offset, transfer.memory, transfer.bytes);
        else
          tier_.read(transfer.offset, transfer.memory, transfer.bytes);
      } catch (...) {
        error = std::current_exception();
      }
      span.end = std::chrono::steady_clock::now();
      lock.lock();
      if (error) {
        stream.error = error;
        if (!first_error_) first_error_ = error;
      }
    }
    if (error)
      failed_.emplace(transfer.ticket, error);
    else
      spans_.push_back(std::move(span));
    pending_.erase(transfer.ticket);
    done_.notify_all();
  }
}

void SwapEngine::wait(Ticket t) {
  std::unique_lock lock(mutex_);
  TANDEM_CHECK(t != 0 && t < next_ticket_, "wait on ticket {}, which was never issued", t);
  done_.wait(lock, [&] { return !pending_.contains(t); });
  if (auto it = failed_.find(t); it != failed_.end()) std::rethrow_exception(it->second);
}

void SwapEngine::wait_all() {
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return pending_.empty(); });
  if (first_error_) std::rethrow_exception(first_error_);
}

std::vector<SwapEngine::Span> SwapEngine::take_spans() {
  std::lock_guard lock(mutex_);
  return std::exchange(spans_, {});
}

SlowTier& SwapEngine::tier() { return tier_; }

}  // namespace tandem::ooc
