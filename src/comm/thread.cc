// The thread backend: ranks are threads of this process; collectives run the Direct algorithms
// (direct.h) over the group's slots, with every rank's buffers readable as they are;
// point-to-point is a rendezvous that copies once, and every wait spins briefly and then sleeps
// (see wait.h).
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

#include "direct.h"
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

using detail::Call;
using detail::call_name;

struct Group;

// A rendezvous: a posted send or receive waiting for its match.
struct P2P {
  int src = 0, dst = 0, tag = 0;  // group ranks
  int owner = 0;                  // world rank of the thread that posted it (to wake it)
  void* data = nullptr;
  size_t bytes = 0;
  std::string what;           // "f32[100]", for the size-mismatch message
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
        slots(new detail::Slot[members.size()]),
        boxes(new Mailbox[members.size()]),
        split_child(new std::shared_ptr<Group>[2 * members.size()]) {}
  int size() const { return static_cast<int>(members.size()); }

  std::shared_ptr<World> world;
  std::vector<int> members;  // group rank -> world rank
  std::unique_ptr<detail::Slot[]> slots;
  std::unique_ptr<Mailbox[]> boxes;
  // The group a split's leader made, by (leader, parity of the split's sequence number).
  std::unique_ptr<std::shared_ptr<Group>[]> split_child;
};

// ---- Point to point
// ------------------------------------------------------------------------------

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
    error = fmt::format(
        "message size mismatch: rank {} sends {} ({} bytes) with tag {} to rank {}, "
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

// ---- The communicator
// ----------------------------------------------------------------------------

class ThreadCommunicator final : public Communicator, detail::PeerMemory {
 public:
  ThreadCommunicator(std::shared_ptr<Group> g, int rank)
      : g_(std::move(g)), rank_(rank), me_(g_->members[rank]), direct_(*this) {
    // Threads share one machine; only a forced grouping makes nodes of them (for tests).
    if (const int k = ranks_per_node(); k > 0) {
      std::vector<int> nodes;
      for (int m : g_->members) nodes.push_back(m / k);
      set_rank_nodes(std::move(nodes));
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return g_->size(); }
  Backend backend() const override { return Backend::Thread; }

  void barrier() override {
    detail::PostedCall c;
    c.call = Call::Barrier;
    direct_.group_call(c, /*shares_buffers=*/false, [](uint64_t) {});
  }

  std::unique_ptr<Communicator> split(int color, int key) override;

 protected:
  Request post_send(const Tensor& t, int peer, int tag) override {
    return post(t, peer, tag, true);
  }
  Request post_recv(const Tensor& t, int peer, int tag) override {
    return post(t, peer, tag, false);
  }
  void execute(const CollectiveDesc& d) override {
    if (execute_hierarchical(d)) return;
    direct_.run(d, [&] { execute_ring(d); });
  }
  bool shares_memory() const override { return true; }

 private:
  // PeerMemory: every rank's buffers are readable as they are.
  detail::Slot& slot(int q) const override { return g_->slots[q]; }
  Bell& bell(int q) const override { return world().bells[g_->members[q]]; }
  const detail::SpinPolicy& spin() const override { return world().spin; }
  uint64_t address_of(const void* p, size_t) const override {
    return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p));
  }
  char* resolve(int, uint64_t address) const override {
    return reinterpret_cast<char*>(static_cast<uintptr_t>(address));
  }
  void check(std::string_view where, int q, const std::function<bool()>& ready) override;
  std::string ranks_named(const std::vector<int>& ranks) const override;
  void failed(std::exception_ptr e) override;
  void wait_quiet(uint64_t seq) override;

  World& world() const { return *g_->world; }

  Request post(const Tensor& t, int peer, int tag, bool is_send);

  std::shared_ptr<Group> g_;
  int rank_;
  int me_;  // world rank
  detail::Direct direct_;
};

void ThreadCommunicator::check(std::string_view where, int q, const std::function<bool()>& ready) {
  World& w = world();
  if (w.aborted.load(std::memory_order_seq_cst))
    throw Aborted(fmt::format("{}: aborted because rank {} failed", where, w.origin.load()));
  if (q >= 0 && w.exited[g_->members[q]].load(std::memory_order_seq_cst) && !ready())
    user_error(
        "{}: rank {} has returned from its function without taking part; every rank of "
        "the group must make the same collective calls in the same order",
        where, q);
}

std::string ThreadCommunicator::ranks_named(const std::vector<int>& ranks) const {
  // Ranks of a split group are named by their world ranks too: those are the ones users know.
  std::string text = detail::rank_list(ranks);
  if (size() != world().n) {
    std::vector<int> in_world;
    for (int r : ranks) in_world.push_back(g_->members[r]);
    text += " (world " + detail::rank_list(in_world) + ")";
  }
  return text;
}

void ThreadCommunicator::failed(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const Aborted&) {
  } catch (...) {
    world().abort(me_, std::current_exception());
  }
}

void ThreadCommunicator::wait_quiet(uint64_t seq) {
  World& w = world();
  for (int q = 0; q < size(); ++q) {
    if (q == rank_) continue;
    w.bells[me_].wait(
        w.spin,
        [&] {
          return slot(q).finished.v.load(std::memory_order_seq_cst) >= seq ||
                 slot(q).posted.v.load(std::memory_order_seq_cst) < seq ||
                 w.exited[g_->members[q]].load(std::memory_order_seq_cst);
        },
        [] {});
  }
}

std::unique_ptr<Communicator> ThreadCommunicator::split(int color, int key) {
  detail::PostedCall c;
  c.call = Call::Split;
  c.color = color;
  c.key = key;
  std::shared_ptr<Group> child;
  int child_rank = -1;
  direct_.group_call(c, /*shares_buffers=*/false, [&](uint64_t seq) {
    if (color < 0) return;
    // The new group: ranks of our color, ordered by (key, old rank).
    std::vector<std::pair<int, int>> order;
    for (int q = 0; q < size(); ++q) {
      const detail::PostedCall& x = direct_.posted(q, seq);
      if (x.color == color) order.emplace_back(x.key, q);
    }
    std::sort(order.begin(), order.end());
    const int leader = order.front().second;
    for (size_t i = 0; i < order.size(); ++i)
      if (order[i].second == rank_) child_rank = static_cast<int>(i);
    std::shared_ptr<Group>& made = g_->split_child[2 * leader + (seq & 1)];
    if (leader == rank_) {
      std::vector<int> members;
      for (const auto& o : order) members.push_back(g_->members[o.second]);
      made = std::make_shared<Group>(g_->world, members);
      direct_.publish(seq, 1);
    } else {
      direct_.wait_for(Call::Split, leader, [&] { return direct_.published(leader, seq) >= 1; });
    }
    child = made;
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
    throw;                            // every rank's, not this one's
  } catch (const StopWaitError& x) {  // keeps its type: the command exits as the signal asks
    if (std::string_view(x.what()).find(tag) != std::string_view::npos) throw;
    throw StopWaitError(x.signal(), prefix + x.what());
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
    user_error(
        "run_ranks: {} in-process ranks; the thread backend runs at most {} (thread.h: "
        "kMaxThreadRanks)",
        n, kMaxThreadRanks);
  check_ranks_per_node(n);
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
