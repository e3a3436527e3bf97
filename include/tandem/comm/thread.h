// The thread backend: ranks are threads of this process sharing memory, started by run_ranks().
//
// Collectives read peers' buffers directly (the Direct algorithm): for reduce_scatter and
// all_reduce, rank r reduces its part by reading every peer's input, runs the hook chunk by chunk
// while the chunk is in cache, and publishes it; peers copy each published chunk into their own
// buffer (all_gather) soon after, often from the shared cache. Nothing is copied through queues.
// Point-to-point is a rendezvous: whichever side arrives second copies the bytes straight from the
// sender's tensor into the receiver's.
//
// Waiting ranks spin briefly, then yield and sleep on a futex, so four ranks on two cores do not
// steal the cores from the ranks they wait for.
//
// Failure: a rank whose function throws (or whose hook throws inside a collective) aborts the
// group; every rank waiting in a collective or on a request wakes and throws, and run_ranks
// rethrows the first failure, its message naming the rank. A rank that returns while its peers
// wait for it in a collective or a receive makes them fail too, instead of waiting forever. A
// rank that waits longer than the collective timeout (comm_timeout_s) fails, naming the ranks
// that did not arrive, and so aborts the group.
#pragma once

#include <functional>

#include "tandem/comm/communicator.h"

namespace tandem::comm {

// The most ranks run_ranks starts. Each rank is a thread holding its own copy of the buffers it
// works on, and the Direct collectives have every rank read every peer's buffer (n^2 reads a
// step): past a few hundred ranks on one machine a run only oversubscribes its cores and runs out
// of memory, so larger counts are refused at once (MPI runs take any count).
inline constexpr int kMaxThreadRanks = 256;

// Runs fn(comm) on n threads, one per rank of a new group of n ranks (the caller only waits), and
// returns when all have returned. If any rank threw, rethrows the first failure: a tandem
// UserError or InternalError whose message names the rank is rethrown as is (a CollectiveError,
// which every rank raised, always); any other std::exception becomes an exception of the same
// family (UserError, InternalError, else std::runtime_error) prefixed with "rank R of N: ".
// n < 1 and n > kMaxThreadRanks are UserErrors. After a failure, a rank that has not returned
// within comm_timeout_s() (10 s at most when the failure was a timeout, which already showed a rank
// stuck), stuck outside any communication call, is left running, detached, so that the failure is
// reported; `fn` is copied for it, but what `fn` refers to must then outlive it (the tandem command
// exits at once).
void run_ranks(int n, const std::function<void(Communicator&)>& fn);

}  // namespace tandem::comm
