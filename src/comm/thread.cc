// The thread backend: ranks are threads of this process; collectives read peers' buffers directly
// (the Direct algorithm), point-to-point is a rendezvous that copies once, and every wait spins
// briefly and then sleeps (see wait.h).
//
// Shared state, per group: one Slot per rank, where a rank posts the descriptor of its current
// call (double-buffered by the parity of the call's sequence number, so a rank may post call s+1
// while a slow peer still reads call s) and publishes three counters: `posted` (the call whose
// descriptor is up), `progress` (how many chunks of its part it has reduced, tagged with the
// call) and `finished` (the last call in which it stopped touching its peers' buffers). A call
// runs: post; wait until every peer has posted; compare descriptors (mismatches are caught here);
// the algorithm; publish finished; wait until every peer has finished (so no rank returns, and
// lets its caller reuse its buffer, while a peer still reads it).
#include "tandem/comm/thread.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include "checks.h"
#include "reduce.h"
#include "tandem/core/error.h"
#include "timeout.h"
#include "wait.h"

namespace tandem::comm {
namespace {

using detail::Bell;

// Thrown by a rank that finds its group aborted by another rank's failure. It is a consequence,
// never the cause: run_ranks reports the cause.
class Aborted : public UserError {
 public:
  using UserError::UserError;
};

// Copies larger than this go round the cache (streaming stores) in the all-gather step: at this
// size the destination is not read again before it is evicted anyway.
constexpr size_t kStreamingBytes = size_t{8} << 20;

// ---- The world: the ranks started by one run_ranks call ---------------------------------------

struct World {
  explicit World(int n)
      : n(n),
        bells(new Bell[n]),
        exited(new std::atomic<bool>[n]),
        spin(detail::spin_policy_for(n)) {
    for (int i = 0; i < n; ++i) exited[i].store(false);
  }

  // Records the first failure and wakes every rank, wherever it waits.
  void abort(int world_rank, std::exception_ptr e) {
    bool timeout = false;
    try {
      std::rethrow_exception(e);
    } catch (const TimeoutError&) {
      timeout = true;
    } catch (...) {
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      if (timeout) timed_out.store(true);
      if (error == nullptr && !reported) {
        error = std::move(e);
        error_rank = world_rank;
        origin.store(world_rank, std::memory_order_seq_cst);
      }
    }
    aborted.store(true, std::memory_order_seq_cst);
    ring_all();
    done.notify_all();
  }

  // Called by each rank's thread as it finishes (and for ranks that never started).
  void exit(int world_rank) {
    exited[world_rank].store(true, std::memory_order_seq_cst);
    ring_all();
    {
      std::lock_guard<std::mutex> lock(mu);
      ++exited_count;
    }
    done.notify_all();
  }

  void ring_all() {
    for (int i = 0; i < n; ++i) bells[i].ring();
  }

