// The 1F1B pipeline schedule (PipeDream-Flush, as Megatron-LM runs it): stage s of P first runs
// min(P - s - 1, M) warm-up forwards, then alternates one forward and one backward, then drains
// the remaining backwards. At most P - s micro-batches are in flight on stage s, which bounds
// the activations it keeps.
#pragma once

#include <string>
#include <vector>

namespace tandem::parallel {

struct PipeOp {
  enum Kind { Forward, Backward } kind;
  int micro;
  bool operator==(const PipeOp&) const = default;
};

// The order stage `stage` of `stages` runs the forwards and backwards of `micro` micro-batches.
std::vector<PipeOp> one_f_one_b(int stages, int stage, int micro);

// How many micro-batches stage `stage` holds activations for at once: min(M, P - s).
int in_flight_limit(int stages, int stage, int micro);

// "F0 F1 B0 F2 B1 B2", for tests and TANDEM_DEBUG output.
std::string str(const std::vector<PipeOp>& ops);

}  // namespace tandem::parallel
