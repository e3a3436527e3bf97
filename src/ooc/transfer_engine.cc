// The transfer engine: two in-order workers, one per direction, reporting completions (and
// failures) to each transfer's client through one condition variable.
#include "tandem/ooc/transfer_engine.h"

#include <utility>

#include "tandem/core/error.h"

namespace tandem::ooc {

TransferEngine::TransferEngine() = default;

// Finishes what is queued (nothing, once every client is gone; the jobs never throw), then the
// workers' destructors join.
TransferEngine::~TransferEngine() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  writes_.worker.wait();
  reads_.worker.wait();
}

TransferEngine::Client::Client(TransferEngine& engine, bool keep_spans)
    : engine_(engine), keep_spans_(keep_spans) {}

TransferEngine::Client::~Client() {
  std::unique_lock lock(engine_.mutex_);
  engine_.done_.wait(lock, [&] { return pending_.empty(); });
}

TransferEngine::Ticket TransferEngine::Client::write_async(SlowTier& tier, uint64_t offset,
                                                           const void* src, size_t bytes,
                                                           std::string label, Done done) {
  // The write stream only reads through this pointer; one pointer type serves both directions.
  return write_async(tier, {{offset, const_cast<void*>(src), bytes}}, std::move(label),
                     std::move(done));
}

TransferEngine::Ticket TransferEngine::Client::read_async(SlowTier& tier, uint64_t offset,
                                                          void* dst, size_t bytes,
                                                          std::string label, Ticket after,
                                                          Done done) {
  return read_async(tier, {{offset, dst, bytes}}, std::move(label), after, std::move(done));
}

TransferEngine::Ticket TransferEngine::Client::write_async(SlowTier& tier,
                                                           std::vector<Piece> pieces,
                                                           std::string label, Done done) {
  return engine_.submit(engine_.writes_,
                        {this, &tier, 0, std::move(pieces), std::move(label), 0, std::move(done)});
}

TransferEngine::Ticket TransferEngine::Client::read_async(SlowTier& tier, std::vector<Piece> pieces,
                                                          std::string label, Ticket after,
                                                          Done done) {
  return engine_.submit(engine_.reads_, {this, &tier, 0, std::move(pieces), std::move(label), after,
                                         std::move(done)});
}

TransferEngine::Ticket TransferEngine::submit(Stream& stream, Job job) {
  // Checked here rather than on the worker, so that the report points at the caller's mistake.
  const uint64_t capacity = job.tier->capacity();
  for (const Piece& p : job.pieces)
    TANDEM_CHECK(p.bytes <= capacity && p.offset <= capacity - p.bytes,
                 "{} of {} bytes at offset {} ('{}') runs past the end of a {}-byte slow tier",
                 stream.write ? "write" : "read", p.bytes, p.offset, job.label, capacity);
  std::lock_guard lock(mutex_);
  TANDEM_CHECK(!stopping_, "transfer submitted to a transfer engine being destroyed");
  // A read may only follow a write already submitted: the write stream reaches it.
  TANDEM_CHECK(job.after <= last_write_, "read '{}' after ticket {}, which is no write", job.label,
               job.after);
  job.ticket = next_ticket_++;
  if (stream.write) last_write_ = job.ticket;
  job.client->pending_.insert(job.ticket);
  const Ticket ticket = job.ticket;
  // Queued under the mutex, so that each stream runs its transfers in ticket order.
  stream.worker.submit([this, &stream, job = std::move(job)]() mutable { carry_out(stream, job); });
  return ticket;
}

void TransferEngine::carry_out(Stream& stream, Job& job) {
  Client& c = *job.client;
  std::unique_lock lock(mutex_);
  const Ticket after = job.after;
  if (after != 0) {
    done_.wait(lock, [&] { return writes_done_ >= after; });
  }
  std::exception_ptr& stream_error = stream.write ? c.write_error_ : c.read_error_;
  std::exception_ptr error = stream_error;
  if (!error && after != 0)
    if (auto it = c.failed_.find(after); it != c.failed_.end()) error = it->second;
  uint64_t bytes = 0;
  for (const Piece& p : job.pieces) bytes += p.bytes;
  const auto now = std::chrono::steady_clock::now();
  Span span{stream.write, std::move(job.label), bytes, now, now};
  if (!error) {
    lock.unlock();
    span.begin = std::chrono::steady_clock::now();
    try {
      for (const Piece& p : job.pieces) {
        if (stream.write)
          job.tier->write(p.offset, p.memory, p.bytes);
        else
          job.tier->read(p.offset, p.memory, p.bytes);
      }
    } catch (...) {
      error = std::current_exception();
    }
    span.end = std::chrono::steady_clock::now();
    lock.lock();
  }
  if (error) {
    if (!stream_error) stream_error = error;
    if (!c.first_error_) c.first_error_ = error;
  }
  if (job.done) {
    lock.unlock();
    try {
      job.done(span, error);
    } catch (...) {
      if (!error) error = std::current_exception();
    }
    lock.lock();
  }
  if (error)
    c.failed_.emplace(job.ticket, error);
  else if (c.keep_spans_ && !job.done)
    c.spans_.push_back(std::move(span));
  c.pending_.erase(job.ticket);
  if (stream.write) writes_done_ = job.ticket;
  done_.notify_all();
}

void TransferEngine::Client::wait(Ticket t) {
  std::unique_lock lock(engine_.mutex_);
  TANDEM_CHECK(t != 0 && t < engine_.next_ticket_, "wait on ticket {}, which was never issued", t);
  engine_.done_.wait(lock, [&] { return !pending_.contains(t); });
  if (auto it = failed_.find(t); it != failed_.end()) std::rethrow_exception(it->second);
}

void TransferEngine::Client::wait_all() {
  std::unique_lock lock(engine_.mutex_);
  engine_.done_.wait(lock, [&] { return pending_.empty(); });
  if (first_error_) std::rethrow_exception(first_error_);
}

std::vector<TransferEngine::Span> TransferEngine::Client::take_spans() {
  std::lock_guard lock(engine_.mutex_);
  return std::exchange(spans_, {});
}

TransferEngine& TransferEngines::of(const TierSpec& spec) {
  std::unique_ptr<TransferEngine>& e = engines_[spec.str()];
  if (e == nullptr) e = std::make_unique<TransferEngine>();
  return *e;
}

}  // namespace tandem::ooc
