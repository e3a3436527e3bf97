// The 1F1B schedule of one pipeline stage.
#include "tandem/parallel/pipeline.h"

#include <algorithm>

#include "tandem/core/error.h"

namespace tandem::parallel {

std::vector<PipeOp> one_f_one_b(int stages, int stage, int micro) {
  TANDEM_CHECK(stages >= 1 && stage >= 0 && stage < stages && micro >= 1,
               "1F1B of stage {} of {}, {} micro", stage, stages, micro);
  const int warmup = std::min(stages - stage - 1, micro);
  std::vector<PipeOp> ops;
  ops.reserve(2 * static_cast<size_t>(micro));
  int f = 0, b = 0;
  for (; f < warmup; ++f) ops.push_back({PipeOp::Forward, f});
  while (f < micro) {  // steady state: one forward, one backward
    ops.push_back({PipeOp::Forward, f++});
    ops.push_back({PipeOp::Backward, b++});
  }
  while (b < micro) ops.push_back({PipeOp::Backward, b++});  // cool-down
  return ops;
}

int in_flight_limit(int stages, int stage, int micro) { return std::min(micro, stages - stage); }

std::string str(const std::vector<PipeOp>& ops) {
  std::string out;
  for (const PipeOp& op : ops) {
    if (!out.empty()) out += ' ';
    out += (op.kind == PipeOp::Forward ? 'F' : 'B') + std::to_string(op.micro);
  }
  return out;
}

}  // namespace tandem::parallel