  const int n;
  std::unique_ptr<Bell[]> bells;  // one per rank (thread)
  std::unique_ptr<std::atomic<bool>[]> exited;
  std::atomic<bool> aborted{false};
  std::atomic<bool> timed_out{false};  // a rank's wait passed the collective timeout
  std::atomic<int> origin{-1};
  const detail::SpinPolicy spin;
  std::mutex mu;
  std::exception_ptr error;
  int error_rank = -1;
  std::condition_variable done;  // a rank exited, or the world aborted (with mu)
  int exited_count = 0;
  bool reported = false;  // run_ranks has taken `error` (with mu)
};

// ---- Groups ------------------------------------------------------------------------------------

// What a group call is (the collectives, plus the two calls that share their protocol).
enum class Call : uint8_t { AllReduce, ReduceScatter, AllGather, Broadcast, Barrier, Split };

std::string_view call_name(Call c) {
  switch (c) {
    case Call::Barrier: return "barrier";
    case Call::Split: return "split";
    default: return collective_name(static_cast<CollectiveKind>(c));
  }
}

struct Group;

// One rank's posted call.
struct Desc {
  Call call = Call::Barrier;
  ReduceOp op = ReduceOp::Sum;
  DType dtype = DType::F32;
  CollectiveAlgo algo = CollectiveAlgo::Auto;
  int64_t n = 0;  // elements of the whole buffer
  int root = 0;
  const char* send = nullptr;
  char* recv = nullptr;
  int color = 0, key = 0;
  std::shared_ptr<Group> split_group;  // published by the leader of each color
};

struct alignas(64) Counter {
  std::atomic<uint64_t> v{0};
};

struct Slot {
  Counter posted;
  Counter progress;  // (call sequence number << 32) | chunks published
  Counter finished;
  Desc desc[2];
};

// A rendezvous: a posted send or receive waiting for its match.
struct P2P {
  int src = 0, dst = 0, tag = 0;  // group ranks
  int owner = 0;                  // world rank of the thread that posted it (to wake it)
  void* data = nullptr;
  size_t bytes = 0;
  std::string what;  // "f32[100]", for the size-mismatch message
  std::atomic<int> state{0};  // 0 pending, 1 done, 2 failed (error set first)
  std::string error;
  std::unique_ptr<char[]> owned;  // the bytes of an abandoned send, kept until it is received
};

// The unmatched sends to, and receives posted by, one rank.
struct Mailbox {
  std::mutex mu;
  std::deque<std::shared_ptr<P2P>> sends, recvs;
};

struct Group {
  Group(std::shared_ptr<World> w, std::vector<int> m)
      : world(std::move(w)),
        members(std::move(m)),
        slots(new Slot[members.size()]),
        boxes(new Mailbox[members.size()]) {}
  int size() const { return static_cast<int>(members.size()); }

  std::shared_ptr<World> world;
  std::vector<int> members;  // group rank -> world rank
  std::unique_ptr<Slot[]> slots;
  std::unique_ptr<Mailbox[]> boxes;
};

// ---- Point to point ------------------------------------------------------------------------------

void complete(World& w, P2P& x, const std::string& error) {
  if (error.empty()) {
    x.state.store(1, std::memory_order_seq_cst);
  } else {
    x.error = error;
    x.state.store(2, std::memory_order_seq_cst);
  }
  w.bells[x.owner].ring();
}

// The second side to arrive copies the bytes, straight from the sender's tensor to the
// receiver's, and completes both.
void match(World& w, P2P& send, P2P& recv) {
  std::string error;
  if (send.bytes != recv.bytes) {
    error = fmt::format("message size mismatch: rank {} sends {} ({} bytes) with tag {} to rank {}, "
                        "which receives into {} ({} bytes); sizes must match exactly",
                        send.src, send.what, send.bytes, send.tag, send.dst, recv.what, recv.bytes);
  } else if (send.bytes > 0) {
    std::memcpy(recv.data, send.data, send.bytes);
  }
  complete(w, send, error);
  complete(w, recv, error);
}

class ThreadRequest final : public Request::State {
 public:
  ThreadRequest(std::shared_ptr<Group> g, std::shared_ptr<P2P> x, bool is_send)
      : g_(std::move(g)), x_(std::move(x)), is_send_(is_send) {}

  // An abandoned request must not leave a peer copying from or into a dead tensor. An unmatched
  // send still goes out, as on MPI: its bytes are copied aside and it stays in the mailbox. An
  // unmatched receive is withdrawn. One already matched is being copied right now: that copy is
  // waited for.
  ~ThreadRequest() override {
    if (x_->state.load(std::memory_order_seq_cst) != 0) return;
    Mailbox& box = g_->boxes[x_->dst];
    {
      std::lock_guard<std::mutex> lock(box.mu);
      auto& list = is_send_ ? box.sends : box.recvs;
      auto it = std::find(list.begin(), list.end(), x_);
      if (it != list.end()) {
        if (is_send_) {
          x_->owned.reset(new char[std::max<size_t>(1, x_->bytes)]);
          if (x_->bytes > 0) std::memcpy(x_->owned.get(), x_->data, x_->bytes);
          x_->data = x_->owned.get();
        } else {
          list.erase(it);
        }
        return;
      }
    }
    while (x_->state.load(std::memory_order_seq_cst) == 0) detail::yield_thread();
  }

