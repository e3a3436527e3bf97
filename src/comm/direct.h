// The Direct algorithms, written once over "peer memory": every rank of a group reads its peers'
// buffers where they lie, reduces its part chunk by chunk (running the hook on each chunk while it
// is in cache), publishes it, and copies the parts its peers publish. The thread backend runs them
// over threads of one process; the MPI backend over processes of one node that map each other's
// shared arenas (shared_arena.h). Internal to comm/.
//
// Shared state, per group: one Slot per rank, where a rank posts its current call (double-
// buffered by the parity of the call's sequence number, so a rank may post call s+1 while a slow
// peer still reads call s) and publishes three counters: `posted` (the call whose descriptor is
// up), `progress` (how many chunks of its part it has reduced, tagged with the call) and
// `finished` (the last call in which it stopped touching its peers' buffers). A call runs: post;
// wait until every peer has posted; compare the posted calls (mismatches are caught here); the
// body; publish finished; wait until every peer has finished (so no rank returns, and lets its
// caller reuse its buffer, while a peer still reads it).
//
// Everything in a Slot is plain data and lock-free atomics, so it may live in memory shared
// between processes; buffers are posted as addresses that PeerMemory turns into pointers of the
// reading process.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "parts.h"
#include "tandem/comm/communicator.h"
#include "timeout.h"
#include "wait.h"

namespace tandem::comm::detail {

// What a group call is (the collectives, plus the two calls that share their protocol).
enum class Call : uint8_t { AllReduce, ReduceScatter, AllGather, Broadcast, Shift, Barrier, Split };
std::string_view call_name(Call c);

// A buffer the peers cannot read (not in shared memory): the call runs the ring instead.
inline constexpr uint64_t kNotShared = ~uint64_t{0};

// One rank's posted call.
struct PostedCall {
  Call call = Call::Barrier;
  ReduceOp op = ReduceOp::Sum;
  DType dtype = DType::F32;
  CollectiveAlgo algo = CollectiveAlgo::Auto;
  int64_t n = 0;                           // elements of the whole buffer
  int64_t outer = 1, rows = 0, inner = 1;  // its partition (rows resolved: never -1)
  uint64_t chunk_bytes = 0;  // its resolved chunk size: the peers count this rank's chunks by it
  bool send_whole = false;   // all_gather: `send` is the output itself, the part in place
  int root = 0;
  uint64_t send = 0, recv = 0;  // addresses (PeerMemory::address_of), or kNotShared
  int color = 0, key = 0;       // split
};

struct alignas(64) Counter {
  std::atomic<uint64_t> v{0};
};

struct Slot {
  Counter posted;
  Counter progress;  // (call sequence number << 32) | chunks published
  Counter finished;
  PostedCall call[2];
};

// What the Direct algorithms need from a backend: the group's slots and bells, and the mapping
// between this process's pointers and the addresses its peers can resolve.
class PeerMemory {
 public:
  virtual ~PeerMemory() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Slot& slot(int q) const = 0;
  virtual Bell& bell(int q) const = 0;  // ring rank q's after a change it may wait for
  virtual const SpinPolicy& spin() const = 0;
  // The address under which the peers find [p, p + bytes), or kNotShared.
  virtual uint64_t address_of(const void* p, size_t bytes) const = 0;
  // Rank q's posted address as a pointer in this process.
  virtual char* resolve(int q, uint64_t address) const = 0;
  // Runs between sleeps of every wait; throws when the wait can never end (the group was
  // aborted, rank q has gone: q is -1 when no single rank is awaited).
  virtual void check(std::string_view where, int q, const std::function<bool()>& ready) = 0;
  // "ranks 1 and 3", with their world ranks where they differ.
  virtual std::string ranks_named(const std::vector<int>& ranks) const = 0;
  // After this rank failed inside call `seq`: failed() tells the group (thread: aborts it, so
  // that nobody waits for this rank forever); wait_quiet() returns once no peer can still be
  // reading this rank's buffers.
  virtual void failed(std::exception_ptr e) { (void)e; }
  virtual void wait_quiet(uint64_t seq) { (void)seq; }
};

// One communicator's side of the protocol and the algorithms.
class Direct {
 public:
  explicit Direct(PeerMemory& mem) : mem_(mem), srcs_(mem.size()) {}

  // Runs one group call: post `c`, meet the peers, check they called the same thing, run
  // body(seq), and (when the body read peers' buffers) wait until every peer is done with ours.
  void group_call(const PostedCall& c, bool shares_buffers,
                  const std::function<void(uint64_t)>& body);

  // A validated collective: the Direct algorithm when every rank's buffers are shared, else
  // `ring` (the same choice on every rank: all read the same posted calls).
  void run(const CollectiveDesc& d, const std::function<void()>& ring);

  // Whether every rank posted shared buffers for call `seq`.
  bool all_shared(uint64_t seq) const;

  // Publishes `chunks` as this rank's progress in call `seq` and wakes the peers.
  void publish(uint64_t seq, uint64_t chunks);
  // Rank q's published progress in call `seq` (0 before it publishes any).
  int64_t published(int q, uint64_t seq) const;
  // Blocks until ready(); q names the awaited rank for checks and timeouts (-1: none).
  void wait_for(Call call, int q, const std::function<bool()>& ready);
  const PostedCall& posted(int q, uint64_t seq) const { return mem_.slot(q).call[seq & 1]; }
  std::string at(Call c) const;

 private:
  void check_matching(uint64_t seq, Call call) const;
  std::string late_ranks(int q) const;
  void ring_peers() const;

  void reduce(const PostedCall& d, uint64_t seq, char* dst, bool dst_packed, const ChunkHook* hook,
              bool publish);
  void all_reduce(const PostedCall& d, uint64_t seq, const ChunkHook* hook);
  void all_gather(const PostedCall& d, uint64_t seq);
  void broadcast(const PostedCall& d, uint64_t seq);
  void shift(const PostedCall& d, uint64_t seq);
  void gather_published(const PostedCall& d, uint64_t seq, bool block);

  PeerMemory& mem_;
  uint64_t seq_ = 0;
  Deadline deadline_;              // of the current group call, started when it posts
  std::vector<const void*> srcs_;  // reused: one input pointer per rank
  std::vector<int64_t> gathered_;  // reused: chunks of each part copied so far
};

}  // namespace tandem::comm::detail
