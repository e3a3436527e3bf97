// The hierarchical collectives: inside the node, across nodes, inside the node (see
// hierarchical.h).
#include "hierarchical.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "tandem/core/error.h"

namespace tandem::comm::detail {

int Hierarchical::ranks_per_node(const std::vector<int>& nodes) {
  const int p = static_cast<int>(nodes.size());
  int L = 0;
  while (L < p && nodes[L] == nodes[0]) ++L;
  if (L < 2 || L == p || p % L != 0) return 0;
  for (int r = 0; r < p; ++r) {
    if (nodes[r] != nodes[r - r % L]) return 0;                     // a node's ranks consecutive
    if (r % L == 0 && r > 0 && nodes[r] == nodes[r - L]) return 0;  // a new node at each block
  }
  // No node may appear in two blocks.
  for (int a = 0; a < p; a += L)
    for (int b = a + L; b < p; b += L)
      if (nodes[a] == nodes[b]) return 0;
  return L;
}

void Hierarchical::set_up() {
  if (local_ != nullptr) return;
  const int r = comm_.rank();
  N_ = comm_.size() / L_;
  j_ = r / L_;
  l_ = r % L_;
  local_ = comm_.split(j_, l_);
  cross_ = comm_.split(l_, j_);
  TANDEM_CHECK(
      local_ != nullptr && cross_ != nullptr && local_->size() == L_ && cross_->size() == N_,
      "hierarchical groups of rank {}: node group {}, cross group {}", r, local_->size(),
      cross_->size());
}

Tensor Hierarchical::staging(DType t, int64_t n) {
  const int64_t words = (n * static_cast<int64_t>(dtype_size(t)) + 3) / 4;
  if (!stage_.defined() || stage_.numel() < words)
    stage_ = Tensor::empty(DType::F32, Shape{std::max<int64_t>(1, words)}, comm_.allocator());
  return Tensor::view_of(stage_.data(), t, Shape{n});
}

int64_t Hierarchical::local_major_offset(const Parts& parts, int r) const {
  const int j = r / L_, l = r % L_;
  const int64_t block = parts.outer() * parts.inner();  // elements per row of the partition
  return block * (fx::part_offset(parts.rows(), L_, l) +
                  fx::part_offset(fx::part_count(parts.rows(), L_, l), N_, j));
}

void Hierarchical::permute(const Parts& parts, const Tensor& natural, const Tensor& local_major,
                           bool to_local_major) const {
  const size_t esize = dtype_size(natural.dtype());
  auto* lm = static_cast<char*>(local_major.data());
  for (int r = 0; r < comm_.size(); ++r) {
    char* packed = lm + local_major_offset(parts, r) * static_cast<int64_t>(esize);
    if (to_local_major) {
      parts.pack(r, natural.data(), packed, esize);
    } else {
      parts.unpack(r, packed, natural.data(), esize);
    }
  }
}

ChunkHook Hierarchical::cross_hook(const ChunkHook& hook, const Parts& parts) const {
  if (!hook) return {};
  const int r = comm_.rank();
  // The cross ring's offsets index the node part; this rank's packed part starts at `first`.
  const int64_t first = local_major_offset(parts, r) -
                        parts.outer() * parts.inner() * fx::part_offset(parts.rows(), L_, l_);
  const int64_t run = parts.run(r);
  return [&hook, parts, first, run, r](const Tensor& chunk, int64_t offset) {
    int64_t k = offset - first;  // position in the packed part
    for (int64_t done = 0; done < chunk.numel();) {
      const int64_t o = k / run, in_run = k - o * run;
      const int64_t n = std::min(chunk.numel() - done, run - in_run);
      hook(n == chunk.numel() ? chunk : chunk.flat_slice(done, n), parts.run_start(r, o) + in_run);
      done += n;
      k += n;
    }
  };
}

void Hierarchical::run(const CollectiveDesc& d) {
  set_up();
  // The cross-node step always takes the ring: on MPI that is point-to-point between nodes; on
  // threads (grouping forced for tests) it is the same algorithm.
  // Both steps run at the call's chunk size: the cross ring's hook chunks are no longer than it.
  auto cross = [&](CollectiveDesc c) {
    c.algo = CollectiveAlgo::Ring;
    c.chunk_bytes = d.chunk_bytes;
    cross_->run(std::move(c));
  };
  auto local = [&](CollectiveDesc c) {
    c.algo = CollectiveAlgo::Auto;
    c.chunk_bytes = d.chunk_bytes;
    local_->run(std::move(c));
  };
  const DType t = d.send.dtype();
  const size_t esize = dtype_size(t);
  if (d.kind == CollectiveKind::Broadcast) {
    const int jr = d.root / L_, lr = d.root % L_;
    if (l_ == lr) cross({CollectiveKind::Broadcast, d.op, d.send, {}, jr});
    local({CollectiveKind::Broadcast, d.op, d.send, {}, lr});
    return;
  }
  const Parts parts = parts_of(d, comm_.size());
  const int r = comm_.rank();
  const int64_t n = parts.numel(), block = parts.outer() * parts.inner();
  const int64_t m_rows = fx::part_count(parts.rows(), L_, l_);
  // The node-level and cross-node partitions of the local-major buffer (see hierarchical.h).
  const PartitionDesc node_split{1, parts.rows(), block}, cross_split{1, m_rows, block};
  const Tensor P = staging(t, n);
  const Tensor part = P.flat_slice(block * fx::part_offset(parts.rows(), L_, l_), block * m_rows);
  const Tensor mine =
      P.flat_slice(local_major_offset(parts, r), parts.count(r));  // in local-major order
  auto with = [](CollectiveDesc c, const PartitionDesc& split) {
    c.partition = split;
    return c;
  };
  switch (d.kind) {
    case CollectiveKind::AllReduce: {
      permute(parts, d.send, P, true);
      local(with({CollectiveKind::ReduceScatter, d.op, P, part}, node_split));
      cross(with({CollectiveKind::AllReduce, d.op, part, {}, 0, cross_hook(d.hook, parts)},
                 cross_split));
      local(with({CollectiveKind::AllGather, d.op, part, P}, node_split));
      permute(parts, d.send, P, false);
      break;
    }
    case CollectiveKind::ReduceScatter: {
      permute(parts, d.send, P, true);
      local(with({CollectiveKind::ReduceScatter, d.op, P, part}, node_split));
      // A packed output takes the cross ring's result directly; one shaped as the whole gets it
      // through the staging buffer (the part in place there, then unpacked).
      const bool whole = recv_is_whole(d);
      cross(with({CollectiveKind::ReduceScatter, d.op, part, whole ? mine : d.recv, 0,
                  cross_hook(d.hook, parts)},
                 cross_split));
      if (whole) parts.unpack(r, mine.data(), d.recv.data(), esize);
      break;
    }
    case CollectiveKind::AllGather: {
      // An input that is the output itself is packed into its place in the staging buffer first.
      const bool whole = send_is_whole(d);
      if (whole) parts.pack(r, d.send.data(), mine.data(), esize);
      cross(with({CollectiveKind::AllGather, d.op, whole ? mine : d.send, part}, cross_split));
      local(with({CollectiveKind::AllGather, d.op, part, P}, node_split));
      permute(parts, d.recv, P, false);
      break;
    }
    case CollectiveKind::Broadcast:
      break;
    case CollectiveKind::Shift:  // never here: execute_hierarchical leaves it to the ring
      internal_error("a shift in the hierarchical algorithms");
  }
}

}  // namespace tandem::comm::detail