  bool test() override {
    const int s = x_->state.load(std::memory_order_seq_cst);
    if (s == 2) throw UserError(prefix() + x_->error);
    if (s == 1) return true;
    check();
    return false;
  }

  void wait() override {
    World& w = *g_->world;
    const detail::Deadline deadline;
    auto done = [&] { return x_->state.load(std::memory_order_seq_cst) != 0; };
    w.bells[x_->owner].wait(w.spin, done, [&] {
      check();
      if (deadline.passed() && !done())
        detail::timed_out(fmt::format("{} on rank {} of {}", is_send_ ? "send" : "recv",
                                      is_send_ ? x_->src : x_->dst, g_->size()),
                          deadline,
                          fmt::format("rank {} never {} the message with tag {}", peer(),
                                      is_send_ ? "posted the receive of" : "sent", x_->tag));
    });
    test();
  }

 private:
  std::string prefix() const {
    return fmt::format("{} on rank {} of {}: ", is_send_ ? "send" : "recv",
                       is_send_ ? x_->src : x_->dst, g_->size());
  }
  int peer() const { return is_send_ ? x_->dst : x_->src; }

  void check() {
    World& w = *g_->world;
    if (w.aborted.load(std::memory_order_seq_cst))
      throw Aborted(prefix() + fmt::format("aborted because rank {} failed", w.origin.load()));
    if (w.exited[g_->members[peer()]].load(std::memory_order_seq_cst) &&
        x_->state.load(std::memory_order_seq_cst) == 0)
      throw UserError(prefix() + fmt::format("{} rank {} with tag {} can never complete: rank {} "
                                             "has returned from its function",
                                             is_send_ ? "the send to" : "the receive from", peer(),
                                             x_->tag, peer()));
  }

  std::shared_ptr<Group> g_;
  std::shared_ptr<P2P> x_;
  bool is_send_;
};

// ---- The communicator ----------------------------------------------------------------------------

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<Group> g, int rank)
      : g_(std::move(g)), rank_(rank), me_(g_->members[rank]), srcs_(g_->size()) {}

  int rank() const override { return rank_; }
  int size() const override { return g_->size(); }
  std::string_view backend() const override { return "thread"; }

  void barrier() override {
    Desc d;
    d.call = Call::Barrier;
    group_call(d, /*shares_buffers=*/false, [](uint64_t) {});
  }

  std::unique_ptr<Communicator> split(int color, int key) override;

 protected:
  Request post_send(const Tensor& t, int peer, int tag) override { return post(t, peer, tag, true); }
  Request post_recv(const Tensor& t, int peer, int tag) override { return post(t, peer, tag, false); }
  void execute(const CollectiveDesc& d) override;

 private:
  World& world() const { return *g_->world; }
  Slot& slot(int q) const { return g_->slots[q]; }
  Bell& my_bell() const { return world().bells[me_]; }
  std::string at(Call c) const {
    return fmt::format("{} on rank {} of {}", call_name(c), rank_, size());
  }

  Request post(const Tensor& t, int peer, int tag, bool is_send);

  // Runs one group call: post `d`, meet the peers, check they called the same thing, run body,
  // and (when the body read peers' buffers) wait until every peer is done with ours.
  template <typename Body>
  void group_call(const Desc& d, bool shares_buffers, Body&& body);
  void check_matching(uint64_t seq, Call call) const;
  // Blocks until ready(); fails if the group is aborted or rank q (when q >= 0) has returned.
  template <typename Ready>
  void wait_for(Call call, int q, Ready&& ready) const;
  // For a timeout in call `seq_`: the ranks that have not posted it ("did not arrive"), or else
  // rank q, which arrived but has not done its part.
  std::string late_ranks(int q) const;
  // After a failure: returns once no peer can still be touching this rank's buffers.
  void wait_quiet(uint64_t seq) const;
  void ring_peers() const;

