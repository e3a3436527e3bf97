// The ring algorithms as named steps, and the primitives they are made of.
#include "ring.h"

#include <algorithm>
#include <cstring>

#include "reduce.h"
#include "tandem/core/error.h"

namespace tandem::comm::detail {

void Ring::run(const CollectiveDesc& d) {
  p_ = comm_.size();
  r_ = comm_.rank();
  TANDEM_CHECK(p_ >= 2, "ring collective on a group of {} ranks", p_);
  left_ = (r_ + p_ - 1) % p_;
  right_ = (r_ + 1) % p_;
  dtype_ = d.send.dtype();
  op_ = d.op;
  hook_ = d.hook ? &d.hook : nullptr;
  esize_ = dtype_size(dtype_);
  ce_ = chunk_elements(comm_.ring_message_bytes(d.chunk_bytes), dtype_);
  hook_ce_ = chunk_elements(d.chunk_bytes, dtype_);
  parts_ = parts_of(d, p_);
  reserve(static_cast<size_t>(ce_) * esize_);
  try {
    switch (d.kind) {
      case CollectiveKind::AllReduce:
        all_reduce(d);
        break;
      case CollectiveKind::ReduceScatter:
        reduce_scatter(d);
        break;
      case CollectiveKind::AllGather:
        all_gather(d);
        break;
      case CollectiveKind::Broadcast:
        broadcast(d);
        break;
      case CollectiveKind::Shift:
        shift(d);
        break;
    }
  } catch (...) {
    // Dropping the requests cancels what the backend can cancel; the staging slots are free again.
    for (auto& f : in_flight_) f = InFlight{};
    std::fill(std::begin(stage_busy_), std::end(stage_busy_), false);
    head_ = count_ = 0;
    throw;
  }
}

// ---- The algorithms --------------------------------------------------------------------------

// all_reduce, in place: a reduce-scatter that leaves part r complete on rank r (and hooks it),
// then an all-gather of the complete parts, chunk by chunk.
void Ring::all_reduce(const CollectiveDesc& d) {
  char* buf = static_cast<char*>(d.send.data());
  const int p = p_, r = r_;
  for (int64_t c = 0, nc = chunks_per_part(); c < nc; ++c) {
    // Reduce-scatter, step 0: part r-1 leaves for the right neighbour, which adds its own.
    send(part(buf, r - 1, c));
    // Steps 1 .. p-2: the part arriving from the left gains this rank's contribution, moves on.
    for (int s = 1; s <= p - 2; ++s) recv_reduce_send_in_place(part(buf, r - 1 - s, c));
    // Step p-1: part r arrives with every other rank's contribution. Add ours, run the hook on the
    // finished chunk while it is in cache, and send it: the first step of the all-gather.
    recv_reduce_compute_send(part(buf, r, c));
    // The parts sent from in steps 0 .. p-2 are overwritten below: those sends must be done.
    drain_sends(1);
    // All-gather: finished parts travel the ring; each rank keeps a copy and passes it on ...
    for (int s = 1; s <= p - 2; ++s) recv_copy_send(part(buf, r - s, c));
    // ... until the last one, part r+1, which the right neighbour already has.
    recv(part(buf, r + 1, c));
  }
  drain_sends(0);
}

// reduce_scatter: as all_reduce's first half, but partial sums travel through staging buffers
// (the input is left untouched) and the finished chunk lands in the output.
void Ring::reduce_scatter(const CollectiveDesc& d) {
  const char* in = static_cast<const char*>(d.send.data());
  char* out = static_cast<char*>(d.recv.data());
  const bool whole = recv_is_whole(d);  // the output is shaped as the input: the part in place
  const int p = p_, r = r_;
  for (int64_t c = 0, nc = chunks_per_part(); c < nc; ++c) {
    // Step 0: this rank's contribution to part r-1 starts the ring.
    send(part(in, r - 1, c));
    // Steps 1 .. p-2: add this rank's contribution to the partial sum passing through.
    for (int s = 1; s <= p - 2; ++s) recv_reduce_send(part(in, r - 1 - s, c));
    // Step p-1: part r is complete once ours is added: into the output, then the hook.
    recv_reduce_compute(part(in, r, c), whole ? part(out, r, c) : packed(out, c));
  }
  drain_sends(0);
}

// all_gather: each rank's part travels the ring; every rank keeps a copy and passes it on.
void Ring::all_gather(const CollectiveDesc& d) {
  char* out = static_cast<char*>(d.recv.data());
  const int p = p_, r = r_;
  // This rank's own part goes to its place in the output first (unless it is already there).
  if (!send_is_whole(d) && d.send.data() != part(out, r, 0).data)
    parts_.unpack(r, d.send.data(), out, esize_);
  for (int64_t c = 0, nc = chunks_per_part(); c < nc; ++c) {
    // Step 0: send our part to the right.
    send(part(out, r, c));
    // Steps 1 .. p-2: keep the part arriving from the left and pass it on.
    for (int s = 1; s <= p - 2; ++s) recv_copy_send(part(out, r - s, c));
    // Step p-1: the last part, r+1, stops here.
    recv(part(out, r + 1, c));
  }
  drain_sends(0);
}

// broadcast: a pipelined chain from the root round the ring; the rank before the root ends it.
void Ring::broadcast(const CollectiveDesc& d) {
  const int64_t n = d.send.numel();
  char* buf = static_cast<char*>(d.send.data());
  const int position = (r_ - d.root + p_) % p_;  // distance from the root along the ring
  for (int64_t begin = 0; begin < n; begin += ce_) {
    const Span chunk{buf + begin * static_cast<int64_t>(esize_), std::min(ce_, n - begin), begin};
    if (position == 0) {
      send(chunk);
    } else if (position < p_ - 1) {
      recv_copy_send(chunk);
    } else {
      recv(chunk);
    }
  }
  drain_sends(0);
}

// shift: one step of the ring. Each chunk of the input leaves for the right while the same chunk
// arrives from the left; sends stay in flight while later chunks are received, so no rank waits
// for a peer that waits for it (a blocked send needs the right neighbour further behind, and that
// cannot hold all round the ring).
void Ring::shift(const CollectiveDesc& d) {
  const int64_t n = d.send.numel();
  char* in = static_cast<char*>(d.send.data());
  char* out = static_cast<char*>(d.recv.data());
  const int64_t es = static_cast<int64_t>(esize_);
  for (int64_t begin = 0; begin < n; begin += ce_) {
    const int64_t m = std::min(ce_, n - begin);
    send(Span{in + begin * es, m, begin});
    recv(Span{out + begin * es, m, begin});
  }
  drain_sends(0);
}

// ---- The primitives --------------------------------------------------------------------------

void Ring::send(Span src) {
  if (src.n == 0) return;
  post_to_right(src.data, src.n, -1);
}

void Ring::recv(Span dst) {
  if (dst.n == 0) return;
  receive_from_left(dst.data, dst.n);
}

void Ring::recv_reduce_send(Span local) {
  if (local.n == 0) return;
  receive_from_left(recv_stage_.data(), local.n);
  const int slot = acquire_staging();
  void* sum = send_stage_[slot].data();
  reduce2(dtype_, op_, sum, recv_stage_.data(), local.data, local.n);
  post_to_right(sum, local.n, slot);
}

void Ring::recv_reduce_send_in_place(Span buf) {
  if (buf.n == 0) return;
  receive_from_left(recv_stage_.data(), buf.n);
  reduce2(dtype_, op_, buf.data, recv_stage_.data(), buf.data, buf.n);
  post_to_right(buf.data, buf.n, -1);
}

void Ring::recv_reduce_compute(Span local, Span dst) {
  if (local.n == 0) return;
  receive_from_left(recv_stage_.data(), local.n);
  reduce_and_hook(dst, recv_stage_.data(), local.data);
}

void Ring::recv_reduce_compute_send(Span buf) {
  if (buf.n == 0) return;
  receive_from_left(recv_stage_.data(), buf.n);
  reduce_and_hook(buf, recv_stage_.data(), buf.data);
  post_to_right(buf.data, buf.n, -1);
}

void Ring::recv_copy_send(Span dst) {
  if (dst.n == 0) return;
  receive_from_left(dst.data, dst.n);
  post_to_right(dst.data, dst.n, -1);
}

// ---- Plumbing --------------------------------------------------------------------------------

Ring::Span Ring::part(const void* base, int k, int64_t c) const {
  k = ((k % p_) + p_) % p_;
  const Piece x = parts_.chunk(k, c, ce_);
  char* data =
      const_cast<char*>(static_cast<const char*>(base)) + x.whole * static_cast<int64_t>(esize_);
  return Span{data, x.n, x.whole};
}

Ring::Span Ring::packed(const void* base, int64_t c) const {
  const Piece x = parts_.chunk(r_, c, ce_);
  char* data =
      const_cast<char*>(static_cast<const char*>(base)) + x.packed * static_cast<int64_t>(esize_);
  return Span{data, x.n, x.whole};
}

int64_t Ring::chunks_per_part() const { return parts_.chunks(0, ce_); }  // part 0 is the largest

void Ring::receive_from_left(void* dst, int64_t n) {
  comm_.post_recv(view(dst, n), left_, kTag).wait();
}

void Ring::post_to_right(const void* src, int64_t n, int staging) {
  if (count_ == kMaxInFlight) drain_sends(kMaxInFlight - 1);
  Request req = comm_.post_send(view(src, n), right_, kTag);
  in_flight_[(head_ + count_) % (kMaxInFlight + 1)] = InFlight{std::move(req), staging};
  ++count_;
}

int Ring::acquire_staging() {
  if (send_staged_bytes_ < staged_bytes_) {
    for (auto& st : send_stage_) st = Tensor::empty(DType::F32, recv_stage_.shape());
    send_staged_bytes_ = staged_bytes_;
  }
  const int slot = next_stage_;
  next_stage_ = (next_stage_ + 1) % kMaxInFlight;
  while (stage_busy_[slot]) {
    TANDEM_CHECK(count_ > 0, "staging slot {} busy with no send in flight", slot);
    drain_sends(count_ - 1);
  }
  stage_busy_[slot] = true;
  return slot;
}

void Ring::drain_sends(int keep) {
  while (count_ > keep) {
    InFlight& oldest = in_flight_[head_];
    oldest.req.wait();
    if (oldest.staging >= 0) stage_busy_[oldest.staging] = false;
    oldest = InFlight{};
    head_ = (head_ + 1) % (kMaxInFlight + 1);
    --count_;
  }
}

void Ring::reduce_and_hook(Span dst, const void* a, const void* b) {
  if (hook_ == nullptr) {
    reduce2(dtype_, op_, dst.data, a, b, dst.n);
    return;
  }
  const int64_t esize = static_cast<int64_t>(esize_);
  for (int64_t k = 0; k < dst.n; k += hook_ce_) {
    const int64_t m = std::min(hook_ce_, dst.n - k);
    reduce2(dtype_, op_, dst.data + k * esize, static_cast<const char*>(a) + k * esize,
            static_cast<const char*>(b) + k * esize, m);
    (*hook_)(view(dst.data + k * esize, m), dst.offset + k);
  }
}

Tensor Ring::view(const void* p, int64_t n) const {
  return Tensor::view_of(const_cast<void*>(p), dtype_, Shape{n});
}

void Ring::reserve(size_t bytes) {
  if (bytes <= staged_bytes_) return;
  // Staging is raw bytes; f32 elements of 64-byte aligned storage hold any dtype's chunk.
  // Send staging follows in acquire_staging(), only for the collective that needs it.
  TANDEM_CHECK(count_ == 0, "staging resized with {} sends in flight", count_);
  const int64_t words = static_cast<int64_t>((bytes + 3) / 4);
  recv_stage_ = Tensor::empty(DType::F32, Shape{words});
  staged_bytes_ = bytes;
}

}  // namespace tandem::comm::detail
