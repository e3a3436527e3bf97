// Model-state I/O as time, and the resident-block choice: three binary searches over a
// nondecreasing and a nonincreasing prediction.
#include "tandem/perf/streamed_state.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace tandem::perf {

double store_io_s(const parallel::BlockStore::Traffic& t, const ooc::TierBandwidth& bw) {
  return static_cast<double>(t.read_bytes) / bw.read_bytes_per_s +
         static_cast<double>(t.written_bytes) / bw.write_bytes_per_s;
}

double state_io_s(double store_io_s, uint64_t swapped_bytes, const ooc::TierBandwidth& bw,
                  bool swaps_share_the_tier) {
  if (!swaps_share_the_tier) return store_io_s;
  const double swapped = static_cast<double>(swapped_bytes);
  return store_io_s + swapped / bw.write_bytes_per_s + swapped / bw.read_bytes_per_s;
}

int fastest_resident_blocks(int n, const std::function<double(int)>& compute_s,
                            const std::function<double(int)>& io_s) {
  std::vector<double> compute(static_cast<size_t>(n) + 1, -1.0);  // each asked once
  auto compute_at = [&](int r) {
    double& c = compute[static_cast<size_t>(r)];
    if (c < 0) c = compute_s(r);
    return c;
  };
  auto step_s = [&](int r) { return std::max(compute_at(r), io_s(r)); };
  int lo = 0, hi = n;
  while (lo < hi) {  // the most that fit
    const int mid = (lo + hi + 1) / 2;
    if (std::isfinite(compute_at(mid)))
      lo = mid;
    else
      hi = mid - 1;
  }
  const int fits = lo;
  lo = 0;
  hi = fits;
  while (lo < hi) {  // the first count where compute covers the I/O
    const int mid = (lo + hi) / 2;
    if (compute_at(mid) >= io_s(mid))
      hi = mid;
    else
      lo = mid + 1;
  }
  const int best = lo > 0 && step_s(lo - 1) < step_s(lo) ? lo - 1 : lo;
  lo = best;
  hi = fits;
  while (lo < hi) {  // past it the step only grows: the last count still as short
    const int mid = (lo + hi + 1) / 2;
    if (step_s(mid) <= step_s(best))
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

}  // namespace tandem::perf
