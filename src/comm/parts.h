// The runs and chunks of a collective's partition (communicator.h, "Partitions"), written once for
// every algorithm: rank k's part is `outer` runs of part_count(rows, p, k) * inner contiguous
// elements of the whole buffer, and an algorithm that pipelines by chunks of at most ce elements
// cuts each run into ceil(run / ce) chunks, so that a chunk is always contiguous in the whole
// buffer and in the packed part. The flat split is outer = inner = 1: one run, the chunks those
// of a contiguous part (the same arithmetic as before partitions, at no extra cost). Internal to
// comm/.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "tandem/comm/communicator.h"
#include "tandem/core/formulas.h"

namespace tandem::comm::detail {

// A contiguous piece of one rank's part: n elements at index `whole` of the whole buffer and at
// index `packed` of the packed part.
struct Piece {
  int64_t whole = 0, packed = 0, n = 0;
};

class Parts {
 public:
  Parts() = default;
  // `d` over a whole buffer of n elements and p ranks (rows < 0: n, the flat split). The
  // caller has validated d (communicator.cc).
  Parts(const PartitionDesc& d, int64_t n, int p)
      : outer_(d.outer), rows_(d.rows < 0 ? n : d.rows), inner_(d.inner), p_(p) {}

  int64_t outer() const { return outer_; }
  int64_t rows() const { return rows_; }
  int64_t inner() const { return inner_; }
  int64_t numel() const { return outer_ * rows_ * inner_; }
  // Whether every part is one contiguous run of the whole buffer.
  bool contiguous() const { return outer_ == 1; }

  // Elements of each run of part k, and of the packed part.
  int64_t run(int k) const { return fx::part_count(rows_, p_, k) * inner_; }
  int64_t count(int k) const { return outer_ * run(k); }
  // Where run o of part k starts in the whole buffer.
  int64_t run_start(int k, int64_t o) const {
    return (o * rows_ + fx::part_offset(rows_, p_, k)) * inner_;
  }

  // Chunk c of part k when runs are cut into chunks of at most ce elements; empty (n = 0) past
  // the part's last chunk. Every rank computes the same chunks for the same (k, c).
  int64_t chunks(int k, int64_t ce) const { return outer_ * per_run(k, ce); }
  Piece chunk(int k, int64_t c, int64_t ce) const {
    const int64_t len = run(k), m = per_run(k, ce);
    if (m == 0 || c >= outer_ * m) return Piece{};
    const int64_t o = c / m, begin = (c - o * m) * ce;
    return Piece{run_start(k, o) + begin, o * len + begin, std::min(ce, len - begin)};
  }

  // f(piece) on each non-empty run of part k, in order.
  template <typename F>
  void each_run(int k, F&& f) const {
    const int64_t len = run(k);
    if (len == 0) return;
    for (int64_t o = 0; o < outer_; ++o) f(Piece{run_start(k, o), o * len, len});
  }

  // Copies part k between a whole-shaped buffer and a packed one (unpack: packed -> whole).
  void pack(int k, const void* whole, void* packed, size_t esize) const {
    each_run(k, [&](const Piece& x) {
      std::memcpy(static_cast<char*>(packed) + x.packed * esize,
                  static_cast<const char*>(whole) + x.whole * esize,
                  static_cast<size_t>(x.n) * esize);
    });
  }
  void unpack(int k, const void* packed, void* whole, size_t esize) const {
    each_run(k, [&](const Piece& x) {
      std::memcpy(static_cast<char*>(whole) + x.whole * esize,
                  static_cast<const char*>(packed) + x.packed * esize,
                  static_cast<size_t>(x.n) * esize);
    });
  }

 private:
  int64_t per_run(int k, int64_t ce) const { return (run(k) + ce - 1) / ce; }

  int64_t outer_ = 1, rows_ = 0, inner_ = 1;
  int p_ = 1;
};

// Elements of `dtype` in a chunk of `chunk_bytes` (a call's resolved CollectiveDesc::chunk_bytes):
// never less than one.
inline int64_t chunk_elements(size_t chunk_bytes, DType dtype) {
  return std::max<int64_t>(1, static_cast<int64_t>(chunk_bytes / dtype_size(dtype)));
}

// The partition of a validated collective on a group of p ranks.
inline Parts parts_of(const CollectiveDesc& d, int p) {
  const int64_t n = d.kind == CollectiveKind::AllGather ? d.recv.numel() : d.send.numel();
  return Parts(d.partition, n, p);
}

// Whether a validated reduce_scatter's output is shaped as the whole (the part goes in its
// place), or a validated all_gather's input is the output itself (the part already in place):
// otherwise that tensor is the packed part. Where the part is the whole (one rank, or a single
// row) either reading gives the same result.
inline bool recv_is_whole(const CollectiveDesc& d) {
  return d.kind == CollectiveKind::ReduceScatter && d.recv.numel() == d.send.numel() &&
         d.recv.numel() > 0;
}
inline bool send_is_whole(const CollectiveDesc& d) {
  return d.kind == CollectiveKind::AllGather && d.send.data() == d.recv.data() &&
         d.send.numel() == d.recv.numel() && d.send.numel() > 0;
}

}  // namespace tandem::comm::detail
