// The hierarchical collectives: inside the node, across nodes, inside the node (see
// hierarchical.h).
#include "hierarchical.h"

#include <algorithm>
#include <cstring>

#include "tandem/core/error.h"

namespace tandem::comm::detail {

int Hierarchical::ranks_per_node(const std::vector<int>& nodes) {
  const int p = static_cast<int>(nodes.size());
  int L = 0;
  while (L < p && nodes[L] == nodes[0]) ++L;
  if (L < 2 || L == p || p % L != 0) return 0;
  for (int r = 0; r < p; ++r) {
    if (nodes[r] != nodes[r - r % L]) return 0;                    // a node's ranks consecutive
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
  TANDEM_CHECK(local_ != nullptr && cross_ != nullptr && local_->size() == L_ &&
                   cross_->size() == N_,
               "hierarchical groups of rank {}: node group {}, cross group {}", r, local_->size(),
               cross_->size());
}

Tensor Hierarchical::staging(DType t, int64_t n) {
  const int64_t words = (n * static_cast<int64_t>(dtype_size(t)) + 3) / 4;
  if (!stage_.defined() || stage_.numel() < words)
    stage_ = Tensor::empty(DType::F32, Shape{std::max<int64_t>(1, words)}, comm_.allocator());
  return Tensor::view_of(stage_.data(), t, Shape{n});
}

void Hierarchical::permute(const Tensor& natural, const Tensor& local_major,
                           bool to_local_major) const {
  const int64_t n = natural.numel();
  const int p = comm_.size();
  const size_t esize = dtype_size(natural.dtype());
  auto* nat = static_cast<char*>(natural.data());
  auto* lm = static_cast<char*>(local_major.data());
  for (int r = 0; r < p; ++r) {
    const int j = r / L_, l = r % L_;
    const int64_t m = Partition::count(n, L_, l);
    const int64_t from = Partition::offset(n, p, r);
    const int64_t to = Partition::offset(n, L_, l) + Partition::offset(m, N_, j);
    const size_t bytes = static_cast<size_t>(Partition::count(n, p, r)) * esize;
    if (bytes == 0) continue;
    if (to_local_major) {
      std::memcpy(lm + to * esize, nat + from * esize, bytes);
    } else {
      std::memcpy(nat + from * esize, lm + to * esize, bytes);
    }
  }
}

ChunkHook Hierarchical::cross_hook(const ChunkHook& hook, int64_t n) const {
  if (!hook) return {};
  const int64_t m = Partition::count(n, L_, l_);
  const int64_t shift = Partition::offset(n, comm_.size(), comm_.rank()) - Partition::offset(m, N_, j_);
  return [&hook, shift](const Tensor& chunk, int64_t offset) { hook(chunk, offset + shift); };
}

void Hierarchical::run(const CollectiveDesc& d) {
  set_up();
  // The cross-node step always takes the ring: on MPI that is point-to-point between nodes; on
  // threads (grouping forced for tests) it is the same algorithm.
  auto cross = [&](CollectiveDesc c) {
    c.algo = CollectiveAlgo::Ring;
    cross_->run(c);
  };
  auto local = [&](CollectiveDesc c) {
    c.algo = CollectiveAlgo::Auto;
    local_->run(c);
  };
  const DType t = d.send.dtype();
  switch (d.kind) {
    case CollectiveKind::AllReduce: {
      const int64_t n = d.send.numel();
      const Tensor P = staging(t, n);
      const Tensor part = P.flat_slice(Partition::offset(n, L_, l_), Partition::count(n, L_, l_));
      permute(d.send, P, true);
      local({CollectiveKind::ReduceScatter, d.op, P, part});
      cross({CollectiveKind::AllReduce, d.op, part, {}, 0, cross_hook(d.hook, n)});
      local({CollectiveKind::AllGather, d.op, part, P});
      permute(d.send, P, false);
      break;
    }
    case CollectiveKind::ReduceScatter: {
      const int64_t n = d.send.numel();
      const Tensor P = staging(t, n);
      const Tensor part = P.flat_slice(Partition::offset(n, L_, l_), Partition::count(n, L_, l_));
      permute(d.send, P, true);
      local({CollectiveKind::ReduceScatter, d.op, P, part});
      cross({CollectiveKind::ReduceScatter, d.op, part, d.recv, 0, cross_hook(d.hook, n)});
      break;
    }
    case CollectiveKind::AllGather: {
      const int64_t n = d.recv.numel();
      const Tensor P = staging(t, n);
      const Tensor part = P.flat_slice(Partition::offset(n, L_, l_), Partition::count(n, L_, l_));
      cross({CollectiveKind::AllGather, d.op, d.send, part});
      local({CollectiveKind::AllGather, d.op, part, P});
      permute(d.recv, P, false);
      break;
    }
    case CollectiveKind::Broadcast: {
      const int jr = d.root / L_, lr = d.root % L_;
      if (l_ == lr) cross({CollectiveKind::Broadcast, d.op, d.send, {}, jr});
      local({CollectiveKind::Broadcast, d.op, d.send, {}, lr});
      break;
    }
  }
}

}  // namespace tandem::comm::detail
