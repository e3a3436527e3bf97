// Communicator: a group of ranks that exchange tensors. Backends only move bytes (isend/irecv,
// and optionally a faster algorithm for a collective); the collective algorithms are written
// once, against this interface (Gloo's split of algorithm from transport).
//
// Every collective goes through one entry point, `run(CollectiveDesc)`, which validates the call
// (the same way for every backend) and dispatches to the backend's algorithm. Point-to-point calls
// likewise go through `isend`/`irecv`, which check the peer and tag before the backend sees them.
//
// Partitions: a collective divides its whole buffer of n elements among the p ranks by a
// PartitionDesc, which views the buffer as [outer, rows, inner] (row-major) and gives rank r
// rows [part_offset(rows, p, r), + part_count(rows, p, r)) of every outer block (core/
// formulas.h: the first rows % p ranks own one row more; a rank may own none). Rank r's part is
// thus `outer` runs of part_count(rows, p, r) * inner contiguous elements of the whole buffer;
// packed, it is those runs one after the other (a Sliced(d) tensor's local piece, with rows =
// dim d). The default, outer = inner = 1 and rows = n, is the flat split: part r is the
// contiguous elements [part_offset(n, p, r), + part_count(n, p, r)). reduce_scatter leaves rank
// r its part; all_gather expects rank r to contribute its part; all_reduce's hook runs on it.
//
// The fused-collective mechanism: reduce_scatter and all_reduce take a ChunkHook that runs on
// each chunk of this rank's part once that chunk is fully reduced, before it is gathered. This is
// how a fused optimizer step or a fused epilogue (bias, dropout, residual) runs inside the
// collective, chunk by chunk, while the chunk is still in cache. Each element of the part is seen
// by exactly one hook call; a chunk is at most the call's chunk size long (CollectiveDesc::
// chunk_bytes, else the process's chunk_bytes()), lies inside one run of the part (it never spans
// two outer blocks), and chunks arrive in ascending order of offset.
//
// Rounding: f32 reduces in f32. bf16 and f16 are loaded as f32, combined in f32 and rounded back
// (to nearest even) once per reduction step: the ring algorithm rounds after each of its p - 1
// steps; the direct algorithm (threads, MPI ranks of one node) combines all p inputs in f32 and
// rounds once; the hierarchical one (across nodes) rounds after its node step and each ring step.
// max and min propagate NaN. The result is identical on every rank (each part is reduced once,
// then copied), and identical from run to run for the same algorithm and rank count.
//
// Errors: misuse is a UserError whose message names the call, the rank and what was expected
// ("reduce_scatter on rank 1 of 3: ..."). Mismatches between ranks (sizes, dtypes, ops, roots, or
// different collectives) are detected where the backend can do it cheaply: always on the thread
// backend and among MPI ranks of one node (in shared memory), and across nodes unless
// TANDEM_COMM_VERIFY=0. A wait for peers longer than the collective
// timeout (comm_timeout_s, below) is a UserError naming the ranks that did not arrive.
//
// Threads: one Communicator is used by one thread at a time (like an MPI communicator under
// MPI_THREAD_SERIALIZED); different communicators, including those from split(), may be used
// concurrently from different threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/comm/backend.h"
#include "tandem/core/error.h"
#include "tandem/core/reduce_op.h"
#include "tandem/core/tensor.h"

namespace tandem::comm {

namespace detail {
class Ring;
class Hierarchical;
}  // namespace detail

using tandem::reduce_op_name;
using tandem::ReduceOp;  // core/reduce_op.h

// How a collective divides its whole buffer among the ranks (see Partitions above). rows < 0
// stands for the whole buffer's element count, so the default is the flat split.
struct PartitionDesc {
  int64_t outer = 1, rows = -1, inner = 1;
  bool operator==(const PartitionDesc&) const = default;
};

// Runs on a fully reduced chunk: `chunk` holds elements [offset, offset + chunk.numel()) of the
// whole (unpartitioned) buffer, a piece of one run of this rank's part, so the hook can index
// companion tensors (weights, moments) by the same offsets. It views the chunk where the result
// lies (all_reduce: the buffer; reduce_scatter: the output). It may modify `chunk` in place; what
// it leaves there is what is gathered (all_reduce) or left in the output (reduce_scatter).
// A hook that throws aborts the collective (on the thread backend: the whole group).
using ChunkHook = std::function<void(const Tensor& chunk, int64_t offset)>;

// Completion handle of an asynchronous send or receive. Destroying an incomplete request: a send
// still goes out (the thread backend keeps a copy of its bytes; on MPI the tensor must then stay
// alive until the message is received), a receive is cancelled.
class Request {
 public:
  class State {
   public:
    virtual ~State() = default;
    virtual bool test() = 0;  // true once complete; rethrows a failure
    virtual void wait() = 0;  // blocks (never spins a core away) until complete; rethrows
  };
  Request() = default;
  explicit Request(std::shared_ptr<State> s) : state_(std::move(s)) {}
  bool test() { return state_ == nullptr || state_->test(); }
  void wait() {
    if (state_ != nullptr) state_->wait();
  }

