// The MPI backend: bytes over MPI_Isend/MPI_Irecv on a private duplicate of the communicator,
// collectives by the Direct algorithms on one node (over the processes' shared arenas), the
// hierarchical ones across nodes, else the ring; waits that poll MPI_Test with a backoff.
#include "tandem/comm/mpi.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "checks.h"
#include "direct.h"
#include "shared_arena.h"
#include "tandem/core/env.h"
#include "tandem/core/error.h"
#include "timeout.h"
#include "wait.h"

namespace tandem::comm {
namespace {

std::atomic<size_t> g_max_message{size_t{1} << 30};
bool g_initialized_by_tandem = false;

bool mpi_finalized() {
  int f = 0;
  MPI_Finalized(&f);
  return f != 0;
}

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, static_cast<size_t>(len));
}

void check_mpi(int rc, const std::string& where, const char* call) {
  if (rc != MPI_SUCCESS) user_error("{}: {} failed: {}", where, call, mpi_error_text(rc));
}

// Polls `done` (which calls MPI_Test: MPI makes progress only inside MPI calls) until it returns
// true. While ranks fit on the cores, it polls as MPI_Wait would (yielding would hand whole time
// slices to other processes while the peer's data is microseconds away) and only backs off to
// yields and then short sleeps on a long wait (a slow peer). When ranks outnumber cores it yields
// almost at once and soon sleeps, leaving the core to the rank it waits for. Past the collective
// timeout it calls timed_out(deadline), which throws.
template <typename Done, typename TimedOut>
void backoff_wait(Done&& done, TimedOut&& timed_out) {
  static const bool oversubscribed = [] {
    const unsigned cores = std::thread::hardware_concurrency();
    return cores != 0 && static_cast<unsigned>(launched_local_ranks()) > cores;
  }();
  using clock = std::chrono::steady_clock;
  using us = std::chrono::microseconds;
  const us poll_for = oversubscribed ? us(0) : us(10'000);
  const us yield_for = oversubscribed ? us(200) : us(100'000);
  const auto start = clock::now();
  const detail::Deadline deadline;
  for (int i = 0; !done(); ++i) {
    if (i < 64 || (i & 15) != 0) continue;  // look at the clock every 16 polls
    if (deadline.passed()) timed_out(deadline);
    const auto waited = clock::now() - start;
    if (waited < poll_for) continue;
    if (waited < yield_for) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(us(20));
    }
  }
}

// Calls fn(pointer, count) for each piece of a message split into pieces of at most
// mpi_max_message_bytes() (MPI counts are int); an empty message is one empty piece.
template <typename Fn>
void for_each_piece(void* data, size_t bytes, Fn&& fn) {
  const size_t max = std::max<size_t>(1, std::min<size_t>(mpi_max_message_bytes(), INT_MAX));
  char* p = static_cast<char*>(data);
  size_t done = 0;
  do {
    const size_t n = std::min(max, bytes - done);
    fn(p + done, static_cast<int>(n));
    done += n;
  } while (done < bytes);
}

// The collective this thread is running, for the timeout message of a message inside it.
thread_local std::string_view t_collective;

// Where a message goes, for error messages; formatted only when one is needed.
struct MessageInfo {
  bool is_recv;
  int rank, size, peer, tag;
  std::string where() const {
    return fmt::format("{} on rank {} of {} {} rank {} (tag {})", is_recv ? "recv" : "send", rank,
                       size, is_recv ? "from" : "to", peer, tag);
  }
};

class MpiRequest final : public Request::State {
 public:
  MpiRequest(const MessageInfo& info, const Tensor& t) : info_(info), tensor_(t) {}

  ~MpiRequest() override {
    if (done_ || mpi_finalized()) return;
    // Abandoned: a receive can be cancelled; a send is left to complete on its own.
    for (MPI_Request& r : reqs_) {
      if (r == MPI_REQUEST_NULL) continue;
      if (info_.is_recv) MPI_Cancel(&r);
      MPI_Request_free(&r);
    }
  }

  std::vector<MPI_Request>& requests() { return reqs_; }

  bool test() override {
    if (done_) return true;
    int flag = 0;
    statuses_.resize(reqs_.size());
    const int rc =
        MPI_Testall(static_cast<int>(reqs_.size()), reqs_.data(), &flag, statuses_.data());
    if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS)
      user_error("{}: MPI_Testall failed: {}", info_.where(), mpi_error_text(rc));
    if (!flag && rc == MPI_SUCCESS) return false;
    done_ = true;
    size_t got = 0;
    for (const MPI_Status& st : statuses_) {
      if (rc == MPI_ERR_IN_STATUS && st.MPI_ERROR != MPI_SUCCESS) {
        if (st.MPI_ERROR == MPI_ERR_TRUNCATE)
          user_error(
              "{}: the message is larger than the receive buffer {} ({} bytes); sizes "
              "must match exactly",
              info_.where(), tensor_.str(), tensor_.nbytes());
        user_error("{}: {}", info_.where(), mpi_error_text(st.MPI_ERROR));
      }
      if (!info_.is_recv) continue;
      int count = 0;
      MPI_Get_count(&st, MPI_BYTE, &count);
      got += static_cast<size_t>(count);
    }
    if (info_.is_recv && got != tensor_.nbytes())
      user_error("{}: received {} bytes into {} ({} bytes); sizes must match exactly",
                 info_.where(), got, tensor_.str(), tensor_.nbytes());
    return true;
  }

  void wait() override {
    backoff_wait([&] { return test(); },
                 [&](const detail::Deadline& d) {
                   const std::string where =
                       t_collective.empty()
                           ? fmt::format("{} on rank {} of {}", info_.is_recv ? "recv" : "send",
                                         info_.rank, info_.size)
                           : fmt::format("{} on rank {} of {}", t_collective, info_.rank,
                                         info_.size);
                   detail::timed_out(
                       where, d,
                       fmt::format("rank {} never {} the message with tag {}", info_.peer,
                                   info_.is_recv ? "sent" : "posted the receive of", info_.tag));
                 });
  }

 private:
  MessageInfo info_;
  Tensor tensor_;  // a view (shares storage) kept for the size check and messages
  bool done_ = false;
  std::vector<MPI_Request> reqs_;
  std::vector<MPI_Status> statuses_;
};

