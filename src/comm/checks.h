// Cross-rank agreement checks shared by the backends: every rank of a group must make the same
// call with the same dtype, size, partition, chunk size, op, root and algorithm. Internal to comm/.
#pragma once

#include <cstdint>
#include <string_view>

#include "tandem/comm/communicator.h"

namespace tandem::comm::detail {

// What a rank called, as far as its peers must agree with it.
struct CallSignature {
  std::string_view name;   // "all_reduce", ..., "barrier", "split"
  bool collective = true;  // false for barrier and split: only the name must agree
  DType dtype = DType::F32;
  int64_t n = 0;              // elements of the whole buffer
  PartitionDesc partition{};  // resolved: rows never -1
  uint64_t chunk_bytes = 0;   // resolved (CollectiveDesc::chunk_bytes after run()): never 0
  ReduceOp op = ReduceOp::Sum;
  int root = 0;
  CollectiveAlgo algo = CollectiveAlgo::Auto;
  bool reducing = false;  // all_reduce, reduce_scatter: op must agree
  bool rooted = false;    // broadcast: root must agree
};

CallSignature signature_of(const CollectiveDesc& d);

// Throws a UserError naming both ranks and both values when rank q's call differs from rank 0's.
// `where` is "<call> on rank <r> of <p>", the rank reporting it.
void check_same_call(std::string_view where, const CallSignature& first, int q,
                     const CallSignature& other);

}  // namespace tandem::comm::detail
