// The hierarchical collectives (NCCL's two-level scheme): for a group whose ranks sit on N nodes
// of L ranks each, rank r = node j * L + local index l, a reduction first runs inside each node
// (reduce-scatter over shared memory: the Direct algorithm), then across nodes on N rings, one per
// local index, each carrying 1/L of the data (the ring over point-to-point messages), then the
// node gathers again. Written once against the Communicator interface, so it runs on any backend;
// reached through Communicator::execute_hierarchical. Internal to comm/.
//
// Layout: the call's partition (parts.h) fixes rank r's part of the whole buffer: `outer` runs
// of part_count(rows, p, r) * inner elements. Stage 0 packs every rank's part into a staging
// buffer in local-major order (the parts of local index 0 on nodes 0..N-1, then those of local
// index 1, ...). Since part_count(rows, L, l) rows split over N are exactly the rows of ranks
// (0, l) .. (N-1, l), local rank l's part of the node-level partition [1, rows, outer * inner]
// of that buffer is the concatenation of the packed parts of ranks (0, l), ..., (N-1, l), and
// the cross ring's partition [1, part_count(rows, L, l), outer * inner] of it gives rank (j, l)
// exactly its own packed part: so the cross ring ends with each rank holding its part, fully
// reduced, and runs the hook on it chunk by chunk (positions translated back to the whole
// buffer, chunks cut where a run ends). all_reduce and all_gather unpack at the end; broadcast
// needs no packing. For the flat split (one run per part) this is a permutation of contiguous
// parts.
//
// Rounding: each element is reduced inside its node first (in rank order), then across nodes
// in ring order; bf16/f16 are rounded after each stage, so results may differ in the last bit
// from the flat algorithms (the same from run to run).
#pragma once

#include <memory>
#include <vector>

#include "parts.h"
#include "tandem/comm/communicator.h"

namespace tandem::comm::detail {

class Hierarchical {
 public:
  // The ranks per node when `nodes` (the node of each rank) has two or more nodes of equal size
  // greater than one, each node's ranks consecutive; 0 otherwise (the flat algorithms run).
  static int ranks_per_node(const std::vector<int>& nodes);

  Hierarchical(Communicator& comm, int local_size) : comm_(comm), L_(local_size) {}
  Hierarchical(const Hierarchical&) = delete;
  Hierarchical& operator=(const Hierarchical&) = delete;

  // Runs a validated collective on the group.
  void run(const CollectiveDesc& desc);

 private:
  void set_up();  // the node and cross-node groups, split on first use (every rank calls run)
  // Where rank r's packed part starts in the local-major buffer.
  int64_t local_major_offset(const Parts& parts, int r) const;
  // Copies every rank's part of `natural` (the whole buffer) to its place in `local_major`, or
  // back.
  void permute(const Parts& parts, const Tensor& natural, const Tensor& local_major,
               bool to_local_major) const;
  Tensor staging(DType t, int64_t n);  // the local-major buffer, kept and grown
  // The hook of the cross ring: positions in this rank's packed part translated to the whole
  // buffer, a chunk cut where a run of the part ends.
  ChunkHook cross_hook(const ChunkHook& hook, const Parts& parts) const;

  Communicator& comm_;
  const int L_;
  int N_ = 0, j_ = 0, l_ = 0;
  std::unique_ptr<Communicator> local_, cross_;
  Tensor stage_;
};

}  // namespace tandem::comm::detail
