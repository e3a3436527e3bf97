// Asynchronous transfers between memory and a slow tier: a swap-out stream and a swap-in stream,
// each on its own in-order thread (core::SerialWorker), so that both overlap each other and the
// caller's compute.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "tandem/core/serial_worker.h"
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
  // One direction: its in-order thread, and its first failure (under mutex_; set, it moves no more
  // data).
  struct Stream {
    Stream(bool is_write, std::string name) : write(is_write), worker(std::move(name)) {}
    const bool write;
    std::exception_ptr error;
    SerialWorker worker;
  };

  Ticket submit(Stream& stream, uint64_t offset, void* memory, size_t bytes, std::string label);
  // On the stream's thread: one transfer, its outcome recorded for the waiters. Never throws.
  void carry_out(Stream& stream, Ticket ticket, uint64_t offset, void* memory, size_t bytes,
                 std::string& label);

  SlowTier& tier_;
  std::mutex mutex_;  // guards the tickets, errors, spans and stopping_
  std::condition_variable done_;
  Ticket next_ticket_ = 1;
  std::unordered_set<Ticket> pending_;                     // queued or in flight
  std::unordered_map<Ticket, std::exception_ptr> failed_;  // done, with this error
  std::exception_ptr first_error_;
  std::vector<Span> spans_;
  bool stopping_ = false;
  // Last: their threads stop before what their transfers use goes away.
  Stream writes_{true, "tandem-swap-out"};
  Stream reads_{false, "tandem-swap-in"};
};

}  // namespace tandem::ooc
