// The Direct algorithms and their group-call protocol over PeerMemory (see direct.h).
#include "direct.h"

#include <algorithm>

#include "checks.h"
#include "reduce.h"
#include "tandem/core/error.h"

namespace tandem::comm::detail {
namespace {

// Copies larger than this go round the cache (streaming stores) in the all-gather step: at this
// size the destination is not read again before it is evicted anyway.
constexpr size_t kStreamingBytes = size_t{8} << 20;

Parts parts_of(const PostedCall& d, int p) {
  return Parts(PartitionDesc{d.outer, d.rows, d.inner}, d.n, p);
}

}  // namespace

std::string_view call_name(Call c) {
  switch (c) {
    case Call::Barrier:
      return "barrier";
    case Call::Split:
      return "split";
    default:
      return collective_name(static_cast<CollectiveKind>(c));
  }
}

std::string Direct::at(Call c) const {
  return fmt::format("{} on rank {} of {}", call_name(c), mem_.rank(), mem_.size());
}

void Direct::ring_peers() const {
  for (int q = 0; q < mem_.size(); ++q)
    if (q != mem_.rank()) mem_.bell(q).ring();
}

void Direct::wait_for(Call call, int q, const std::function<bool()>& ready) {
  mem_.bell(mem_.rank()).wait(mem_.spin(), ready, [&] {
    mem_.check(at(call), q, ready);
    if (deadline_.passed() && !ready()) timed_out(at(call), deadline_, late_ranks(q));
  });
}

std::string Direct::late_ranks(int q) const {
  std::vector<int> late;
  for (int r = 0; r < mem_.size(); ++r)
    if (r != mem_.rank() && mem_.slot(r).posted.v.load(std::memory_order_seq_cst) < seq_)
      late.push_back(r);
  const bool arrived = late.empty();
  if (arrived && q >= 0) late.push_back(q);
  return mem_.ranks_named(late) +
         (arrived ? " arrived but has not finished its part" : " did not arrive");
}

void Direct::publish(uint64_t seq, uint64_t chunks) {
  mem_.slot(mem_.rank())
      .progress.v.store(((seq & 0xffffffffu) << 32) | chunks, std::memory_order_seq_cst);
  ring_peers();
}

int64_t Direct::published(int q, uint64_t seq) const {
  const uint64_t v = mem_.slot(q).progress.v.load(std::memory_order_seq_cst);
  return (v >> 32) == (seq & 0xffffffffu) ? static_cast<int64_t>(v & 0xffffffffu) : 0;
}

void Direct::group_call(const PostedCall& c, bool shares_buffers,
                        const std::function<void(uint64_t)>& body) {
  const int me = mem_.rank(), p = mem_.size();
  mem_.check(at(c.call), -1, [] { return false; });
  const uint64_t seq = ++seq_;
  deadline_ = Deadline();
  Slot& mine = mem_.slot(me);
  mine.call[seq & 1] = c;
  mine.posted.v.store(seq, std::memory_order_seq_cst);
  ring_peers();
  try {
    for (int q = 0; q < p; ++q)
      if (q != me)
        wait_for(c.call, q,
                 [&] { return mem_.slot(q).posted.v.load(std::memory_order_seq_cst) >= seq; });
    // A rank that failed after we posted may be unwinding: with seq_cst on both sides, either it
    // sees our post (and waits for us in failed()) or we see its failure here.
    mem_.check(at(c.call), -1, [] { return false; });
    check_matching(seq, c.call);
    body(seq);
    mine.finished.v.store(seq, std::memory_order_seq_cst);
    ring_peers();
    if (shares_buffers)
      for (int q = 0; q < p; ++q)
        if (q != me)
          wait_for(c.call, q,
                   [&] { return mem_.slot(q).finished.v.load(std::memory_order_seq_cst) >= seq; });
  } catch (...) {
    // This group is now inconsistent: the backend tells the others, so that nobody waits for us
    // forever, and keeps us here until no peer can be touching our buffers.
    mem_.failed(std::current_exception());
    mine.finished.v.store(seq, std::memory_order_seq_cst);
    ring_peers();
    mem_.wait_quiet(seq);
    throw;
  }
}

void Direct::check_matching(uint64_t seq, Call call) const {
  auto signature = [&](int q) {
    const PostedCall& x = posted(q, seq);
    CallSignature s;
    s.name = call_name(x.call);
    s.collective = x.call != Call::Barrier && x.call != Call::Split;
    s.dtype = x.dtype;
    s.n = x.n;
    s.partition = PartitionDesc{x.outer, x.rows, x.inner};
    s.chunk_bytes = x.chunk_bytes;
    s.op = x.op;
    s.root = x.root;
    s.algo = x.algo;
    s.reducing = x.call == Call::AllReduce || x.call == Call::ReduceScatter;
    s.rooted = x.call == Call::Broadcast;
    return s;
  };
  const CallSignature first = signature(0);
  const std::string where = at(call);
  for (int q = 1; q < mem_.size(); ++q) check_same_call(where, first, q, signature(q));
}

bool Direct::all_shared(uint64_t seq) const {
  for (int q = 0; q < mem_.size(); ++q) {
    const PostedCall& x = posted(q, seq);
    if (x.send == kNotShared || x.recv == kNotShared) return false;
  }
  return true;
}

void Direct::run(const CollectiveDesc& cd, const std::function<void()>& ring) {
  PostedCall c;
  c.call = static_cast<Call>(cd.kind);
  c.op = cd.op;
  c.dtype = cd.send.dtype();
  c.algo = cd.algo;
  c.n = cd.kind == CollectiveKind::AllGather ? cd.recv.numel() : cd.send.numel();
  const Parts parts = detail::parts_of(cd, mem_.size());
  c.outer = parts.outer();
  c.rows = parts.rows();
  c.inner = parts.inner();
  c.chunk_bytes = cd.chunk_bytes;
  c.send_whole = send_is_whole(cd);
  c.root = cd.root;
  c.send = mem_.address_of(cd.send.data(), cd.send.nbytes());
  c.recv = cd.recv.defined() ? mem_.address_of(cd.recv.data(), cd.recv.nbytes()) : 0;
  const ChunkHook* hook = cd.hook ? &cd.hook : nullptr;

  if (cd.algo == CollectiveAlgo::Ring) {
    // The ring moves everything through post_send/post_recv, which own their synchronisation.
    group_call(c, /*shares_buffers=*/false, [&](uint64_t) { ring(); });
    return;
  }
  group_call(c, /*shares_buffers=*/true, [&](uint64_t seq) {
    if (!all_shared(seq)) {
      if (cd.algo == CollectiveAlgo::Direct)
        user_error(
            "{}: the direct algorithm reads the peers' buffers, but some rank's buffer is "
            "not in memory they can read; allocate collective buffers from the "
            "communicator's allocator()",
            at(c.call));
      ring();
      return;
    }
    const PostedCall& d = posted(mem_.rank(), seq);
    switch (cd.kind) {
      case CollectiveKind::AllReduce:
        all_reduce(d, seq, hook);
        break;
      case CollectiveKind::ReduceScatter:
        reduce(d, seq, static_cast<char*>(cd.recv.data()), !recv_is_whole(cd), hook, false);
        break;
      case CollectiveKind::AllGather:
        all_gather(d, seq);
        break;
      case CollectiveKind::Broadcast:
        broadcast(d, seq);
        break;
      case CollectiveKind::Shift:
        shift(d, seq);
        break;
    }
  });
}

// Reduces this rank's part, chunk by chunk, from every rank's input into `dst` (the packed part,
// or a buffer shaped as the whole), runs the hook on each finished chunk, and, with `publish`,
// tells the peers that the chunk is ready for them to copy (all_reduce's gather).
void Direct::reduce(const PostedCall& d, uint64_t seq, char* dst, bool dst_packed,
                    const ChunkHook* hook, bool publish) {
  const int p = mem_.size(), me = mem_.rank();
  const size_t esize = dtype_size(d.dtype);
  const int64_t ce = chunk_elements(d.chunk_bytes, d.dtype);
  const Parts parts = parts_of(d, p);
  if (publish) gathered_.assign(p, 0);
  for (int64_t c = 0, nc = parts.chunks(me, ce); c < nc; ++c) {
    const Piece x = parts.chunk(me, c, ce);
    for (int q = 0; q < p; ++q) srcs_[q] = mem_.resolve(q, posted(q, seq).send) + x.whole * esize;
    char* out = dst + (dst_packed ? x.packed : x.whole) * esize;
    // Every rank's chunk, combined in rank order, written once.
    reduce_into(d.dtype, d.op, out, srcs_.data(), p, x.n);
    // The fused step, while the chunk is in cache.
    if (hook != nullptr) (*hook)(Tensor::view_of(out, d.dtype, Shape{x.n}), x.whole);
    if (publish) {
      this->publish(seq, static_cast<uint64_t>(c + 1));
      // Copy what the peers have published meanwhile, likely still in the shared cache.
      gather_published(d, seq, /*block=*/false);
    }
  }
}

// Copies the chunks of the peers' parts that they have published and this rank has not copied
// yet into this rank's buffer; with `block`, waits for and copies all of them. Chunks contiguous
// in the buffer (those of one run) are copied together.
void Direct::gather_published(const PostedCall& d, uint64_t seq, bool block) {
  const int p = mem_.size(), me = mem_.rank();
  const size_t esize = dtype_size(d.dtype);
  const int64_t ce = chunk_elements(d.chunk_bytes, d.dtype);
  const bool streaming = static_cast<size_t>(d.n) * esize >= kStreamingBytes;
  const Parts parts = parts_of(d, p);
  char* mine = mem_.resolve(me, d.send);
  for (int i = 1; i < p; ++i) {
    const int q = (me + i) % p;  // start with different peers on different ranks
    const int64_t chunks = parts.chunks(q, ce);
    const char* theirs = mem_.resolve(q, posted(q, seq).send);
    while (gathered_[q] < chunks) {
      int64_t ready = published(q, seq);
      if (ready <= gathered_[q]) {
        if (!block) break;
        wait_for(d.call, q, [&] { return published(q, seq) > gathered_[q]; });
        ready = published(q, seq);
      }
      Piece run = parts.chunk(q, gathered_[q], ce);
      for (int64_t c = gathered_[q] + 1; c <= ready; ++c) {
        const Piece x = c < ready ? parts.chunk(q, c, ce) : Piece{};
        if (c < ready && x.whole == run.whole + run.n) {
          run.n += x.n;
          continue;
        }
        copy_bytes(mine + run.whole * esize, theirs + run.whole * esize, run.n * esize, streaming);
        run = x;
      }
      gathered_[q] = ready;
    }
  }
}

void Direct::all_reduce(const PostedCall& d, uint64_t seq, const ChunkHook* hook) {
  char* buf = mem_.resolve(mem_.rank(), d.send);
  // Reduce-scatter, fused with the hook and with opportunistic gathering of peers' chunks.
  reduce(d, seq, buf, /*dst_packed=*/false, hook, /*publish=*/true);
  // All-gather whatever of the peers' parts is still missing.
  gather_published(d, seq, /*block=*/true);
}

void Direct::all_gather(const PostedCall& d, uint64_t seq) {
  const int p = mem_.size(), me = mem_.rank();
  const size_t esize = dtype_size(d.dtype);
  const bool streaming = static_cast<size_t>(d.n) * esize >= kStreamingBytes;
  const Parts parts = parts_of(d, p);
  char* recv = mem_.resolve(me, d.recv);
  for (int i = 0; i < p; ++i) {
    const int q = (me + i) % p;
    const PostedCall& theirs_call = posted(q, seq);
    const char* theirs = mem_.resolve(q, theirs_call.send);
    parts.each_run(q, [&](const Piece& x) {
      const char* src = theirs + (theirs_call.send_whole ? x.whole : x.packed) * esize;
      char* dst = recv + x.whole * esize;
      if (src != dst) copy_bytes(dst, src, x.n * esize, streaming);
    });
  }
}

void Direct::broadcast(const PostedCall& d, uint64_t seq) {
  const int me = mem_.rank();
  if (me == d.root) return;
  const size_t esize = dtype_size(d.dtype);
  const bool streaming = static_cast<size_t>(d.n) * esize >= kStreamingBytes;
  copy_bytes(mem_.resolve(me, d.send), mem_.resolve(d.root, posted(d.root, seq).send), d.n * esize,
             streaming);
}

// Each rank copies its left neighbour's input into its own output, where it lies.
void Direct::shift(const PostedCall& d, uint64_t seq) {
  const int p = mem_.size(), left = (mem_.rank() + p - 1) % p;
  const size_t esize = dtype_size(d.dtype);
  const bool streaming = static_cast<size_t>(d.n) * esize >= kStreamingBytes;
  copy_bytes(mem_.resolve(mem_.rank(), d.recv), mem_.resolve(left, posted(left, seq).send),
             d.n * esize, streaming);
}

}  // namespace tandem::comm::detail
