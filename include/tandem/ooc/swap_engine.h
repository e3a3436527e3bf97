// Asynchronous transfers between memory and a slow tier: a swap-out stream and a swap-in stream,
// each on its own thread, so that both overlap each other and the caller's compute.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tandem/ooc/slow_tier.h"

namespace tandem::ooc {

// Writes (swap-out) are served by one thread and reads (swap-in) by another, each in submission
// order. The two streams are not ordered with respect to each other: a read of a range being
// written must be submitted after wait() on that write returned.
//
// A failed transfer's error (a UserError from the tier) is rethrown by wait() on its ticket. Its
// stream then stops moving data: every transfer submitted to it after the failure fails with the
// same error, since what it would write or read depends on the data that was lost.
class SwapEngine {
 public:
  explicit SwapEngine(SlowTier& tier);
  // Finishes the queued transfers, then joins both threads. Never throws; errors nobody waited
  // for are dropped.
  ~SwapEngine();
  SwapEngine(const SwapEngine&) = delete;
  SwapEngine& operator=(const SwapEngine&) = delete;

  // Identifies one transfer; unique across both streams, never 0.
  using Ticket = uint64_t;

  // Queue a copy of `bytes` from `src` to the tier at `offset` (or from the tier into `dst`); the
  // memory must stay valid and untouched until the transfer is waited for. `label` names it in
  // spans (e.g. the activation it holds).
  Ticket write_async(uint64_t offset, const void* src, size_t bytes, std::string label = {});
  Ticket read_async(uint64_t offset, void* dst, size_t bytes, std::string label = {});

  // Returns when transfer `t` is done; if it failed, rethrows its error.
  void wait(Ticket t);
  // Returns when every submitted transfer is done; rethrows the first error if any failed.
  void wait_all();

  // One completed transfer, for traces and bandwidth measurement.
  struct Span {
    bool write;
    std::string label;
    uint64_t bytes;
    std::chrono::steady_clock::time_point begin, end;
  };
  // The transfers completed since the last call, in completion order (failed ones are left out).
  std::vector<Span> take_spans();

  SlowTier& tier();

 private:
  struct Transfer {
    Ticket ticket;
    uint64_t offset;
    void* memory;  // the source of a write (never written through) or the target of a read
    size_t bytes;
    std::string label;
  };
  struct Stream {
    explicit Stream(bool is_write) : write(is_write) {}
    const bool write;
    std::deque<Transfer> queue;
    std::condition_variable has_work;
    std::exception_ptr error;  // the stream's first failure; set, it moves no more data
    std::thread thread;
  };

  Ticket submit(Stream& stream, uint64_t offset, void* memory, size_t bytes, std::string label);
  void serve(Stream& stream);
  void stop();

  SlowTier& tier_;
  std::mutex mutex_;  // guards the queues, tickets, errors, spans and stopping_
  std::condition_variable done_;
  Stream writes_{true};
  Stream reads_{false};
  Ticket next_ticket_ = 1;
  std::unordered_set<Ticket> pending_;                     // queued or in flight
  std::unordered_map<Ticket, std::exception_ptr> failed_;  // done, with this error
  std::exception_ptr first_error_;
  std::vector<Span> spans_;
  bool stopping_ = false;
};

}  // namespace tandem::ooc