 private:
  std::shared_ptr<State> state_;
};

// Waits for every request and empties `requests`, then rethrows the first failure: none is left
// in flight when it throws.
void wait_all(std::vector<Request>& requests);

// Shift (a ring's one step): rank r's whole `send` goes to rank (r + 1) mod p's `recv`, and rank
// r receives rank (r - 1) mod p's: every rank sends and receives at once, chunk by chunk, so it
// cannot deadlock. Its buffers have one size and do not overlap; it takes no partition, hook or
// root; on one rank it is a copy.
enum class CollectiveKind : uint8_t { AllReduce, ReduceScatter, AllGather, Broadcast, Shift };
std::string_view collective_name(CollectiveKind kind);  // "all_reduce", "reduce_scatter", ...

// Which algorithm runs a collective. Auto lets the backend choose: Direct where the ranks share
// memory (threads; MPI processes of one node whose buffers come from allocator()), else Ring.
// Ring is the chunk-pipelined ring over isend/irecv that every backend has; Direct is the
// shared-memory algorithm (every rank reads its peers' buffers where they lie); asking a group
// without shared memory for Direct, or passing it a buffer its peers cannot read, is a UserError.
enum class CollectiveAlgo : uint8_t { Auto, Ring, Direct };
std::string_view collective_algo_name(CollectiveAlgo algo);  // "auto", "ring", "direct"

// The descriptor every collective call is turned into before it is validated and dispatched.
struct CollectiveDesc {
  CollectiveKind kind;
  ReduceOp op = ReduceOp::Sum;
  Tensor send{};  // AllReduce, Broadcast: the buffer (in place). ReduceScatter: the whole input.
                  // AllGather: this rank's part, packed; or `recv` itself (the part in place).
                  // Shift: what goes to the next rank.
  Tensor recv{};  // ReduceScatter: this rank's part, packed; or a buffer of the whole's size that
                  // receives the part in its place (its other elements untouched), which may be
                  // `send` itself. AllGather: the whole output.
                  // In place is also allowed where the part is contiguous in the whole (outer
                  // 1): recv (RS) or send (AG) may be exactly this rank's part of the other
                  // buffer. Any other overlap is an error. Shift: what the previous rank sent,
                  // as many elements as `send`, apart from it.
  int root = 0;   // Broadcast
  ChunkHook hook{};  // AllReduce, ReduceScatter
  CollectiveAlgo algo = CollectiveAlgo::Auto;
  // AllReduce, ReduceScatter, AllGather: how the whole buffer is divided among the ranks
  // (outer * rows * inner must be its element count). Broadcast and Shift take none.
  PartitionDesc partition{};
  // The chunk size, in bytes, this call pipelines at and runs the hook on (pieces at most this
  // long, never less than one element); 0: the process's chunk_bytes(). A program tuned at a
  // chunk size carries it here. run() resolves it once, so the algorithms see the effective size.
  // Every rank must pass the same effective size: a mismatch is a UserError naming both values.
  size_t chunk_bytes = 0;
};

// A failure every rank of a group raises together, decided from values they all hold (an
// all-reduced loss that is NaN): one failure, not one per rank. run_ranks rethrows it without a
// rank's name; under MPI the tandem command prints it once (rank 0) and every rank exits
// normally, since none waits for another. Raise it only where every rank is sure to.
class CollectiveError : public UserError {
 public:
  using UserError::UserError;
};

// What a wait that passed the collective timeout (comm_timeout_s) throws.
class TimeoutError : public UserError {
 public:
  using UserError::UserError;
};

// Tags of point-to-point messages are in [0, kMaxUserTag]; tags above are tandem's own.
inline constexpr int kMaxUserTag = 32766;

class Communicator {
 public:
  Communicator();
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Backend backend() const = 0;

  // Where to allocate buffers that go through collectives: memory the peers can read directly
  // where they can (MPI ranks on one node: the process's shared arena), else the host heap. A
  // collective on buffers from elsewhere still works, by the ring instead.
  virtual Allocator& allocator() const;
  // Whether every rank of the group can read its peers' memory (the Direct algorithm can run).
  virtual bool shares_memory() const { return false; }
  // The node of each rank of the group, as an index that is equal for ranks of one node (ranks
  // that share memory, or as TANDEM_RANKS_PER_NODE groups them). Default: one node.
  std::vector<int> rank_nodes() const;

