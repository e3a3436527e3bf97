// The one entry point every collective and point-to-point call goes through: argument checks with
// messages that name the call, the rank and what was expected; the one-rank case; dispatch to the
// backend's algorithm; and the settings shared by every backend.
#include "tandem/comm/communicator.h"

#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <utility>

#include "hierarchical.h"
#include "parts.h"
#include "ring.h"
#include "tandem/core/env.h"
#include "tandem/core/error.h"

namespace tandem::comm {

void wait_all(std::vector<Request>& requests) {
  std::exception_ptr first;
  for (Request& r : requests) {
    try {
      r.wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  requests.clear();  // keeps its capacity: a runner's next run allocates nothing for its sends
  if (first) std::rethrow_exception(first);
}

std::string_view collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::AllReduce:
      return "all_reduce";
    case CollectiveKind::ReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::AllGather:
      return "all_gather";
    case CollectiveKind::Broadcast:
      return "broadcast";
    case CollectiveKind::Shift:
      return "shift";
  }
  return "?";
}

std::string_view collective_algo_name(CollectiveAlgo algo) {
  switch (algo) {
    case CollectiveAlgo::Auto:
      return "auto";
    case CollectiveAlgo::Ring:
      return "ring";
    case CollectiveAlgo::Direct:
      return "direct";
  }
  return "?";
}

// ---- Settings --------------------------------------------------------------------------------

namespace {

std::atomic<size_t> g_chunk_override{0};

size_t env_chunk_bytes() {
  static const size_t bytes = [] {
    const int64_t v = env_int("TANDEM_COMM_CHUNK_BYTES", static_cast<int64_t>(kDefaultChunkBytes));
    if (v < 1 || v > kMaxChunkBytes)
      user_error(
          "TANDEM_COMM_CHUNK_BYTES={} is not a chunk size: expected a positive number of "
          "bytes, at most {} (default {})",
          v, kMaxChunkBytes, kDefaultChunkBytes);
    return static_cast<size_t>(v);
  }();
  return bytes;
}

// TANDEM_COMM_DEBUG=1 prints every collective as it is dispatched.
bool debug_enabled() {
  static const bool on = env_int("TANDEM_COMM_DEBUG", 0) != 0;
  return on;
}

}  // namespace

size_t chunk_bytes() {
  const size_t o = g_chunk_override.load(std::memory_order_relaxed);
  return o != 0 ? o : env_chunk_bytes();
}

void set_chunk_bytes(size_t bytes) { g_chunk_override.store(bytes, std::memory_order_relaxed); }

namespace {
std::atomic<int> g_ranks_per_node_override{-1};
}  // namespace

int ranks_per_node() {
  const int o = g_ranks_per_node_override.load(std::memory_order_relaxed);
  if (o >= 0) return o;
  static const int from_env = [] {
    const std::string v = env_str("TANDEM_RANKS_PER_NODE", "");
    if (v.empty()) return 0;
    char* end = nullptr;
    const long k = std::strtol(v.c_str(), &end, 10);
    if (end == v.c_str() || *end != '\0' || k < 1 || k > (1 << 20))
      user_error(
          "TANDEM_RANKS_PER_NODE={} is not a number of ranks: expected a whole number of "
          "1 or more (how many consecutive ranks behave as one node), or unset to let the "
          "machine decide",
          v);
    return static_cast<int>(k);
  }();
  return from_env;
}

void check_ranks_per_node(int world_size) {
  const int k = ranks_per_node();
  if (k > 0 && world_size % k != 0)
    user_error(
        "TANDEM_RANKS_PER_NODE={} does not divide the {} ranks into whole nodes; use a "
        "divisor of {}",
        k, world_size, world_size);
}

void set_ranks_per_node(int k) { g_ranks_per_node_override.store(k, std::memory_order_relaxed); }

// ---- Validation ------------------------------------------------------------------------------

namespace {

bool overlaps(const Tensor& a, const Tensor& b) {
  const auto* a0 = static_cast<const char*>(a.data());
  const auto* b0 = static_cast<const char*>(b.data());
  return a.nbytes() > 0 && b.nbytes() > 0 && a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

// "rows [2, 4) of each of the 3 outer blocks" / "elements [2, 4)": rank r's part, in words.
std::string part_words(const detail::Parts& parts, int p, int r) {
  const int64_t off = fx::part_offset(parts.rows(), p, r), cnt = fx::part_count(parts.rows(), p, r);
  if (parts.outer() == 1 && parts.inner() == 1)
    return fmt::format("elements [{}, {})", off, off + cnt);
  return fmt::format("rows [{}, {}) of the [{}, {}, {}] partition", off, off + cnt, parts.outer(),
                     parts.rows(), parts.inner());
}

// The partition against the whole buffer, and the part-sized tensor (the reduce_scatter's output,
// the all_gather's input) against this rank's part.
void validate_partition(const CollectiveDesc& d, const std::string& at, int r, int p) {
  const bool gather = d.kind == CollectiveKind::AllGather;
  const Tensor& whole = gather ? d.recv : d.send;
  const int64_t n = whole.numel();
  const PartitionDesc& pd = d.partition;
  if (pd.outer < 0 || pd.inner < 0 || (pd.rows >= 0 && pd.outer * pd.rows * pd.inner != n) ||
      (pd.rows < 0 && (pd.outer != 1 || pd.inner != 1)))
    user_error(
        "{}: the partition [outer {}, rows {}, inner {}] does not cover the {}-element {}: outer * "
        "rows * "
        "inner must be its element count (rows -1, with outer and inner 1: the flat split)",
        at, pd.outer, pd.rows, pd.inner, n,
        gather                                ? "output"
        : d.kind == CollectiveKind::AllReduce ? "buffer"
                                              : "input");
  if (d.kind == CollectiveKind::AllReduce) return;
  const detail::Parts parts(pd, n, p);
  const int64_t want = parts.count(r);
  const Tensor& part = gather ? d.send : d.recv;
  const char* part_role = gather ? "input" : "output";
  const char* whole_role = gather ? "output" : "input";
  // A part-sized tensor is the packed part; a whole-sized one holds the part in its place (where
  // the part is the whole, the two are the same).
  if (part.numel() == n && (n != want || part.data() == whole.data())) {
    if (gather && part.data() != whole.data())
      user_error(
          "{}: the input has as many elements as the output ({}), so it must be the output itself "
          "(this "
          "rank's part already in place), or pass this rank's part alone ({} elements, {})",
          at, n, want, part_words(parts, p, r));
    if (!gather && overlaps(d.send, d.recv) && d.recv.data() != d.send.data())
      user_error(
          "{}: the output is shaped as the whole and overlaps the input without being it; pass "
          "separate "
          "buffers, or the input itself to reduce in place",
          at);
    return;
  }
  if (part.numel() != want)
    user_error(
        "{}: the {} has {} elements but this rank's part of the {}-element {} is {} elements "
        "({}){}",
        at, part_role, part.numel(), n, whole_role, want, part_words(parts, p, r),
        gather ? "" : fmt::format(", or {} for an output shaped as the whole", n));
  if (!overlaps(d.send, d.recv)) return;
  const size_t esize = dtype_size(whole.dtype());
  const char* in_place =
      static_cast<const char*>(whole.data()) + static_cast<size_t>(parts.run_start(r, 0)) * esize;
  if (!parts.contiguous() || part.data() != in_place)
    user_error(
        "{}: the {} overlaps the {} but is not this rank's part of it ({}); pass separate buffers, "
        "{}",
        at, part_role, whole_role, part_words(parts, p, r),
        parts.contiguous()
            ? fmt::format("or exactly that part to {} in place", gather ? "gather" : "reduce")
        : gather ? std::string("or the output itself as the input")
                 : std::string("or the input itself as the output"));
}

void validate(const CollectiveDesc& d, int r, int p, bool shares_memory) {
  const std::string at = fmt::format("{} on rank {} of {}", collective_name(d.kind), r, p);
  const bool reducing =
      d.kind == CollectiveKind::AllReduce || d.kind == CollectiveKind::ReduceScatter;
  const bool in_place = d.kind == CollectiveKind::AllReduce || d.kind == CollectiveKind::Broadcast;
  const char* send_role = in_place ? "buffer" : "input";

  if (!d.send.defined()) user_error("{}: the {} tensor is undefined", at, send_role);
  if (in_place) {
    if (d.recv.defined() && d.recv.data() != d.send.data())
      user_error("{}: {} works in place: pass the buffer as `send` and leave `recv` empty", at,
                 collective_name(d.kind));
  } else {
    if (!d.recv.defined()) user_error("{}: the output tensor is undefined", at);
    if (d.send.dtype() != d.recv.dtype())
      user_error("{}: the input is {} but the output is {}; both must have the same dtype", at,
                 dtype_name(d.send.dtype()), dtype_name(d.recv.dtype()));
  }
  if (!reducing && d.hook)
    user_error("{}: {} takes no chunk hook (only all_reduce and reduce_scatter run one)", at,
               collective_name(d.kind));

  if (d.kind == CollectiveKind::Broadcast) {
    if (!(d.partition == PartitionDesc{}))
      user_error("{}: broadcast takes no partition (it copies the whole buffer to every rank)", at);
  } else if (d.kind == CollectiveKind::Shift) {
    if (!(d.partition == PartitionDesc{}))
      user_error("{}: shift takes no partition (the whole buffer goes to the next rank)", at);
    if (d.recv.numel() != d.send.numel())
      user_error("{}: the input has {} elements but the output {}; shift keeps the size", at,
                 d.send.numel(), d.recv.numel());
    if (overlaps(d.send, d.recv))
      user_error(
          "{}: the output overlaps the input; shift sends the input while it receives, so pass "
          "separate buffers",
          at);
  } else {
    validate_partition(d, at, r, p);
  }
  if (d.kind == CollectiveKind::Broadcast && (d.root < 0 || d.root >= p))
    user_error("{}: root {} is out of range; the group has ranks 0 to {}", at, d.root, p - 1);
  if (d.algo == CollectiveAlgo::Direct && !shares_memory)
    user_error(
        "{}: the direct algorithm needs ranks that share memory (threads, or MPI "
        "processes on one node); this group's ranks do not",
        at);
}

// A group of one: nothing moves, but the output is still written and the hook still runs chunk
// by chunk, exactly as it would on more ranks.
void run_alone(const CollectiveDesc& d) {
  const int64_t ce = detail::chunk_elements(d.chunk_bytes, d.send.dtype());
  const detail::Parts parts = detail::parts_of(d, 1);
  auto run_hook = [&](const Tensor& t) {
    if (!d.hook) return;
    for (int64_t c = 0, nc = parts.chunks(0, ce); c < nc; ++c) {
      const detail::Piece x = parts.chunk(0, c, ce);
      d.hook(t.flat_slice(x.whole, x.n), x.whole);
    }
  };
  switch (d.kind) {
    case CollectiveKind::AllReduce:
      run_hook(d.send);
      break;
    case CollectiveKind::ReduceScatter:
    case CollectiveKind::AllGather:
      // With one rank the part is the whole, packed or not.
      if (d.recv.data() != d.send.data() && d.send.nbytes() > 0)
        std::memcpy(d.recv.data(), d.send.data(), d.send.nbytes());
      if (d.kind == CollectiveKind::ReduceScatter) run_hook(d.recv);
      break;
    case CollectiveKind::Broadcast:
      break;
    case CollectiveKind::Shift:  // the next rank is this one
      if (d.send.nbytes() > 0) std::memcpy(d.recv.data(), d.send.data(), d.send.nbytes());
      break;
  }
}

void check_p2p(const char* what, const Tensor& t, int peer, int tag, int r, int p) {
  if (!t.defined()) user_error("{} on rank {} of {}: the tensor is undefined", what, r, p);
  if (peer < 0 || peer >= p)
    user_error("{} on rank {} of {}: peer {} is out of range; the group has ranks 0 to {}", what, r,
               p, peer, p - 1);
  if (tag < 0 || tag > kMaxUserTag)
    user_error("{} on rank {} of {}: tag {} is out of range; tags are 0 to {}", what, r, p, tag,
               kMaxUserTag);
}

}  // namespace

// ---- Communicator ----------------------------------------------------------------------------

Communicator::Communicator() = default;
Communicator::~Communicator() = default;

Allocator& Communicator::allocator() const { return host_allocator(); }

std::vector<int> Communicator::rank_nodes() const {
  return nodes_.empty() ? std::vector<int>(static_cast<size_t>(size()), 0) : nodes_;
}

Allocator& buffer_allocator(const Communicator& comm, Allocator& alloc) {
  return &alloc == &host_allocator() ? comm.allocator() : alloc;
}

void Communicator::set_rank_nodes(std::vector<int> nodes) { nodes_ = std::move(nodes); }

bool Communicator::execute_hierarchical(const CollectiveDesc& desc) {
  // A shift's one message per rank already crosses each node boundary once.
  if (desc.algo != CollectiveAlgo::Auto || desc.kind == CollectiveKind::Shift) return false;
  if (hierarchical_ == nullptr) {
    const int L = detail::Hierarchical::ranks_per_node(nodes_);
    if (L == 0) return false;
    hierarchical_ = std::make_unique<detail::Hierarchical>(*this, L);
  }
  hierarchical_->run(desc);
  return true;
}

Request Communicator::isend(const Tensor& t, int peer, int tag) {
  check_p2p("isend", t, peer, tag, rank(), size());
  return post_send(t, peer, tag);
}

Request Communicator::irecv(const Tensor& t, int peer, int tag) {
  check_p2p("irecv", t, peer, tag, rank(), size());
  return post_recv(t, peer, tag);
}

void Communicator::all_reduce(const Tensor& buf, ReduceOp op, const ChunkHook& hook,
                              const PartitionDesc& partition) {
  CollectiveDesc d{CollectiveKind::AllReduce};
  d.op = op;
  d.send = buf;
  d.hook = hook;
  d.partition = partition;
  run(std::move(d));
}

void Communicator::reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op,
                                  const ChunkHook& hook, const PartitionDesc& partition) {
  CollectiveDesc d{CollectiveKind::ReduceScatter};
  d.op = op;
  d.send = in;
  d.recv = out;
  d.hook = hook;
  d.partition = partition;
  run(std::move(d));
}

void Communicator::all_gather(const Tensor& in, const Tensor& out, const PartitionDesc& partition) {
  CollectiveDesc d{CollectiveKind::AllGather};
  d.send = in;
  d.recv = out;
  d.partition = partition;
  run(std::move(d));
}

void Communicator::broadcast(const Tensor& buf, int root) {
  CollectiveDesc d{CollectiveKind::Broadcast};
  d.send = buf;
  d.root = root;
  run(std::move(d));
}

void Communicator::shift(const Tensor& in, const Tensor& out) {
  CollectiveDesc d{CollectiveKind::Shift};
  d.send = in;
  d.recv = out;
  run(std::move(d));
}

void Communicator::run(CollectiveDesc desc) {
  validate(desc, rank(), size(), shares_memory());
  if (desc.chunk_bytes == 0) desc.chunk_bytes = chunk_bytes();
  if (debug_enabled())
    fmt::print(stderr,
               "tandem comm: {} rank {}/{} {} {} {} root={} algo={} chunk={}B hook={} "
               "partition=[{}, {}, {}]\n",
               backend_name(backend()), rank(), size(), collective_name(desc.kind),
               reduce_op_name(desc.op), desc.send.str(), desc.root, collective_algo_name(desc.algo),
               desc.chunk_bytes, static_cast<bool>(desc.hook), desc.partition.outer,
               desc.partition.rows, desc.partition.inner);
  if (size() == 1) {
    run_alone(desc);
    return;
  }
  execute(desc);
}

void Communicator::execute(const CollectiveDesc& desc) { execute_ring(desc); }

size_t Communicator::ring_message_bytes(size_t chunk_bytes) const { return chunk_bytes; }

void Communicator::execute_ring(const CollectiveDesc& desc) {
  if (ring_ == nullptr) ring_ = std::make_unique<detail::Ring>(*this);
  ring_->run(desc);
}

}  // namespace tandem::comm
