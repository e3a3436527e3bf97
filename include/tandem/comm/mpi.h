// The MPI backend: ranks are MPI processes (OpenMPI, one machine or many). It moves bytes with
// MPI_Isend/MPI_Irecv and runs every collective with tandem's own algorithms (not MPI's, which
// bench/collectives measures it against):
// - ranks all on one node (MPI_COMM_TYPE_SHARED): the Direct algorithms, as on threads, each rank
//   reading its peers' buffers where they lie; buffers must come from allocator(), the process's
//   shared arena, which the node's processes map (a call with a buffer from elsewhere takes the
//   ring, the same on every rank);
// - ranks on two or more nodes of equal size, each node's ranks consecutive: the hierarchical
//   algorithms (inside the node Direct, across nodes one ring per local rank);
// - otherwise the ring over point-to-point.
// TANDEM_RANKS_PER_NODE=k groups world ranks into nodes of k (for tests on one machine).
//
// Two ways in: mpi_world() initialises MPI itself when nobody has (and then finalises it at exit),
// and mpi_wrap() uses a communicator the caller owns (tandem neither frees it nor finalises MPI).
// Either way tandem works on a duplicate of the communicator, so its messages never match the
// caller's, and errors come back as exceptions rather than aborting the job.
//
// Waiting polls MPI_Test and backs off to sched_yield and short sleeps, so ranks that outnumber
// cores do not burn the cores their peers need.
//
// Arrival: before a collective (unless TANDEM_COMM_VERIFY=0), and in every barrier and split,
// each rank sends every peer a few bytes saying what it is about to call, on a second private
// duplicate of the communicator, and waits to hear from all of them. That is how mismatched calls
// are caught, and how a wait that passes the collective timeout (comm_timeout_s) names the ranks
// that did not arrive. Without it, a timeout names the peer whose message did not come.
//
// Failure: an exception ends only the rank that throws it. A process that then exits through
// MPI_Finalize blocks there while its peers wait for it, so a failing rank must end the job:
// abort_mpi_job (the tandem command does this for every error).
#pragma once

// The C API only: OpenMPI's and MPICH's deprecated C++ bindings would need their own library.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

#include "tandem/comm/communicator.h"

namespace tandem::comm {

namespace detail {
class PeerMemory;
class Direct;
}  // namespace detail

class MpiCommunicator final : public Communicator {
 public:
  // Works on a duplicate of `comm` (freed by the destructor; `comm` itself is left alone).
  explicit MpiCommunicator(MPI_Comm comm);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Backend backend() const override { return Backend::Mpi; }
  Allocator& allocator() const override;
  bool shares_memory() const override { return direct_ != nullptr; }
  void barrier() override;
  std::unique_ptr<Communicator> split(int color, int key) override;

  // The duplicate tandem communicates on.
  MPI_Comm mpi_comm() const { return comm_; }

 protected:
  Request post_send(const Tensor& t, int peer, int tag) override;
  Request post_recv(const Tensor& t, int peer, int tag) override;
  void execute(const CollectiveDesc& desc) override;
  size_t ring_message_bytes(size_t chunk_bytes) const override;

 private:
  struct Adopt {};
  MpiCommunicator(MPI_Comm owned, Adopt);  // takes ownership of `owned` without duplicating
  void set_up();                           // ctrl_, rank_, size_, world_ranks_ from comm_
  void set_up_node();  // rank_nodes, and the shared memory of a group on one node
  // Tells every peer what this rank calls (code: a CollectiveKind, or kBarrier, kSplit) and waits
  // until every peer has said what it calls; then, when `verify`, checks they all agree.
  void arrive(const CollectiveDesc& desc, int code, bool verify);
  // "rank 2", or in a group split from the world "rank 1 (world rank 3)".
  std::string ranks_named(const std::vector<int>& group_ranks) const;