void finalize_at_exit() {
  int init = 0;
  MPI_Initialized(&init);
  if (g_initialized_by_tandem && init && !mpi_finalized()) MPI_Finalize();
}

// Arrival codes besides the collectives' own (CollectiveKind).
constexpr int kBarrierCode = 16;
constexpr int kSplitCode = 17;

// TANDEM_COMM_VERIFY=0 turns off the cross-rank agreement check of every collective.
bool env_verify() {
  static const bool on = env_int("TANDEM_COMM_VERIFY", 1) != 0;
  return on;
}

// A rank's slot and bell, in its shared arena where its peers read them.
struct NodeSlot {
  detail::Slot slot;
  detail::Bell bell;
};

// The memory of a group whose processes share a node: each rank's arena mapped into every
// process, and each rank's slot in its own arena. A dead peer ends the job (abort_mpi_job), so
// no wait checks for one; the collective timeout still ends a wait.
class NodeMemory final : public detail::PeerMemory {
 public:
  NodeMemory(int rank, std::vector<char*> bases, std::vector<NodeSlot*> slots,
             std::function<std::string(const std::vector<int>&)> names)
      : rank_(rank),
        bases_(std::move(bases)),
        slots_(std::move(slots)),
        names_(std::move(names)),
        spin_(detail::spin_policy_for(launched_local_ranks())),
        arena_(detail::SharedArena::get()) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(slots_.size()); }
  detail::Slot& slot(int q) const override { return slots_[static_cast<size_t>(q)]->slot; }
  detail::Bell& bell(int q) const override { return slots_[static_cast<size_t>(q)]->bell; }
  const detail::SpinPolicy& spin() const override { return spin_; }
  uint64_t address_of(const void* p, size_t bytes) const override {
    if (bytes == 0) return 0;
    if (!arena_->contains(p, bytes)) return detail::kNotShared;
    return static_cast<uint64_t>(static_cast<const char*>(p) - arena_->base());
  }
  char* resolve(int q, uint64_t address) const override {
    return bases_[static_cast<size_t>(q)] + address;
  }
  // Between sleeps, MPI is given a turn: a message this process sent before the wait (its own
  // MPI_Allreduce, a ring step) may still need its progress engine to reach a peer (OpenMPI's
  // TCP transport writes it out only when called), and that peer may be the one this wait is for.
  // Without it the two wait for each other for ever (seen with 2 nodes of 2 over TCP: rank 1 in
  // MPI_Allreduce, rank 0 already in the node's reduce-scatter).
  void check(std::string_view, int, const std::function<bool()>&) override {
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
  }
  std::string ranks_named(const std::vector<int>& ranks) const override { return names_(ranks); }

 private:
  int rank_;
  std::vector<char*> bases_;
  std::vector<NodeSlot*> slots_;
  std::function<std::string(const std::vector<int>&)> names_;
  detail::SpinPolicy spin_;
  detail::SharedArena* arena_;
};

}  // namespace

