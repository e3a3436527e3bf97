// Loads OpenBLAS at run time after choosing its kernels (see blas.h for why), and forwards calls.
#include "tandem/core/blas.h"

#include <dlfcn.h>
#include <strings.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string_view>

#include "tandem/core/env.h"
#include "tandem/core/error.h"

#ifndef TANDEM_BLAS_LIBRARY
#define TANDEM_BLAS_LIBRARY "libopenblas.so.0"
#endif

namespace tandem::blas {
namespace {

// CBLAS enum values, fixed by the CBLAS standard.
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

using SgemmFn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int,
                         float, float*, int);
using CorenameFn = char* (*)();
using GetThreadsFn = int (*)();
using SetThreadsFn = void (*)(int);

struct Library {
  std::string path;
  SgemmFn sgemm = nullptr;
  CorenameFn corename = nullptr;
  GetThreadsFn get_threads = nullptr;
  SetThreadsFn set_threads = nullptr;
};

void* symbol(void* handle, const char* name, const std::string& path) {
  void* s = dlsym(handle, name);
  if (s == nullptr) user_error("BLAS library {} has no symbol {}", path, name);
  return s;
}

// The user's own OPENBLAS_CORETYPE, read before tandem sets its own; empty when unset.
std::string& user_choice() {
  static std::string choice;
  return choice;
}

// Chooses the kernels through the environment, which OpenBLAS reads when it is loaded. Never
// overrides a user's own OPENBLAS_CORETYPE.
bool choose_kernels() {
  static const bool chosen = [] {
    if (const char* set = std::getenv("OPENBLAS_CORETYPE"); set != nullptr && *set != '\0') {
      user_choice() = set;
    } else if (const char* kernels = preferred_kernels(); kernels != nullptr) {
      setenv("OPENBLAS_CORETYPE", kernels, /*overwrite=*/1);
    }
    return true;
  }();
  return chosen;
}

// Done during static initialisation too, while the process is still single-threaded, because
// setenv races with getenv on other threads.
[[maybe_unused]] const bool kKernelsChosen = choose_kernels();

Library load() {
  choose_kernels();
  // TANDEM_BLAS_LIBRARY picks another CBLAS build (and nothing else when it cannot be loaded);
  // without it, the one found at configure time, then the runtime soname (the configure-time path
  // is the -dev symlink, absent on a runtime-only machine).
  const std::string chosen = env_str("TANDEM_BLAS_LIBRARY", "");
  std::string tried;
  for (const std::string& path :
       {chosen, std::string(TANDEM_BLAS_LIBRARY), std::string("libopenblas.so.0")}) {
    if (path.empty()) continue;
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    // A library the user named is used or refused, never silently replaced by the default.
    if (h == nullptr && path == chosen)
      user_error(
          "TANDEM_BLAS_LIBRARY={} cannot be loaded: {} (name a CBLAS shared library, or "
          "unset it for the default)",
          chosen, dlerror());
    if (h == nullptr) {
      tried += fmt::format("\n  {}: {}", path, dlerror());
      continue;
    }
    Library lib;
    lib.path = path;
    lib.sgemm = reinterpret_cast<SgemmFn>(symbol(h, "cblas_sgemm", path));
    lib.corename = reinterpret_cast<CorenameFn>(dlsym(h, "openblas_get_corename"));
    lib.get_threads = reinterpret_cast<GetThreadsFn>(dlsym(h, "openblas_get_num_threads"));
    lib.set_threads = reinterpret_cast<SetThreadsFn>(dlsym(h, "openblas_set_num_threads"));
    return lib;
  }
  user_error("could not load a CBLAS library (run scripts/install-deps.sh to install OpenBLAS):{}",
             tried);
}

// ThreadSanitizer cannot see how OpenBLAS's own workers synchronise with the caller (the library
// is not instrumented and its workers spin on plain flags), so it would report every GEMM's output
// read after the call as a race. A thread-sanitized build keeps each call on its calling thread,
// as gemm.cc does for oneDNN; the thread count callers ask for is still recorded and reported.
#if defined(__SANITIZE_THREAD__)
constexpr bool kCallingThreadOnly = true;
#else
constexpr bool kCallingThreadOnly = false;
#endif

const Library& library() {
  static const Library lib = [] {
    Library loaded = load();
    if (kCallingThreadOnly && loaded.set_threads != nullptr) loaded.set_threads(1);
    return loaded;
  }();
  return lib;
}

}  // namespace

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}

void sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
           const float* b, int ldb, float beta, float* c, int ldc) {
  library().sgemm(kRowMajor, trans_a ? kTrans : kNoTrans, trans_b ? kTrans : kNoTrans, m, n, k,
                  alpha, a, lda, b, ldb, beta, c, ldc);
}

std::string kernel_name() {
  const Library& lib = library();
  return lib.corename != nullptr ? std::string(lib.corename()) : std::string("unknown");
}

const char* preferred_kernels() {
  if (cpu_has_avx512()) return "SkylakeX";
  if (cpu_has_avx2_fma()) return "Haswell";
  return nullptr;
}

bool cpu_has_avx2_fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

std::string user_kernels() {
  choose_kernels();
  return user_choice();
}

bool is_generic_kernel(std::string_view name) {
  static constexpr std::string_view kGeneric[] = {"Prescott",  "Core2", "Penryn", "Dunnington",
                                                  "Nehalem",   "Atom",  "Katmai", "Coppermine",
                                                  "Northwood", "Banias"};
  for (std::string_view g : kGeneric) {
    if (g.size() == name.size() && strncasecmp(g.data(), name.data(), g.size()) == 0) return true;
  }
  return false;
}

bool using_generic_kernels_on_capable_cpu() {
  return preferred_kernels() != nullptr && is_generic_kernel(kernel_name());
}

std::string library_path() { return library().path; }

namespace {

// The thread count callers asked for, and how many calling-thread-only scopes are open: while one
// is, the library runs on one thread and the asked-for count waits here.
struct Threads {
  std::mutex mu;
  int wanted = 0;  // 0 until someone sets it: the library's own count then
  int serial_scopes = 0;
};

Threads& threads() {
  static Threads t;
  return t;
}

void apply(const Library& lib, int n) {
  if (lib.set_threads != nullptr) lib.set_threads(kCallingThreadOnly ? 1 : n);
}

}  // namespace

int num_threads() {
  const Library& lib = library();
  Threads& t = threads();
  std::lock_guard<std::mutex> lock(t.mu);
  if (t.wanted > 0) return t.wanted;
  return lib.get_threads != nullptr ? lib.get_threads() : 1;
}

void set_num_threads(int n) {
  const Library& lib = library();
  Threads& t = threads();
  std::lock_guard<std::mutex> lock(t.mu);
  t.wanted = std::max(1, n);
  if (t.serial_scopes == 0) apply(lib, t.wanted);
}

OnCallingThread::OnCallingThread() {
  const Library& lib = library();
  Threads& t = threads();
  std::lock_guard<std::mutex> lock(t.mu);
  if (t.wanted == 0) t.wanted = lib.get_threads != nullptr ? lib.get_threads() : 1;
  if (t.serial_scopes++ == 0 && t.wanted > 1) apply(lib, 1);
}

OnCallingThread::~OnCallingThread() {
  const Library& lib = library();
  Threads& t = threads();
  std::lock_guard<std::mutex> lock(t.mu);
  if (--t.serial_scopes == 0 && t.wanted > 1) apply(lib, t.wanted);
}

}  // namespace tandem::blas