  // The Direct algorithms.
  void direct_reduce(const Desc& d, uint64_t seq, char* dst_base, int64_t dst_offset,
                     const ChunkHook* hook, bool publish);
  void direct_all_reduce(const Desc& d, uint64_t seq, const ChunkHook* hook);
  void direct_all_gather(const Desc& d, uint64_t seq);
  void direct_broadcast(const Desc& d, uint64_t seq);
  size_t gather_published(const Desc& d, uint64_t seq, std::vector<int64_t>& done, bool block);

  int64_t published(int q, uint64_t seq) const {
    const uint64_t v = slot(q).progress.v.load(std::memory_order_seq_cst);
    return (v >> 32) == (seq & 0xffffffffu) ? static_cast<int64_t>(v & 0xffffffffu) : 0;
  }

  std::shared_ptr<Group> g_;
  int rank_;
  int me_;  // world rank
  uint64_t seq_ = 0;
  detail::Deadline deadline_;         // of the current group call, started when it posts
  std::vector<const void*> srcs_;     // reused: one input pointer per rank
  std::vector<int64_t> gathered_;     // reused: chunks of each part copied so far
};

template <typename Ready>
void ThreadCommunicator::wait_for(Call call, int q, Ready&& ready) const {
  World& w = world();
  my_bell().wait(w.spin, ready, [&] {
    if (w.aborted.load(std::memory_order_seq_cst))
      throw Aborted(fmt::format("{}: aborted because rank {} failed", at(call), w.origin.load()));
    if (q >= 0 && w.exited[g_->members[q]].load(std::memory_order_seq_cst) && !ready())
      user_error("{}: rank {} has returned from its function without taking part; every rank of "
                 "the group must make the same collective calls in the same order",
                 at(call), q);
    if (deadline_.passed() && !ready()) detail::timed_out(at(call), deadline_, late_ranks(q));
  });
}

std::string ThreadCommunicator::late_ranks(int q) const {
  std::vector<int> late;
  for (int r = 0; r < size(); ++r)
    if (r != rank_ && slot(r).posted.v.load(std::memory_order_seq_cst) < seq_) late.push_back(r);
  const bool arrived = late.empty();
  if (arrived && q >= 0) late.push_back(q);
  // Ranks of a split group are named by their world ranks too: those are the ones users know.
  std::string text = detail::rank_list(late);
  if (size() != world().n) {
    std::vector<int> in_world;
    for (int r : late) in_world.push_back(g_->members[r]);
    text += " (world " + detail::rank_list(in_world) + ")";
  }
  return text + (arrived ? " arrived but has not finished its part" : " did not arrive");
}

void ThreadCommunicator::ring_peers() const {
  for (int q = 0; q < size(); ++q)
    if (q != rank_) world().bells[g_->members[q]].ring();
}