namespace {
std::atomic<size_t> g_message_override{0};
}  // namespace

size_t mpi_message_bytes() {
  static const size_t from_env = [] {
    const int64_t v =
        env_int("TANDEM_COMM_MPI_MESSAGE_BYTES", static_cast<int64_t>(kDefaultMpiMessageBytes));
    if (v < 1)
      user_error(
          "TANDEM_COMM_MPI_MESSAGE_BYTES={} is not a message size: expected a positive "
          "number of bytes (default {})",
          v, kDefaultMpiMessageBytes);
    return static_cast<size_t>(v);
  }();
  const size_t o = g_message_override.load(std::memory_order_relaxed);
  return o != 0 ? o : from_env;
}

void set_mpi_message_bytes(size_t bytes) {
  g_message_override.store(bytes, std::memory_order_relaxed);
}

size_t mpi_max_message_bytes() { return g_max_message.load(std::memory_order_relaxed); }
void set_mpi_max_message_bytes(size_t bytes) {
  g_max_message.store(bytes == 0 ? size_t{1} << 30 : bytes, std::memory_order_relaxed);
}

bool launched_by_mpirun() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm) {
  int init = 0;
  MPI_Initialized(&init);
  if (!init || mpi_finalized())
    user_error(
        "MpiCommunicator: MPI is not initialised (or already finalised); call MPI_Init "
        "first, or use tandem::comm::mpi_world() to let tandem do it");
  if (comm == MPI_COMM_NULL) user_error("MpiCommunicator: the communicator is MPI_COMM_NULL");
  check_mpi(MPI_Comm_dup(comm, &comm_), "MpiCommunicator", "MPI_Comm_dup");
  set_up();
}

MpiCommunicator::MpiCommunicator(MPI_Comm owned, Adopt) : comm_(owned) { set_up(); }

void MpiCommunicator::set_up() {
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  check_mpi(MPI_Comm_dup(comm_, &ctrl_), "MpiCommunicator", "MPI_Comm_dup");
  MPI_Comm_set_errhandler(ctrl_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  MPI_Group mine, world;
  MPI_Comm_group(comm_, &mine);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> ranks(static_cast<size_t>(size_));
  std::iota(ranks.begin(), ranks.end(), 0);
  world_ranks_.assign(static_cast<size_t>(size_), MPI_UNDEFINED);
  MPI_Group_translate_ranks(mine, size_, ranks.data(), world, world_ranks_.data());
  MPI_Group_free(&mine);
  MPI_Group_free(&world);
  set_up_node();
}

void MpiCommunicator::set_up_node() {
  const std::string where = fmt::format("MpiCommunicator on rank {} of {}", rank_, size_);
  // Which node this rank is on: world ranks in blocks of TANDEM_RANKS_PER_NODE, else the lowest
  // world rank among the processes that share its memory.
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  check_ranks_per_node(world_size);
  const int my_world = world_ranks_[static_cast<size_t>(rank_)];
  int node = 0;
  if (const int k = ranks_per_node(); k > 0) {
    node = my_world / k;
  } else {
    MPI_Comm local = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local), where,
              "MPI_Comm_split_type");
    check_mpi(MPI_Allreduce(&my_world, &node, 1, MPI_INT, MPI_MIN, local), where, "MPI_Allreduce");
    MPI_Comm_free(&local);
  }
  std::vector<int> nodes(static_cast<size_t>(size_));
  check_mpi(MPI_Allgather(&node, 1, MPI_INT, nodes.data(), 1, MPI_INT, comm_), where,
            "MPI_Allgather");
  const bool one_node =
      std::all_of(nodes.begin(), nodes.end(), [&](int x) { return x == nodes[0]; });
  set_rank_nodes(std::move(nodes));
  if (!one_node || size_ < 2) return;

  // One node: each rank shows its peers its arena (process, descriptor, size) and its slot, and
  // maps theirs. Every rank must succeed, or none uses shared memory.
  struct Card {
    int64_t pid = -1, fd = -1, bytes = 0, slot = 0;
  };
  Card mine;
  detail::SharedArena* arena = detail::SharedArena::get();
  NodeSlot* my_slot = nullptr;
  if (arena != nullptr) {
    // Kept until exit: a slow peer may still read this slot after the last call returns here.
    my_slot = new (arena->allocate(sizeof(NodeSlot))) NodeSlot();
    mine = Card{getpid(), arena->fd(), static_cast<int64_t>(arena->capacity()),
                reinterpret_cast<char*>(my_slot) - arena->base()};
  }
  std::vector<Card> cards(static_cast<size_t>(size_));
  check_mpi(
      MPI_Allgather(&mine, sizeof(Card), MPI_BYTE, cards.data(), sizeof(Card), MPI_BYTE, comm_),
      where, "MPI_Allgather");
  std::vector<char*> bases(static_cast<size_t>(size_), nullptr);
  std::vector<NodeSlot*> slots(static_cast<size_t>(size_), nullptr);
  int ok = 1;
  for (int q = 0; q < size_ && ok; ++q) {
    const Card& c = cards[static_cast<size_t>(q)];
    if (c.pid < 0) {
      ok = 0;
      break;
    }
    bases[q] = detail::map_peer_arena(static_cast<int>(c.pid), static_cast<int>(c.fd),
                                      static_cast<size_t>(c.bytes));
    if (bases[q] == nullptr)
      ok = 0;
    else
      slots[q] = reinterpret_cast<NodeSlot*>(bases[q] + c.slot);
  }
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm_), where, "MPI_Allreduce");
  if (!ok) return;
  node_ =
      std::make_unique<NodeMemory>(rank_, std::move(bases), std::move(slots),
                                   [this](const std::vector<int>& r) { return ranks_named(r); });
  direct_ = std::make_unique<detail::Direct>(*node_);
}

