// Communicator: a group of ranks that exchange tensors. Backends only move bytes (isend/irecv,
// and optionally a faster algorithm for a collective); the collective algorithms are written
// once, against this interface (Gloo's split of algorithm from transport).
//
// Every collective goes through one entry point, `run(CollectiveDesc)`, which validates the call
// (the same way for every backend) and dispatches to the backend's algorithm.
//
// Remainders: a buffer of n elements over p ranks is partitioned so that rank r owns
// Partition::count(n, p, r) elements starting at Partition::offset(n, p, r); the first n % p
// ranks own one element more than the rest. reduce_scatter leaves rank r its part; all_gather
// expects rank r to contribute its part.
//
// The fused-collective mechanism: reduce_scatter and all_reduce take a ChunkHook that runs on
// each chunk of this rank's part once that chunk is fully reduced, before it is gathered. This is
// how a fused optimizer step or a fused epilogue (bias, dropout, residual) runs inside the
// collective, chunk by chunk, while the chunk is still in cache.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "tandem/core/tensor.h"

namespace tandem::comm {

enum class ReduceOp : uint8_t { Sum, Prod, Max, Min };
std::string_view reduce_op_name(ReduceOp op);

struct Partition {
  static int64_t count(int64_t n, int p, int r) { return n / p + (r < n % p ? 1 : 0); }
  static int64_t offset(int64_t n, int p, int r) { return r * (n / p) + (r < n % p ? r : n % p); }
};

// Runs on a fully reduced chunk: `chunk` views elements [offset, offset + chunk.numel()) of the
// whole (unpartitioned) buffer, so the hook can index companion tensors (weights, moments) by
// the same offsets. It may modify `chunk` in place; what it leaves there is what is gathered.
using ChunkHook = std::function<void(const Tensor& chunk, int64_t offset)>;

// Completion handle of an asynchronous send or receive.
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

enum class CollectiveKind : uint8_t { AllReduce, ReduceScatter, AllGather, Broadcast };
std::string_view collective_name(CollectiveKind kind);

// The descriptor every collective call is turned into before it is validated and dispatched.
struct CollectiveDesc {
  CollectiveKind kind;
  ReduceOp op = ReduceOp::Sum;
  Tensor send;     // AllReduce, Broadcast: the buffer (in place). ReduceScatter: the whole input.
                   // AllGather: this rank's part.
  Tensor recv;     // ReduceScatter: this rank's part. AllGather: the whole output.
  int root = 0;    // Broadcast
  ChunkHook hook;  // AllReduce, ReduceScatter
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view backend() const = 0;  // "thread" or "mpi"

  // Point to point. The tensor must stay alive and untouched until the request completes.
  virtual Request isend(const Tensor& t, int peer, int tag) = 0;
  virtual Request irecv(const Tensor& t, int peer, int tag) = 0;
  void send(const Tensor& t, int peer, int tag) { isend(t, peer, tag).wait(); }
  void recv(const Tensor& t, int peer, int tag) { irecv(t, peer, tag).wait(); }

  virtual void barrier() = 0;

  // Collectives: every rank of the group calls the same one with matching sizes and dtypes.
  void all_reduce(const Tensor& buf, ReduceOp op, const ChunkHook& hook = {});
  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op,
                      const ChunkHook& hook = {});
  void all_gather(const Tensor& in, const Tensor& out);
  void broadcast(const Tensor& buf, int root);

  // The one entry point: validates `desc` and runs the backend's algorithm for it.
  void run(const CollectiveDesc& desc);

  // Ranks with the same color form a new group, ordered by (key, old rank). Collective over
  // this group.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

 protected:
  // The backend's algorithm for a validated collective. The default runs the ring algorithms
  // of comm/ring over isend/irecv; a backend overrides it with something faster.
  virtual void execute(const CollectiveDesc& desc);
};

// The chunk size, in bytes, collective algorithms pipeline at (TANDEM_COMM_CHUNK_BYTES).
// Tests shrink it so that the multi-chunk paths run on small inputs.
size_t chunk_bytes();
void set_chunk_bytes(size_t bytes);

}  // namespace tandem::comm