template <typename Body>
void ThreadCommunicator::group_call(const Desc& d, bool shares_buffers, Body&& body) {
  World& w = world();
  if (w.aborted.load(std::memory_order_seq_cst))
    throw Aborted(fmt::format("{}: aborted because rank {} failed", at(d.call), w.origin.load()));
  const uint64_t seq = ++seq_;
  deadline_ = detail::Deadline();
  Slot& mine = slot(rank_);
  mine.desc[seq & 1] = d;
  mine.posted.v.store(seq, std::memory_order_seq_cst);
  ring_peers();
  try {
    for (int q = 0; q < size(); ++q)
      if (q != rank_)
        wait_for(d.call, q, [&] { return slot(q).posted.v.load(std::memory_order_seq_cst) >= seq; });
    // A rank that failed after we posted may be unwinding: with seq_cst on both sides, either it
    // sees our post (and waits for us in wait_quiet) or we see its abort here.
    if (w.aborted.load(std::memory_order_seq_cst))
      throw Aborted(fmt::format("{}: aborted because rank {} failed", at(d.call), w.origin.load()));
    check_matching(seq, d.call);
    body(seq);
    mine.finished.v.store(seq, std::memory_order_seq_cst);
    ring_peers();
    if (shares_buffers)
      for (int q = 0; q < size(); ++q)
        if (q != rank_)
          wait_for(d.call, q,
                   [&] { return slot(q).finished.v.load(std::memory_order_seq_cst) >= seq; });
  } catch (...) {
    // This group is now inconsistent: abort it (unless it already is) so that nobody waits for
    // us forever, then stay until no peer can be touching our buffers.
    try {
      throw;
    } catch (const Aborted&) {
    } catch (...) {
      w.abort(me_, std::current_exception());
    }
    mine.finished.v.store(seq, std::memory_order_seq_cst);
    ring_peers();
    wait_quiet(seq);
    throw;
  }
}

void ThreadCommunicator::wait_quiet(uint64_t seq) const {
  World& w = world();
  for (int q = 0; q < size(); ++q) {
    if (q == rank_) continue;
    my_bell().wait(
        w.spin,
        [&] {
          return slot(q).finished.v.load(std::memory_order_seq_cst) >= seq ||
                 slot(q).posted.v.load(std::memory_order_seq_cst) < seq ||
                 w.exited[g_->members[q]].load(std::memory_order_seq_cst);
        },
        [] {});
  }
}

void ThreadCommunicator::check_matching(uint64_t seq, Call call) const {
  auto signature = [&](int q) {
    const Desc& x = slot(q).desc[seq & 1];
    detail::CallSignature s;
    s.name = call_name(x.call);
    s.collective = x.call != Call::Barrier && x.call != Call::Split;
    s.dtype = x.dtype;
    s.n = x.n;
    s.op = x.op;
    s.root = x.root;
    s.algo = x.algo;
    s.reducing = x.call == Call::AllReduce || x.call == Call::ReduceScatter;
    s.rooted = x.call == Call::Broadcast;
    return s;
  };
  const detail::CallSignature first = signature(0);
  const std::string where = at(call);
  for (int q = 1; q < size(); ++q) detail::check_same_call(where, first, q, signature(q));
}

void ThreadCommunicator::execute(const CollectiveDesc& cd) {
  Desc d;
  d.call = static_cast<Call>(cd.kind);
  d.op = cd.op;
  d.dtype = cd.send.dtype();
  d.algo = cd.algo;
  d.n = cd.kind == CollectiveKind::AllGather ? cd.recv.numel() : cd.send.numel();
  d.root = cd.root;
  d.send = static_cast<const char*>(cd.send.data());
  d.recv = static_cast<char*>(cd.recv.data());
  const ChunkHook* hook = cd.hook ? &cd.hook : nullptr;

  if (cd.algo == CollectiveAlgo::Ring) {
    // The ring moves everything through post_send/post_recv, which own their synchronisation.
    group_call(d, /*shares_buffers=*/false, [&](uint64_t) { execute_ring(cd); });
    return;
  }
  group_call(d, /*shares_buffers=*/true, [&](uint64_t seq) {
    switch (cd.kind) {
      case CollectiveKind::AllReduce: direct_all_reduce(d, seq, hook); break;
      case CollectiveKind::ReduceScatter:
        direct_reduce(d, seq, d.recv, Partition::offset(d.n, size(), rank_), hook, false);
        break;
      case CollectiveKind::AllGather: direct_all_gather(d, seq); break;
      case CollectiveKind::Broadcast: direct_broadcast(d, seq); break;
    }
  });
}