  // Point to point, by bytes (the receive buffer must have exactly the bytes sent). The tensor
  // must stay alive and untouched until the request completes. Messages between one pair of
  // ranks with one tag arrive in the order they were sent. A peer out of [0, size()) or a tag
  // out of [0, kMaxUserTag] is a UserError. Sending to oneself is allowed.
  Request isend(const Tensor& t, int peer, int tag);
  Request irecv(const Tensor& t, int peer, int tag);
  void send(const Tensor& t, int peer, int tag) { isend(t, peer, tag).wait(); }
  void recv(const Tensor& t, int peer, int tag) { irecv(t, peer, tag).wait(); }

  virtual void barrier() = 0;

  // Collectives: every rank of the group calls the same one with matching sizes and dtypes.
  void all_reduce(const Tensor& buf, ReduceOp op, const ChunkHook& hook = {},
                  const PartitionDesc& partition = {});
  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op, const ChunkHook& hook = {},
                      const PartitionDesc& partition = {});
  void all_gather(const Tensor& in, const Tensor& out, const PartitionDesc& partition = {});
  void broadcast(const Tensor& buf, int root);
  void shift(const Tensor& in, const Tensor& out);

  // The one entry point: validates `desc`, resolves its chunk size (0: chunk_bytes()) and runs
  // the backend's algorithm for it. Taken by value: move a desc in to run it without copying its
  // hook.
  void run(CollectiveDesc desc);

  // Ranks with the same color form a new group, ordered by (key, old rank). Collective over
  // this group. A negative color leaves the caller out: it gets nullptr.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

 protected:
  // The backend's transport, called with a checked peer and tag (tags above kMaxUserTag come
  // from tandem's own algorithms).
  virtual Request post_send(const Tensor& t, int peer, int tag) = 0;
  virtual Request post_recv(const Tensor& t, int peer, int tag) = 0;

  // The backend's algorithm for a validated collective on a group of two or more ranks (its
  // chunk_bytes resolved: never 0; so too for execute_ring and execute_hierarchical). The
  // default runs the ring algorithms of comm/ring over post_send/post_recv; a backend overrides
  // it with something faster.
  virtual void execute(const CollectiveDesc& desc);

  // The ring algorithms, for a backend's execute() to fall back on.
  void execute_ring(const CollectiveDesc& desc);

  // What the backend knows of where its ranks are (see rank_nodes); set once, at construction.
  void set_rank_nodes(std::vector<int> nodes);
  // The hierarchical algorithms (comm/hierarchical.h) when the group spans two or more nodes of
  // equal size, each node's ranks consecutive, and `desc` asks for no algorithm by name: returns
  // true when it ran `desc`, false when the backend's own algorithm should.
  bool execute_hierarchical(const CollectiveDesc& desc);

  // The size of the ring's messages (its pipeline chunks) for a call whose chunk size is
  // `chunk_bytes`. The hook still runs on pieces of at most `chunk_bytes`. Default: `chunk_bytes`;
  // a transport with a high cost per message (MPI: each one is a handshake, and each blocking
  // hand-off can cost a time slice on a busy machine) returns more.
  virtual size_t ring_message_bytes(size_t chunk_bytes) const;

 private:
  friend class detail::Ring;
  std::unique_ptr<detail::Ring> ring_;  // staging buffers, allocated on first use and kept
  std::vector<int> nodes_;              // empty: one node
  std::unique_ptr<detail::Hierarchical> hierarchical_;  // its groups and staging, made on first use
};

// Where a runner on `comm` allocates its buffers: `alloc`, unless that is the host heap (every
// runner's default), then comm.allocator(), so that collectives on MPI ranks of one node read
// their peers' buffers directly instead of copying them through the ring.
Allocator& buffer_allocator(const Communicator& comm, Allocator& alloc);

// How many consecutive ranks behave as one node (TANDEM_RANKS_PER_NODE; 0, the default: the
// machine decides, MPI_COMM_TYPE_SHARED). Forcing it lets 4 ranks of one machine run as 2 nodes of
// 2, by world rank: world ranks k*i .. k*i + k-1 form node i. Read on first use; a value that is
// not a whole number of ranks, or that does not divide the world, is a UserError.
int ranks_per_node();
// Checks that ranks_per_node() divides a world of `world_size` ranks (UserError otherwise).
void check_ranks_per_node(int world_size);
// Overrides the environment for the process (-1: back to it); only while no group is made.
void set_ranks_per_node(int k);

