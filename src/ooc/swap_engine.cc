// The swap engine: two in-order workers, one per direction, reporting completions (and
// failures) to waiters through one condition variable.
#include "tandem/ooc/swap_engine.h"

#include <utility>

#include "tandem/core/error.h"

namespace tandem::ooc {

SwapEngine::SwapEngine(SlowTier& tier) : tier_(tier) {}

// Finishes the queued transfers (their jobs never throw), then the workers' destructors join.
SwapEngine::~SwapEngine() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  writes_.worker.wait();
  reads_.worker.wait();
}

SwapEngine::Ticket SwapEngine::write_async(uint64_t offset, const void* src, size_t bytes,
                                           std::string label) {
  // The write stream only reads through this pointer; one pointer type serves both directions.
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
  Ticket ticket = 0;
  {
    std::lock_guard lock(mutex_);
    TANDEM_CHECK(!stopping_, "transfer submitted to a swap engine being destroyed");
    ticket = next_ticket_++;
    pending_.insert(ticket);
  }
  stream.worker.submit(
      [this, &stream, ticket, offset, memory, bytes, label = std::move(label)]() mutable {
        carry_out(stream, ticket, offset, memory, bytes, label);
      });
  return ticket;
}

void SwapEngine::carry_out(Stream& stream, Ticket ticket, uint64_t offset, void* memory,
                           size_t bytes, std::string& label) {
  std::unique_lock lock(mutex_);
  std::exception_ptr error = stream.error;
  Span span{stream.write, std::move(label), bytes, {}, {}};
  if (!error) {
    lock.unlock();
    span.begin = std::chrono::steady_clock::now();
    try {
      if (stream.write)
        tier_.write(offset, memory, bytes);
      else
        tier_.read(offset, memory, bytes);
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
    failed_.emplace(ticket, error);
  else
    spans_.push_back(std::move(span));
  pending_.erase(ticket);
  done_.notify_all();
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