// Reduces this rank's part, chunk by chunk, from every rank's input into dst_base (which holds
// elements from dst_offset on), runs the hook on each finished chunk, and, with `publish`, tells
// the peers that the chunk is ready for them to copy (all_reduce's gather).
void ThreadCommunicator::direct_reduce(const Desc& d, uint64_t seq, char* dst_base,
                                       int64_t dst_offset, const ChunkHook* hook, bool publish) {
  const int p = size();
  const size_t esize = dtype_size(d.dtype);
  const int64_t ce = std::max<int64_t>(1, static_cast<int64_t>(chunk_bytes() / esize));
  const int64_t off = Partition::offset(d.n, p, rank_), count = Partition::count(d.n, p, rank_);
  if (publish) gathered_.assign(p, 0);
  for (int64_t c = 0; c * ce < count; ++c) {
    const int64_t begin = off + c * ce, len = std::min(ce, count - c * ce);
    for (int q = 0; q < p; ++q) srcs_[q] = slot(q).desc[seq & 1].send + begin * esize;
    char* dst = dst_base + (begin - dst_offset) * esize;
    // Every rank's chunk, combined in rank order, written once.
    detail::reduce_into(d.dtype, d.op, dst, srcs_.data(), p, len);
    // The fused step, while the chunk is in cache.
    if (hook != nullptr) (*hook)(Tensor::view_of(dst, d.dtype, Shape{len}), begin);
    if (publish) {
      slot(rank_).progress.v.store(((seq & 0xffffffffu) << 32) | static_cast<uint64_t>(c + 1),
                                   std::memory_order_seq_cst);
      ring_peers();
      // Copy what the peers have published meanwhile, likely still in the shared cache.
      gather_published(d, seq, gathered_, /*block=*/false);
    }
  }
}

// Copies the chunks of the peers' parts that they have published and this rank has not copied
// yet into this rank's buffer; with `block`, waits for and copies all of them.
size_t ThreadCommunicator::gather_published(const Desc& d, uint64_t seq,
                                            std::vector<int64_t>& done, bool block) {
  const int p = size();
  const size_t esize = dtype_size(d.dtype);
  const int64_t ce = std::max<int64_t>(1, static_cast<int64_t>(chunk_bytes() / esize));
  const bool streaming = static_cast<size_t>(d.n) * esize >= kStreamingBytes;
  char* mine = const_cast<char*>(d.send);
  size_t copied = 0;
  for (int i = 1; i < p; ++i) {
    const int q = (rank_ + i) % p;  // start with different peers on different ranks
    const int64_t off = Partition::offset(d.n, p, q), count = Partition::count(d.n, p, q);
    const int64_t chunks = (count + ce - 1) / ce;
    const char* theirs = slot(q).desc[seq & 1].send;
    while (done[q] < chunks) {
      int64_t ready = published(q, seq);
      if (ready <= done[q]) {
        if (!block) break;
        wait_for(d.call, q, [&] { return published(q, seq) > done[q]; });
        ready = published(q, seq);
      }
      const int64_t begin = off + done[q] * ce;
      const int64_t len = std::min(ready * ce, count) - done[q] * ce;
      detail::copy_bytes(mine + begin * esize, theirs + begin * esize, len * esize, streaming);
      copied += len * esize;
      done[q] = ready;
    }
  }
  return copied;
}

void ThreadCommunicator::direct_all_reduce(const Desc& d, uint64_t seq, const ChunkHook* hook) {
  char* buf = const_cast<char*>(d.send);
  // Reduce-scatter, fused with the hook and with opportunistic gathering of peers' chunks.
  direct_reduce(d, seq, buf, 0, hook, /*publish=*/true);
  // All-gather whatever of the peers' parts is still missing.
  gather_published(d, seq, gathered_, /*block=*/true);
}

void ThreadCommunicator::direct_all_gather(const Desc& d, uint64_t seq) {
  const int p = size();
  const size_t esize = dtype_size(d.dtype);
  const bool streaming = static_cast<size_t>(d.n) * esize >= kStreamingBytes;
  for (int i = 0; i < p; ++i) {
    const int q = (rank_ + i) % p;
    const int64_t off = Partition::offset(d.n, p, q), count = Partition::count(d.n, p, q);
    const char* theirs = slot(q).desc[seq & 1].send;
    char* dst = d.recv + off * esize;
    if (theirs != dst) detail::copy_bytes(dst, theirs, count * esize, streaming);
  }
}

