// The BLAS door: correct results for every transpose combination, and the fast kernels chosen by
// default on AVX-512 CPUs (the generic ones are 4-6x slower there); calling-thread-only scopes.
#include "tandem/core/blas.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

namespace tandem {
namespace {

TEST(Blas, AvoidsGenericKernelsOnCapableCpus) {
  if (blas::preferred_kernels() == nullptr) GTEST_SKIP() << "no AVX2: the library's choice stands";
  const std::string user = blas::user_kernels();
  // A user who names generic kernels gets them; any other choice must not end in generic ones.
  if (blas::is_generic_kernel(user))
    GTEST_SKIP() << "OPENBLAS_CORETYPE=" << user << " asks for them";
  EXPECT_FALSE(blas::using_generic_kernels_on_capable_cpu())
      << "OpenBLAS chose " << blas::kernel_name() << " from " << blas::library_path()
      << (user.empty() ? "" : " with OPENBLAS_CORETYPE=" + user);
  // Where tandem chose, it chose the best family this CPU runs.
  if (user.empty() && blas::cpu_has_avx512()) {
    EXPECT_EQ(blas::kernel_name(), "SkylakeX");
  }
}

TEST(Blas, GenericKernelNamesAreRecognisedInAnyCase) {
  EXPECT_TRUE(blas::is_generic_kernel("Prescott"));
  EXPECT_TRUE(blas::is_generic_kernel("prescott"));
  EXPECT_TRUE(blas::is_generic_kernel("NEHALEM"));
  EXPECT_FALSE(blas::is_generic_kernel("Haswell"));
  EXPECT_FALSE(blas::is_generic_kernel("SkylakeX"));
  EXPECT_FALSE(blas::is_generic_kernel(""));
}

TEST(Blas, SgemmMatchesNaiveForEveryTranspose) {
  const int m = 37, n = 19, k = 23;
  std::vector<float> a(m * k), b(k * n);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 7) % 13) - 6.0f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i * 5) % 11) - 5.0f;
  std::vector<float> want(m * n, 0.0f);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j)
      for (int p = 0; p < k; ++p) want[i * n + j] += a[i * k + p] * b[p * n + j];
  // Transposed copies, so each combination computes the same product.
  std::vector<float> at(k * m), bt(n * k);
  for (int i = 0; i < m; ++i)
    for (int p = 0; p < k; ++p) at[p * m + i] = a[i * k + p];
  for (int p = 0; p < k; ++p)
    for (int j = 0; j < n; ++j) bt[j * k + p] = b[p * n + j];
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      std::vector<float> c(m * n, 1.0f);
      blas::sgemm(ta, tb, m, n, k, 1.0f, ta ? at.data() : a.data(), ta ? m : k,
                  tb ? bt.data() : b.data(), tb ? k : n, 0.0f, c.data(), n);
      // Small integers: every partial sum is exact, so the result is too.
      EXPECT_EQ(c, want) << "trans_a=" << ta << " trans_b=" << tb;
    }
}

// The library's own thread count, behind the door (it is loaded with RTLD_GLOBAL).
int library_threads() {
  auto get = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return get != nullptr ? get() : -1;
}

TEST(Blas, CallingThreadScopesNestAndGiveTheCountBack) {
  blas::kernel_name();  // loads the library
  if (library_threads() < 0) GTEST_SKIP() << "not OpenBLAS: no thread count to see";
  const int old = blas::num_threads();
  blas::set_num_threads(3);
  {
    std::optional<blas::OnCallingThread> outer(std::in_place);
    EXPECT_EQ(library_threads(), 1);
    EXPECT_EQ(blas::num_threads(), 3) << "callers still see the count they asked for";
    {
      blas::OnCallingThread inner;
      blas::set_num_threads(2);  // asked for meanwhile: applied when the last scope ends
      EXPECT_EQ(library_threads(), 1);
    }
    EXPECT_EQ(library_threads(), 1) << "the outer scope is still open";
    outer.reset();
    EXPECT_EQ(library_threads(), 2);
    EXPECT_EQ(blas::num_threads(), 2);
  }
  blas::set_num_threads(old);
  EXPECT_EQ(library_threads(), old);
}

}  // namespace
}  // namespace tandem
