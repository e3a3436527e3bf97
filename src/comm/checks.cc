// The cross-rank agreement check and its messages, the same on every backend.
#include "checks.h"

#include "parts.h"
#include "tandem/core/error.h"

namespace tandem::comm::detail {

CallSignature signature_of(const CollectiveDesc& d) {
  CallSignature s;
  s.name = collective_name(d.kind);
  s.dtype = d.send.dtype();
  s.n = d.kind == CollectiveKind::AllGather ? d.recv.numel() : d.send.numel();
  if (d.kind != CollectiveKind::Broadcast) {
    const Parts parts(d.partition, s.n, 1);
    s.partition = PartitionDesc{parts.outer(), parts.rows(), parts.inner()};
  }
  s.chunk_bytes = d.chunk_bytes;
  s.op = d.op;
  s.root = d.root;
  s.algo = d.algo;
  s.reducing = d.kind == CollectiveKind::AllReduce || d.kind == CollectiveKind::ReduceScatter;
  s.rooted = d.kind == CollectiveKind::Broadcast;
  return s;
}

void check_same_call(std::string_view where, const CallSignature& first, int q,
                     const CallSignature& other) {
  if (other.name != first.name)
    user_error("{}: the ranks made different calls: rank 0 called {} but rank {} called {}", where,
               first.name, q, other.name);
  if (!first.collective) return;
  if (other.dtype != first.dtype)
    user_error("{}: dtype mismatch across ranks: rank 0 passed {}, rank {} passed {}", where,
               dtype_name(first.dtype), q, dtype_name(other.dtype));
  if (other.n != first.n)
    user_error(
        "{}: size mismatch across ranks: rank 0 passed {} elements, rank {} passed {}; "
        "every rank must pass the same size",
        where, first.n, q, other.n);
  if (other.partition != first.partition)
    user_error(
        "{}: partition mismatch across ranks: rank 0 passed [outer {}, rows {}, inner {}], rank {} "
        "passed "
        "[outer {}, rows {}, inner {}]",
        where, first.partition.outer, first.partition.rows, first.partition.inner, q,
        other.partition.outer, other.partition.rows, other.partition.inner);
  if (other.chunk_bytes != first.chunk_bytes)
    user_error(
        "{}: chunk size mismatch across ranks: rank 0 passed {} bytes, rank {} passed {} bytes; "
        "every rank "
        "must run the call at the same chunk size (CollectiveDesc::chunk_bytes; 0 takes the "
        "process's "
        "comm::chunk_bytes())",
        where, first.chunk_bytes, q, other.chunk_bytes);
  if (first.reducing && other.op != first.op)
    user_error("{}: reduce op mismatch across ranks: rank 0 passed {}, rank {} passed {}", where,
               reduce_op_name(first.op), q, reduce_op_name(other.op));
  if (first.rooted && other.root != first.root)
    user_error("{}: root mismatch across ranks: rank 0 passed root {}, rank {} passed root {}",
               where, first.root, q, other.root);
  if (other.algo != first.algo)
    user_error("{}: algorithm mismatch across ranks: rank 0 asked for {}, rank {} for {}", where,
               collective_algo_name(first.algo), q, collective_algo_name(other.algo));
}

}  // namespace tandem::comm::detail