void ThreadCommunicator::direct_broadcast(const Desc& d, uint64_t seq) {
  if (rank_ == d.root) return;
  const size_t esize = dtype_size(d.dtype);
  const bool streaming = static_cast<size_t>(d.n) * esize >= kStreamingBytes;
  detail::copy_bytes(const_cast<char*>(d.send), slot(d.root).desc[seq & 1].send, d.n * esize,
                     streaming);
}

std::unique_ptr<Communicator> ThreadCommunicator::split(int color, int key) {
  Desc d;
  d.call = Call::Split;
  d.color = color;
  d.key = key;
  std::shared_ptr<Group> child;
  int child_rank = -1;
  group_call(d, /*shares_buffers=*/false, [&](uint64_t seq) {
    if (color < 0) return;
    // The new group: ranks of our color, ordered by (key, old rank).
    std::vector<std::pair<int, int>> order;
    for (int q = 0; q < size(); ++q) {
      const Desc& x = slot(q).desc[seq & 1];
      if (x.color == color) order.emplace_back(x.key, q);
    }
    std::sort(order.begin(), order.end());
    const int leader = order.front().second;
    for (size_t i = 0; i < order.size(); ++i)
      if (order[i].second == rank_) child_rank = static_cast<int>(i);
    if (leader == rank_) {
      std::vector<int> members;
      for (const auto& o : order) members.push_back(g_->members[o.second]);
      slot(rank_).desc[seq & 1].split_group = std::make_shared<Group>(g_->world, members);
      slot(rank_).progress.v.store(((seq & 0xffffffffu) << 32) | 1u, std::memory_order_seq_cst);
      ring_peers();
    } else {
      wait_for(Call::Split, leader, [&] { return published(leader, seq) >= 1; });
    }
    child = slot(leader).desc[seq & 1].split_group;
  });
  if (color < 0) return nullptr;
  return std::make_unique<ThreadCommunicator>(std::move(child), child_rank);
}

Request ThreadCommunicator::post(const Tensor& t, int peer, int tag, bool is_send) {
  World& w = world();
  if (w.aborted.load(std::memory_order_seq_cst))
    throw Aborted(fmt::format("{} on rank {} of {}: aborted because rank {} failed",
                              is_send ? "isend" : "irecv", rank_, size(), w.origin.load()));
  auto x = std::make_shared<P2P>();
  x->src = is_send ? rank_ : peer;
  x->dst = is_send ? peer : rank_;
  x->tag = tag;
  x->owner = me_;
  x->data = t.data();
  x->bytes = t.nbytes();
  x->what = t.str();
  Mailbox& box = g_->boxes[x->dst];
  std::shared_ptr<P2P> other;
  {
    std::lock_guard<std::mutex> lock(box.mu);
    auto& waiting = is_send ? box.recvs : box.sends;
    auto it = std::find_if(waiting.begin(), waiting.end(), [&](const std::shared_ptr<P2P>& y) {
      return y->src == x->src && y->tag == tag;
    });
    if (it != waiting.end()) {
      other = *it;
      waiting.erase(it);
    } else {
      (is_send ? box.sends : box.recvs).push_back(x);
    }
  }
  if (other != nullptr) {
    if (is_send) {
      match(w, *x, *other);
    } else {
      match(w, *other, *x);
    }
  }
  return Request(std::make_shared<ThreadRequest>(g_, std::move(x), is_send));
}

