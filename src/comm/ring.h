// The ring algorithms (NCCL, Gloo): every collective written once, as a list of named steps over
// a small vocabulary of primitives whose names say what they fuse, on top of a Communicator's
// post_send/post_recv. Internal to comm/; reached through Communicator::execute_ring.
//
// Rank r sends to r + 1 and receives from r - 1. Parts follow the call's partition (parts.h): a
// chunk is a piece of one run of a part, so a part of many short runs (a partition with a large
// `outer` and few rows per rank) travels in as many short messages. Work is pipelined by chunks,
// one message each
// (Communicator::ring_message_bytes(): the call's chunk size unless the transport wants larger
// ones): for each chunk index c, chunk c of every part goes round the ring before chunk c + 1
// starts, and sends stay in flight (up to kMaxInFlight of them) while the next chunk is received.
// The hook runs on pieces of at most the call's chunk size (CollectiveDesc::chunk_bytes), each
// right after that piece is reduced, while it is in cache.
//
// Deadlock freedom with rendezvous sends (a send completes only once its receive is posted):
// a rank blocks on sends only while at least two of its sends are unreceived, and no rank ever
// has sent more than one message more than it has received. Summed round the ring, "everyone
// blocked on a send" would need 2p unreceived messages against at most p: impossible.
#pragma once

#include <cstddef>
#include <cstdint>

#include "parts.h"
#include "tandem/comm/communicator.h"

namespace tandem::comm::detail {

class Ring {
 public:
  explicit Ring(Communicator& comm) : comm_(comm) {}
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  // Runs a validated collective on a group of two or more ranks.
  void run(const CollectiveDesc& desc);

  static constexpr int kTag = kMaxUserTag + 1;  // every ring message; FIFO per pair keeps order
  static constexpr int kMaxInFlight = 4;        // unfinished sends (and send staging buffers)

 private:
  // A chunk of one part: `n` elements at `data`, element `offset` of the whole buffer.
  struct Span {
    char* data;
    int64_t n;
    int64_t offset;
  };

  void all_reduce(const CollectiveDesc& d);
  void reduce_scatter(const CollectiveDesc& d);
  void all_gather(const CollectiveDesc& d);
  void broadcast(const CollectiveDesc& d);
  void shift(const CollectiveDesc& d);

  // Chunk c of part k (taken modulo p) of the whole buffer starting at base (parts.h: a chunk is
  // a piece of one run of the part).
  Span part(const void* base, int k, int64_t c) const;
  // The same chunk of this rank's part in a packed buffer at base (its offset still the whole's).
  Span packed(const void* base, int64_t c) const;
  int64_t chunks_per_part() const;

  // The primitives. Each skips an empty span; every rank skips the same ones.
  void send(Span src);                             // src -> right
  void recv(Span dst);                             // left -> dst
  void recv_reduce_send(Span local);               // left op local -> staging -> right
  void recv_reduce_send_in_place(Span buf);        // buf = left op buf; buf -> right
  void recv_reduce_compute(Span local, Span dst);  // dst = left op local; hook(dst)
  void recv_reduce_compute_send(Span buf);         // buf = left op buf; hook(buf); buf -> right
  void recv_copy_send(Span dst);                   // left -> dst -> right

  // Receives one chunk from the left into `dst` (blocking).
  void receive_from_left(void* dst, int64_t n);
  // Sends `n` elements at `src` to the right; `staging` is the send slot it occupies, or -1.
  void post_to_right(const void* src, int64_t n, int staging);
  // A free send staging buffer (waiting for the oldest sends to complete if none is).
  int acquire_staging();
  // Waits until at most `keep` sends are unfinished.
  void drain_sends(int keep);
  // dst = a op b, then the hook on dst, piece by piece (no hook: one reduction).
  void reduce_and_hook(Span dst, const void* a, const void* b);
  Tensor view(const void* p, int64_t n) const;
  void reserve(size_t chunk_bytes);

  Communicator& comm_;

  // The call being run.
  DType dtype_ = DType::F32;
  ReduceOp op_ = ReduceOp::Sum;
  const ChunkHook* hook_ = nullptr;
  int p_ = 1, r_ = 0, left_ = 0, right_ = 0;
  size_t esize_ = 4;
  Parts parts_;          // the call's partition of the whole buffer
  int64_t ce_ = 1;       // elements per chunk (one message)
  int64_t hook_ce_ = 1;  // elements per hook call at most

  // Staging: one receive buffer and (reduce_scatter only) kMaxInFlight send buffers of one
  // chunk each, allocated on first use and kept; unfinished sends in a FIFO.
  size_t staged_bytes_ = 0;
  size_t send_staged_bytes_ = 0;
  Tensor recv_stage_;
  Tensor send_stage_[kMaxInFlight];
  bool stage_busy_[kMaxInFlight] = {};
  int next_stage_ = 0;
  struct InFlight {
    Request req;
    int staging;
  };
  InFlight in_flight_[kMaxInFlight + 1];
  int head_ = 0, count_ = 0;
};

}  // namespace tandem::comm::detail