// The chunk size, in bytes, collective algorithms pipeline at when a call names none
// (CollectiveDesc::chunk_bytes 0): TANDEM_COMM_CHUNK_BYTES, default 256 KiB (a chunk of every
// input fits in L2 while it is reduced). Tests shrink it so that the multi-chunk paths run on
// small inputs. set_chunk_bytes(0) returns to the default. A chunk is never less than one element.
// Process-wide; set it only while no collective runs.
inline constexpr size_t kDefaultChunkBytes = size_t{256} << 10;
inline constexpr int64_t kMaxChunkBytes = int64_t{1} << 40;
size_t chunk_bytes();
void set_chunk_bytes(size_t bytes);

// How long a rank waits for its peers in one call (a collective, barrier or split, or the wait of
// a send or receive) before it gives up with a UserError naming the call, the ranks that did not
// arrive and what the caller was doing (set_comm_activity): TANDEM_COMM_TIMEOUT seconds (decimals
// allowed), default 600 (generous: a slow peer is not a stuck one); 0 waits forever. A group whose
// call timed out is broken: its ranks must stop using it. set_comm_timeout_s(s) overrides the
// environment for the process (negative: back to it); set it only while no call waits.
inline constexpr double kDefaultCommTimeoutS = 600;
// The longest timeout (about 31 years): a deadline past it would overflow the clock.
inline constexpr double kMaxCommTimeoutS = 1e9;
double comm_timeout_s();
void set_comm_timeout_s(double seconds);
// set_comm_timeout_s(s) while it lives when `s` is given (a run's own --comm-timeout), the
// environment's after.
class ScopedCommTimeout {
 public:
  explicit ScopedCommTimeout(const std::optional<double>& s) : set_(s.has_value()) {
    if (set_) set_comm_timeout_s(*s);
  }
  ~ScopedCommTimeout() {
    if (set_) set_comm_timeout_s(-1);
  }
  ScopedCommTimeout(const ScopedCommTimeout&) = delete;
  ScopedCommTimeout& operator=(const ScopedCommTimeout&) = delete;

 private:
  bool set_;
};
// A first SIGTERM or SIGINT (core/stop_signal.h) asks a run to stop after the step in progress.
// A rank whose peer never comes (stuck, stopped, lost, or started with other settings) would
// still wait in its call until the timeout, while a batch scheduler's notice runs out. So, while a
// ScopedStopGrace lives, a wait that the signal finds gives up stop_grace_s() after the later of
// the signal and the wait's own start, with a StopWaitError naming the call and the ranks it
// waited for. A healthy peer arrives within the grace however slow its step: the trainer raises
// it to twice the slowest step it has seen (raise_stop_grace_s), from a floor of
// TANDEM_STOP_GRACE seconds (default 5) while nothing has been measured (set-up, the first step:
// nothing is lost by giving up there). While a ScopedStopGraceOff lives (a checkpoint being
// written: its ranks are alive and writing), waits ignore the signal, as outside any scope.
inline constexpr double kDefaultStopGraceS = 5;
class StopWaitError : public TimeoutError {
 public:
  StopWaitError(int signal, const std::string& what) : TimeoutError(what), signal_(signal) {}
  int signal() const { return signal_; }  // SIGTERM or SIGINT

 private:
  int signal_;
};
// The grace now (seconds); negative: waits ignore the signal.
double stop_grace_s();
// Within a ScopedStopGrace: the grace becomes at least `seconds` (it never shrinks in the scope,
// so that ranks that are threads of one process may each raise it).
void raise_stop_grace_s(double seconds);
class ScopedStopGrace {
 public:
  // The grace at its floor: `floor_s`, else TANDEM_STOP_GRACE's (default kDefaultStopGraceS).
  explicit ScopedStopGrace(std::optional<double> floor_s = std::nullopt);
  ~ScopedStopGrace();
  ScopedStopGrace(const ScopedStopGrace&) = delete;
  ScopedStopGrace& operator=(const ScopedStopGrace&) = delete;
};
class ScopedStopGraceOff {
 public:
  ScopedStopGraceOff();
  ~ScopedStopGraceOff();
  ScopedStopGraceOff(const ScopedStopGraceOff&) = delete;
  ScopedStopGraceOff& operator=(const ScopedStopGraceOff&) = delete;
};

// The timeout a flag or variable asks for, checked: a number of seconds from 0 to
// kMaxCommTimeoutS
// (`what` names the setting in the error, e.g. "--comm-timeout").
double parse_comm_timeout(const std::string& text, const std::string& what);

// What the calling thread is doing, in words that follow "at" in a timeout message ("step 12",
// "the checkpoint after step 12"). Thread-local; empty (the default) says nothing.
void set_comm_activity(std::string what);
const std::string& comm_activity();

}  // namespace tandem::comm