Allocator& MpiCommunicator::allocator() const {
  detail::SharedArena* arena = detail::SharedArena::get();
  return arena != nullptr ? static_cast<Allocator&>(*arena) : host_allocator();
}

MpiCommunicator::~MpiCommunicator() {
  direct_.reset();
  node_.reset();
  if (mpi_finalized()) return;
  if (ctrl_ != MPI_COMM_NULL) MPI_Comm_free(&ctrl_);
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::string MpiCommunicator::ranks_named(const std::vector<int>& group_ranks) const {
  std::string text = detail::rank_list(group_ranks);
  std::vector<int> in_world;
  for (int r : group_ranks) in_world.push_back(world_ranks_[static_cast<size_t>(r)]);
  if (in_world != group_ranks) text += " (world " + detail::rank_list(in_world) + ")";
  return text;
}

void MpiCommunicator::barrier() {
  CollectiveDesc none{CollectiveKind::AllReduce};
  arrive(none, kBarrierCode, env_verify());
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  // Arrive first: MPI_Comm_split blocks with no way out, so a missing rank must be found before.
  CollectiveDesc none{CollectiveKind::AllReduce};
  arrive(none, kSplitCode, env_verify());
  MPI_Comm child = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &child),
            fmt::format("split on rank {} of {}", rank_, size_), "MPI_Comm_split");
  if (child == MPI_COMM_NULL) return nullptr;
  return std::unique_ptr<Communicator>(new MpiCommunicator(child, Adopt{}));
}

Request MpiCommunicator::post_send(const Tensor& t, int peer, int tag) {
  auto st = std::make_shared<MpiRequest>(MessageInfo{false, rank_, size_, peer, tag}, t);
  for_each_piece(t.data(), t.nbytes(), [&](char* p, int n) {
    MPI_Request r;
    const int rc = MPI_Isend(p, n, MPI_BYTE, peer, tag, comm_, &r);
    if (rc != MPI_SUCCESS)
      check_mpi(rc, MessageInfo{false, rank_, size_, peer, tag}.where(), "MPI_Isend");
    st->requests().push_back(r);
  });
  return Request(std::move(st));
}

Request MpiCommunicator::post_recv(const Tensor& t, int peer, int tag) {
  auto st = std::make_shared<MpiRequest>(MessageInfo{true, rank_, size_, peer, tag}, t);
  for_each_piece(t.data(), t.nbytes(), [&](char* p, int n) {
    MPI_Request r;
    const int rc = MPI_Irecv(p, n, MPI_BYTE, peer, tag, comm_, &r);
    if (rc != MPI_SUCCESS)
      check_mpi(rc, MessageInfo{true, rank_, size_, peer, tag}.where(), "MPI_Irecv");
    st->requests().push_back(r);
  });
  return Request(std::move(st));
}

