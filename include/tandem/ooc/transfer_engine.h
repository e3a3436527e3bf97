// Asynchronous transfers between memory and slow tiers: a write stream and a read stream, each on
// its own in-order thread (core::SerialWorker), so that both overlap each other and the callers'
// compute. A run has one engine per tier (TransferEngines), shared by the clients that use it: the
// activations' swaps, the model state's store, the optimizer's moments, each in its own SlowTier.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "tandem/core/serial_worker.h"
#include "tandem/ooc/slow_tier.h"

namespace tandem::ooc {

// Writes are served by one thread and reads by another, each in submission order, whichever client
// submitted them. A read may name a write it must follow (`after`): it runs, on the read stream,
// once that write and every write submitted before it have finished. Reads that name none are not
// ordered with respect to the writes.
//
// Transfers are submitted, waited for and traced through a Client: one user's transfers, each to
// or from a SlowTier it names (the client's own region; the engine is bound to none). A failed
// transfer's error (a UserError from the tier) is rethrown by wait() on its ticket. The client's
// stream (its writes, or its reads) then stops moving data: every transfer of that client
// submitted to it after the failure fails with the same error, since what it would write or read
// depends on the data that was lost; a read after a failed write fails with the write's error.
// Other clients' transfers go on.
class TransferEngine {
 public:
  TransferEngine();
  // Joins both threads. Every client must be gone first (each waits for its own transfers).
  ~TransferEngine();
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  // Identifies one transfer; unique across the engine's streams and clients, never 0.
  using Ticket = uint64_t;

  // One completed transfer, for traces and bandwidth measurement.
  struct Span {
    bool write;
    std::string label;
    uint64_t bytes;
    std::chrono::steady_clock::time_point begin, end;
  };

  // One contiguous range of a transfer: `bytes` at byte `offset` of the tier, from or into
  // `memory` (only read from, by a write).
  struct Piece {
    uint64_t offset;
    void* memory;
    size_t bytes;
  };

  // Called on the stream's thread when a transfer is over, with its span and its error (null when
  // it succeeded), before wait() on its ticket returns; for the client's own bookkeeping. It must
  // not throw (an exception it throws becomes the transfer's error).
  using Done = std::function<void(const Span& span, std::exception_ptr error)>;

  class Client {
   public:
    // `keep_spans`: the spans of completed transfers without a `done` are kept for take_spans().
    explicit Client(TransferEngine& engine, bool keep_spans = false);
    // Waits for this client's transfers. Never throws; errors nobody waited for are dropped.
    ~Client();
    Client(const Client&) = delete;
    Client& operator=(const Client&) = delete;

    // Queue a copy of `bytes` from `src` to `tier` at `offset` (or from the tier into `dst`); the
    // memory must stay valid and untouched until the transfer is waited for, and the tier until
    // every transfer naming it is. `label` names the transfer in spans; a read runs only once
    // write `after` (of this client; 0: none) has finished; `done` (may be empty) is called when
    // the transfer is over.
    Ticket write_async(SlowTier& tier, uint64_t offset, const void* src, size_t bytes,
                       std::string label = {}, Done done = {});
    Ticket read_async(SlowTier& tier, uint64_t offset, void* dst, size_t bytes,
                      std::string label = {}, Ticket after = 0, Done done = {});
    // Several ranges as one transfer: one ticket, one span, one `done`, moved in order.
    Ticket write_async(SlowTier& tier, std::vector<Piece> pieces, std::string label = {},
                       Done done = {});
    Ticket read_async(SlowTier& tier, std::vector<Piece> pieces, std::string label = {},
                      Ticket after = 0, Done done = {});

    // Returns when this client's transfer `t` is done; if it failed, rethrows its error.
    void wait(Ticket t);
    // Returns when every transfer this client submitted is done; rethrows its first error if any
    // failed.
    void wait_all();
    // This client's transfers completed since the last call, in completion order (failed ones are
    // left out); empty unless made with keep_spans.
    std::vector<Span> take_spans();

    TransferEngine& engine() { return engine_; }

   private:
    friend class TransferEngine;
    TransferEngine& engine_;
    const bool keep_spans_;
    // Under the engine's mutex.
    std::unordered_set<Ticket> pending_;                     // queued or in flight
    std::unordered_map<Ticket, std::exception_ptr> failed_;  // done, with this error
    std::exception_ptr write_error_, read_error_;            // each stream's first failure
    std::exception_ptr first_error_;
    std::vector<Span> spans_;
  };

 private:
  // One direction: its in-order thread.
  struct Stream {
    Stream(bool is_write, std::string name) : write(is_write), worker(std::move(name)) {}
    const bool write;
    SerialWorker worker;
  };
  struct Job {
    Client* client;
    SlowTier* tier;
    Ticket ticket;
    std::vector<Piece> pieces;
    std::string label;
    Ticket after;
    Done done;
  };

  // Queues `job` (all but its ticket filled in) on `stream`; returns its ticket.
  Ticket submit(Stream& stream, Job job);
  // On the stream's thread: one transfer, its outcome recorded for the waiters. Never throws.
  void carry_out(Stream& stream, Job& job);

  std::mutex mutex_;  // guards the tickets, every client's state, writes_done_ and stopping_
  std::condition_variable done_;
  Ticket next_ticket_ = 1;
  Ticket last_write_ = 0;   // the last write submitted
  Ticket writes_done_ = 0;  // the last write finished (writes finish in ticket order)
  bool stopping_ = false;
  // Last: their threads stop before what their transfers use goes away.
  Stream writes_{true, "tandem-tier-out"};
  Stream reads_{false, "tandem-tier-in"};
};

// The engines of one rank's tiers: those named alike (TierSpec::str(): --slow-tier,
// --model-state, --optimizer-state) share one, made on first use. It must outlive every client
// of its engines.
class TransferEngines {
 public:
  TransferEngine& of(const TierSpec& spec);

 private:
  std::map<std::string, std::unique_ptr<TransferEngine>> engines_;
};

}  // namespace tandem::ooc
