// Helpers shared by the nn test suites: deterministic inputs, a labelled closeness checker that
// prints the worst and first differing elements, and central finite differences in double.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "tandem/core/bf16.h"
#include "tandem/core/rng.h"
#include "tandem/nn/layers.h"

namespace tandem::nn::testing {

// bf16 scratch as the Workspace gives it.
struct Bf16Scratch {
  std::vector<bf16> rows, other;
  Bf16Scratch(int64_t r, int64_t o) : rows(static_cast<size_t>(r)), other(static_cast<size_t>(o)) {}
  MatmulPrecision bf16s() {
    return {DType::BF16, rows.data(), static_cast<int64_t>(rows.size()), other.data(),
            static_cast<int64_t>(other.size())};
  }
};

// Uniform in [lo, hi), from the counter-based RNG: the same inputs on every machine.
inline std::vector<double> uniform(size_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = lo + (hi - lo) * static_cast<double>(random_uniform(seed, i, 7));
  return v;
}

inline std::vector<float> to_f32(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}
inline std::vector<double> to_f64(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

inline double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// Checks |got - want| <= atol + rtol * scale elementwise, where scale is max|want| (errors in
// f32 kernels grow with the magnitude of the whole tensor, not of the element). On failure,
// reports the worst element and the first few that differ.
template <typename A, typename B>
::testing::AssertionResult all_close(const std::string& label, const std::vector<A>& got,
                                     const std::vector<B>& want, double rtol, double atol = 0.0) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure()
           << label << ": size " << got.size() << " but expected " << want.size();
  double scale = 0.0;
  for (const B& w : want) scale = std::max(scale, std::fabs(static_cast<double>(w)));
  const double tol = atol + rtol * scale;
  double worst = 0.0;
  size_t worst_i = 0, bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    const double d = std::fabs(g - w);
    if (!(d <= tol)) {  // also catches NaN
      if (bad < 5) first << "\n  [" << i << "] got " << g << " want " << w << " diff " << d;
      ++bad;
    }
    if (d > worst || std::isnan(d)) {
      worst = d;
      worst_i = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << label << ": " << bad << " of " << got.size() << " elements differ by more than " << tol
         << " (rtol " << rtol << " x max|want| " << scale << " + atol " << atol << "); worst diff "
         << worst << " at [" << worst_i << "]" << first.str();
}

// Central differences of a scalar function of `x` at the elements listed in `which` (all when
// empty), step h. In double with h = 1e-5 the truncation error is O(h^2 f''') ~ 1e-10 and the
// rounding error O(eps / h) ~ 1e-11, far below the f32 kernels' own errors.
inline std::vector<double> finite_difference(
    const std::function<double(const std::vector<double>&)>& f, std::vector<double> x,
    const std::vector<size_t>& which, double h = 1e-5) {
  std::vector<double> g(which.size());
  for (size_t k = 0; k < which.size(); ++k) {
    const size_t i = which[k];
    const double x0 = x[i];
    x[i] = x0 + h;
    const double up = f(x);
    x[i] = x0 - h;
    const double down = f(x);
    x[i] = x0;
    g[k] = (up - down) / (2.0 * h);
  }
  return g;
}

// Up to `count` indices spread evenly over [0, n) (all of them when n <= count).
inline std::vector<size_t> spread(size_t n, size_t count) {
  std::vector<size_t> idx;
  if (n <= count) {
    for (size_t i = 0; i < n; ++i) idx.push_back(i);
    return idx;
  }
  for (size_t k = 0; k < count; ++k)
    idx.push_back(k * n / count + (k * 7) % std::max<size_t>(1, n / count));
  return idx;
}

template <typename T>
std::vector<T> pick(const std::vector<T>& v, const std::vector<size_t>& idx) {
  std::vector<T> out;
  out.reserve(idx.size());
  for (size_t i : idx) out.push_back(v[i]);
  return out;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace tandem::nn::testing