// Every rank sends every peer what it is about to call (a few dozen bytes) and receives theirs:
// together a barrier, after which a mismatch is a clear error on every rank instead of a hang or
// a garbled result. Point-to-point rather than one all-gather, so that a wait that times out
// knows exactly which ranks have not arrived.
void MpiCommunicator::arrive(const CollectiveDesc& desc, int code, bool verify) {
  const bool collective = code < kBarrierCode;
  const std::string_view name =
      collective ? collective_name(desc.kind) : (code == kBarrierCode ? "barrier" : "split");
  const std::string where = fmt::format("{} on rank {} of {}", name, rank_, size_);
  detail::CallSignature mine;
  if (collective) mine = detail::signature_of(desc);
  sent_ = Wire{code,
               static_cast<int32_t>(mine.op),
               static_cast<int32_t>(mine.dtype),
               mine.root,
               static_cast<int32_t>(mine.algo),
               0,
               mine.n,
               mine.partition.outer,
               mine.partition.rows,
               mine.partition.inner,
               mine.chunk_bytes};
  std::vector<Wire> all(static_cast<size_t>(size_));
  all[static_cast<size_t>(rank_)] = sent_;
  // recvs[q]: from rank q (null for this rank); sends after them.
  std::vector<MPI_Request> reqs(2 * static_cast<size_t>(size_), MPI_REQUEST_NULL);
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    check_mpi(MPI_Irecv(&all[static_cast<size_t>(q)], sizeof(Wire), MPI_BYTE, q, 0, ctrl_,
                        &reqs[static_cast<size_t>(q)]),
              where, "MPI_Irecv");
    check_mpi(MPI_Isend(&sent_, sizeof(Wire), MPI_BYTE, q, 0, ctrl_,
                        &reqs[static_cast<size_t>(size_ + q)]),
              where, "MPI_Isend");
  }
  backoff_wait(
      [&] {
        int flag = 0;
        check_mpi(
            MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE),
            where, "MPI_Testall");
        return flag != 0;
      },
      [&](const detail::Deadline& d) {
        // Ask each receive on its own: those still open are the ranks that did not arrive. They
        // are cancelled (`all` is about to go); the sends read sent_, which stays.
        std::vector<int> late;
        for (int q = 0; q < size_; ++q) {
          MPI_Request& r = reqs[static_cast<size_t>(q)];
          int flag = 1;
          if (r != MPI_REQUEST_NULL) MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
          if (flag) continue;
          late.push_back(q);
          MPI_Cancel(&r);
          MPI_Request_free(&r);
        }
        for (int q = 0; q < size_; ++q) {
          MPI_Request& r = reqs[static_cast<size_t>(size_ + q)];
          if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
        }
        detail::timed_out(where, d, ranks_named(late) + " did not arrive");
      });
  if (!verify) return;
  auto signature = [&](const Wire& x) {
    detail::CallSignature s;
    if (x.code >= kBarrierCode) {
      s.name = x.code == kBarrierCode ? "barrier" : "split";
      s.collective = false;
      return s;
    }
    const auto kind = static_cast<CollectiveKind>(x.code);
    s.name = collective_name(kind);
    s.dtype = static_cast<DType>(x.dtype);
    s.n = x.n;
    s.partition = PartitionDesc{x.outer, x.rows, x.inner};
    s.chunk_bytes = x.chunk_bytes;
    s.op = static_cast<ReduceOp>(x.op);
    s.root = x.root;
    s.algo = static_cast<CollectiveAlgo>(x.algo);
    s.reducing = kind == CollectiveKind::AllReduce || kind == CollectiveKind::ReduceScatter;
    s.rooted = kind == CollectiveKind::Broadcast;
    return s;
  };
  const detail::CallSignature first = signature(all[0]);
  for (int q = 1; q < size_; ++q) detail::check_same_call(where, first, q, signature(all[q]));
}

size_t MpiCommunicator::ring_message_bytes(size_t chunk_bytes) const {
  return std::max(chunk_bytes, mpi_message_bytes());
}