// Rethrows a rank's failure so that its message names the rank.
[[noreturn]] void rethrow_named(std::exception_ptr e, int rank, int n) {
  const std::string tag = fmt::format("rank {} of {}", rank, n);
  const std::string prefix = tag + ": ";
  try {
    std::rethrow_exception(e);
  } catch (const CollectiveError&) {
    throw;  // every rank's, not this one's
  } catch (const UserError& x) {
    if (std::string_view(x.what()).find(tag) != std::string_view::npos) throw;
    throw UserError(prefix + x.what());
  } catch (const InternalError& x) {
    if (std::string_view(x.what()).find(tag) != std::string_view::npos) throw;
    throw InternalError(prefix + x.what());
  } catch (const std::exception& x) {
    throw std::runtime_error(prefix + x.what());
  }
}

// How long run_ranks waits, after a failure, for the other ranks to return before it leaves the
// ones that do not behind: a rank stuck outside any communication call (deadlocked, or in a sleep
// that outlasts the timeout) would otherwise keep the error from ever being reported. A wait that
// timed out has already shown a rank stuck: 10 s more at most. After any other failure a rank may
// just be deep in a long computation: it gets the whole timeout to return. 0: wait forever.
double abandon_after_s(bool timed_out) {
  const double t = comm_timeout_s();
  return timed_out ? std::min(t, 10.0) : t;
}

}  // namespace

void run_ranks(int n, const std::function<void(Communicator&)>& fn) {
  if (n < 1) user_error("run_ranks: the number of ranks must be at least 1, got {}", n);
  if (n > kMaxThreadRanks)
    user_error("run_ranks: {} in-process ranks; the thread backend runs at most {} (thread.h: "
               "kMaxThreadRanks)", n, kMaxThreadRanks);
  auto world = std::make_shared<World>(n);
  std::vector<int> everyone(n);
  std::iota(everyone.begin(), everyone.end(), 0);
  auto group = std::make_shared<Group>(world, everyone);
  // Owned by every thread: a rank left behind after a failure may outlive this call.
  auto task = std::make_shared<const std::function<void(Communicator&)>>(fn);

  auto body = [world, group, task](int r) {
    try {
      ThreadCommunicator comm(group, r);
      (*task)(comm);
    } catch (const Aborted&) {
      // A consequence of another rank's failure, which is already recorded.
    } catch (...) {
      world->abort(r, std::current_exception());
    }
    world->exit(r);
  };

  // Every rank runs on a thread of its own, the caller only watches: a rank stuck outside any
  // communication call, even rank 0, must not keep the failure it caused from being reported.
  std::vector<std::thread> threads;
  threads.reserve(n);
  try {
    for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  } catch (...) {
    // Could not start every rank: the ones started must not wait for the others forever.
    world->abort(static_cast<int>(threads.size()), std::current_exception());
    for (int r = static_cast<int>(threads.size()); r < n; ++r) world->exit(r);
  }
  double grace = 0;
  {
    std::unique_lock<std::mutex> lock(world->mu);
    world->done.wait(lock, [&] { return world->exited_count == n || world->aborted.load(); });
    grace = abandon_after_s(world->timed_out.load());
    if (world->exited_count < n && grace > 0) {
      // Ranks waiting for their peers were woken by the abort and return at once; one that is
      // not waiting gets `grace` to notice, then is left behind, detached.
      const auto until = std::chrono::steady_clock::now() +
                         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                             std::chrono::duration<double>(grace));
      world->done.wait_until(lock, until, [&] { return world->exited_count == n; });
    }
  }
  for (size_t r = 0; r < threads.size(); ++r) {
    if (world->exited[r].load() || grace == 0) {
      threads[r].join();
    } else {
      threads[r].detach();
    }
  }
  // The failure leaves the world before it is rethrown: a rank left behind may be the last owner
  // of the world, and must not destroy the exception the caller is reading.
  std::exception_ptr failure;
  int failure_rank = -1;
  {
    std::lock_guard<std::mutex> lock(world->mu);
    failure = std::move(world->error);
    failure_rank = world->error_rank;
    world->reported = true;
  }
  if (failure != nullptr) rethrow_named(failure, failure_rank, n);
}

}  // namespace tandem::comm