  MPI_Comm comm_ = MPI_COMM_NULL;  // the ranks' messages
  MPI_Comm ctrl_ = MPI_COMM_NULL;  // arrival messages, apart so that they never match the ring's
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> world_ranks_;  // group rank -> rank in MPI_COMM_WORLD
  struct Wire {
    int32_t code, op, dtype, root, algo, pad;
    int64_t n;
    int64_t outer, rows, inner;  // the resolved partition
    uint64_t chunk_bytes;        // the resolved chunk size
  };
  Wire sent_{};  // what this rank last said it calls; a send left behind by a timeout reads it
  // A group on one node: the peers' arenas and slots (node_), and the Direct algorithms on them.
  std::unique_ptr<detail::PeerMemory> node_;
  std::unique_ptr<detail::Direct> direct_;
};

// MPI_COMM_WORLD, initialising MPI if it is not initialised yet (at mpi_threads_from_env()'s
// level, MPI_THREAD_MULTIPLE by default: the trainer's communication thread calls MPI while the
// backward may call it too); MPI is then finalised at exit. A process launched without mpirun is
// a world of one rank.
std::unique_ptr<Communicator> mpi_world();

// The caller's communicator (duplicated; the caller keeps ownership and finalises MPI itself).
// MPI must be initialised: calling this before MPI_Init is a UserError.
std::unique_ptr<Communicator> mpi_wrap(MPI_Comm comm);

// Whether this process was started by mpirun/mpiexec (OpenMPI, MPICH or a PMI launcher).
bool launched_by_mpirun();

// The thread support MPI was initialised with (MPI_Query_thread), in increasing order; nothing
// while MPI is not initialised or already finalised. Only comm/ asks MPI: the modules above ask
// here.
enum class MpiThreads { Single, Funneled, Serialized, Multiple };
std::optional<MpiThreads> mpi_thread_level();

// The thread support mpi_world() asks MPI_Init_thread for: TANDEM_MPI_THREADS, `multiple` (the
// default) or `serialized` (one thread at a time calls MPI: the exchanges that would run on a
// thread beside a caller that communicates too run on the caller instead; to test that fallback,
// and for an MPI that is slower with threads). Anything else is a UserError naming the variable
// and the choices.
MpiThreads mpi_threads_from_env();
// MPI's constant for a level (MPI_THREAD_MULTIPLE, ...), for a caller's own MPI_Init_thread.
int mpi_thread_constant(MpiThreads level);

// Whether a communication thread of this process (a core::SerialWorker running a rank's
// exchanges) may call `comm` while the thread that started it goes on: the one check every
// module asks. In-process ranks: always. MPI: with MPI_THREAD_MULTIPLE; with
// MPI_THREAD_SERIALIZED only where `others_communicate` is false, that is no other thread of the
// process calls MPI while the communication thread does (the caller computes until it waits for
// the thread). MPI_THREAD_FUNNELED allows MPI calls from the main thread only, so neither it nor
// MPI_THREAD_SINGLE allows one; nor does an MPI not initialised.
bool communication_thread_allowed(const Communicator& comm, bool others_communicate);

// The number of this job's processes on this machine, as the launcher says
// (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS, PMI_LOCAL_SIZE); 1 outside a launched job.
int launched_local_ranks();

// This process's place in a running MPI job of two or more processes (MPI initialised and not
// finalised, MPI_COMM_WORLD larger than one); nothing otherwise.
struct MpiJob {
  int rank = 0, size = 1;
};
std::optional<MpiJob> running_mpi_job();
// This process's place in the job a launcher started (OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/SIZE),
// read from the environment, MPI initialised or not; nothing outside a job of two or more.
std::optional<MpiJob> launched_mpi_job();

// Ends every process of the job: MPI_Abort(MPI_COMM_WORLD, code). For a rank that failed alone,
// after it has printed why: exiting instead would hang in MPI_Finalize, its peers waiting for it.
[[noreturn]] void abort_mpi_job(int code);

// The ring's message size on MPI: max(the call's chunk size, this), default 4 MiB
// (TANDEM_COMM_MPI_MESSAGE_BYTES). Fewer, larger messages mean fewer handshakes and fewer
// blocking hand-offs between ranks, which matters most when the machine is busy. The hook still
// runs on pieces of the call's chunk size (CollectiveDesc::chunk_bytes, else chunk_bytes()).
// Tests set 1 so that the ring's messages are one chunk long.
inline constexpr size_t kDefaultMpiMessageBytes = size_t{4} << 20;
size_t mpi_message_bytes();
void set_mpi_message_bytes(size_t bytes);  // 0: back to the default

// Messages larger than this many bytes are sent as several MPI messages (MPI counts are int).
// Default: 1 GiB. Tests lower it so that the split path runs on small tensors.
size_t mpi_max_message_bytes();
void set_mpi_max_message_bytes(size_t bytes);

}  // namespace tandem::comm