void MpiCommunicator::execute(const CollectiveDesc& desc) {
  // Names the collective in the timeout message of a ring message that does not come.
  struct Named {
    explicit Named(std::string_view n) { t_collective = n; }
    ~Named() { t_collective = {}; }
  };
  if (direct_ != nullptr) {
    // One node: the posted calls in the slots are the arrival and the agreement check.
    direct_->run(desc, [&] {
      Named named(collective_name(desc.kind));
      execute_ring(desc);
    });
    return;
  }
  if (execute_hierarchical(desc)) return;
  if (env_verify()) arrive(desc, static_cast<int>(desc.kind), true);
  Named named(collective_name(desc.kind));
  execute_ring(desc);
}

std::optional<MpiJob> running_mpi_job() {
  int init = 0;
  MPI_Initialized(&init);
  if (!init || mpi_finalized()) return std::nullopt;
  MpiJob job;
  MPI_Comm_rank(MPI_COMM_WORLD, &job.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &job.size);
  if (job.size < 2) return std::nullopt;
  return job;
}

std::optional<MpiThreads> mpi_thread_level() {
  int init = 0;
  MPI_Initialized(&init);
  if (!init || mpi_finalized()) return std::nullopt;
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  if (level >= MPI_THREAD_MULTIPLE) return MpiThreads::Multiple;
  if (level >= MPI_THREAD_SERIALIZED) return MpiThreads::Serialized;
  if (level >= MPI_THREAD_FUNNELED) return MpiThreads::Funneled;
  return MpiThreads::Single;
}

MpiThreads mpi_threads_from_env() {
  const std::string v = env_str("TANDEM_MPI_THREADS", "multiple");
  if (v == "multiple") return MpiThreads::Multiple;
  if (v == "serialized") return MpiThreads::Serialized;
  user_error(
      "TANDEM_MPI_THREADS={}: give multiple (MPI_THREAD_MULTIPLE, the default: communication "
      "threads call MPI beside the caller) or serialized (MPI_THREAD_SERIALIZED: one thread at a "
      "time, the exchanges beside a communicating caller run on it instead)",
      v);
}

int mpi_thread_constant(MpiThreads level) {
  switch (level) {
    case MpiThreads::Single:
      return MPI_THREAD_SINGLE;
    case MpiThreads::Funneled:
      return MPI_THREAD_FUNNELED;
    case MpiThreads::Serialized:
      return MPI_THREAD_SERIALIZED;
    case MpiThreads::Multiple:
      return MPI_THREAD_MULTIPLE;
  }
  return MPI_THREAD_SINGLE;
}

bool communication_thread_allowed(const Communicator& comm, bool others_communicate) {
  if (comm.backend() != Backend::Mpi) return true;
  const auto level = mpi_thread_level();
  return level && *level >= (others_communicate ? MpiThreads::Multiple : MpiThreads::Serialized);
}

int launched_local_ranks() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"}) {
    const char* s = std::getenv(v);
    if (s != nullptr && std::atoi(s) > 0) return std::atoi(s);
  }
  return 1;
}

std::optional<MpiJob> launched_mpi_job() {
  for (const auto& [rank, size] : {std::pair{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                   std::pair{"PMI_RANK", "PMI_SIZE"}}) {
    const char* r = std::getenv(rank);
    const char* s = std::getenv(size);
    if (r == nullptr || s == nullptr) continue;
    MpiJob job{std::atoi(r), std::atoi(s)};
    if (job.size < 2 || job.rank < 0 || job.rank >= job.size) return std::nullopt;
    return job;
  }
  return std::nullopt;
}

void abort_mpi_job(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; should it, the process still ends
}

std::unique_ptr<Communicator> mpi_world() {
  if (mpi_finalized()) user_error("mpi_world: MPI has already been finalised");
  int init = 0;
  MPI_Initialized(&init);
  if (!init) {
    int provided = 0;
    check_mpi(
        MPI_Init_thread(nullptr, nullptr, mpi_thread_constant(mpi_threads_from_env()), &provided),
        "mpi_world", "MPI_Init_thread");
    g_initialized_by_tandem = true;
    std::atexit(finalize_at_exit);
  }
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
}

std::unique_ptr<Communicator> mpi_wrap(MPI_Comm comm) {
  int init = 0;
  MPI_Initialized(&init);
  if (!init || mpi_finalized())
    user_error(
        "mpi_wrap: MPI is not initialised; call MPI_Init before handing tandem a "
        "communicator, or use tandem::comm::mpi_world()");
  return std::make_unique<MpiCommunicator>(comm);
}

}  // namespace tandem::comm
