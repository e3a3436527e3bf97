// Loads oneDNN at first use (after setting OpenMP's wait policy, see onednn.h) and runs matmuls
// through its C API, one cached primitive per call shape.
#include "onednn.h"

#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>

#include <bit>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "tandem/core/error.h"

#ifndef TANDEM_DNNL_LIBRARY
#define TANDEM_DNNL_LIBRARY "libdnnl.so.2"
#endif

namespace tandem::onednn {
namespace {

// What became of OMP_WAIT_POLICY, decided once before oneDNN (and so libgomp) is loaded.
struct WaitPolicy {
  std::string value;  // what the runtime will read, "" for its default
  std::string who;    // "set by tandem", "the user's", or why tandem could not set it
};

WaitPolicy choose_wait_policy() {
  if (const char* set = std::getenv("OMP_WAIT_POLICY"); set != nullptr && *set != '\0')
    return {set, "the user's"};
  // An OpenMP runtime loaded already (by the program or another library) read its settings.
  if (void* gomp = dlopen("libgomp.so.1", RTLD_NOW | RTLD_NOLOAD); gomp != nullptr) {
    dlclose(gomp);
    return {"", "libgomp was loaded before tandem could set OMP_WAIT_POLICY"};
  }
  setenv("OMP_WAIT_POLICY", "PASSIVE", /*overwrite=*/1);  // unset or empty
  return {"PASSIVE", "set by tandem"};
}

const WaitPolicy& wait_policy() {
  static const WaitPolicy policy = choose_wait_policy();
  return policy;
}

// Done during static initialisation too, while the process is single-threaded, because setenv
// races with getenv on other threads.
[[maybe_unused]] const WaitPolicy& kWaitPolicy = wait_policy();

// The C API functions tandem calls, typed by the library's own header.
// clang-format off
#define TANDEM_DNNL_FUNCTIONS(X) \
  X(dnnl_version) \
  X(dnnl_engine_create) \
  X(dnnl_stream_create) \
  X(dnnl_stream_destroy) \
  X(dnnl_stream_wait) \
  X(dnnl_memory_desc_init_by_strides) \
  X(dnnl_memory_desc_get_size) \
  X(dnnl_memory_create) \
  X(dnnl_memory_destroy) \
  X(dnnl_matmul_desc_init) \
  X(dnnl_primitive_attr_create) \
  X(dnnl_primitive_attr_destroy) \
  X(dnnl_primitive_attr_set_output_scales) \
  X(dnnl_primitive_attr_set_scratchpad_mode) \
  X(dnnl_primitive_attr_set_post_ops) \
  X(dnnl_post_ops_create) \
  X(dnnl_post_ops_destroy) \
  X(dnnl_post_ops_append_sum) \
  X(dnnl_primitive_desc_create) \
  X(dnnl_primitive_desc_destroy) \
  X(dnnl_primitive_desc_query) \
  X(dnnl_primitive_desc_query_md) \
  X(dnnl_primitive_create) \
  X(dnnl_primitive_execute)
// clang-format on

struct Library {
  std::string path, why_not;  // why_not is empty when the library is usable
#define TANDEM_DNNL_POINTER(f) decltype(&::f) f = nullptr;
  TANDEM_DNNL_FUNCTIONS(TANDEM_DNNL_POINTER)
#undef TANDEM_DNNL_POINTER
  void (*omp_set_num_threads)(int) = nullptr;  // null unless the library runs on OpenMP
  const dnnl_version_t* version = nullptr;
  dnnl_engine_t engine = nullptr;
};

void check(dnnl_status_t status, const char* what) {
  if (status != dnnl_success)
    internal_error(fmt::format("oneDNN {} failed with status {}", what, static_cast<int>(status)));
}

Library load() {
  wait_policy();
  Library lib;
  std::string tried;
  for (const char* path : {TANDEM_DNNL_LIBRARY, "libdnnl.so.2"}) {
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      tried += fmt::format("{}{}", tried.empty() ? "" : "; ", dlerror());
      continue;
    }
    lib.path = path;
    std::string missing;
#define TANDEM_DNNL_SYMBOL(f)                             \
  lib.f = reinterpret_cast<decltype(&::f)>(dlsym(h, #f)); \
  if (lib.f == nullptr) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", #f);
    TANDEM_DNNL_FUNCTIONS(TANDEM_DNNL_SYMBOL)
#undef TANDEM_DNNL_SYMBOL
    if (!missing.empty()) {
      lib.why_not = fmt::format("{} lacks {} (tandem needs oneDNN 2.x)", path, missing);
      return lib;
    }
    lib.version = lib.dnnl_version();
    if (lib.version->major != 2) {
      lib.why_not = fmt::format("{} is oneDNN {}.{} (tandem needs 2.x)", path, lib.version->major,
                                lib.version->minor);
      return lib;
    }
    if (lib.version->cpu_runtime == DNNL_RUNTIME_OMP)
      lib.omp_set_num_threads = reinterpret_cast<void (*)(int)>(dlsym(h, "omp_set_num_threads"));
    check(lib.dnnl_engine_create(&lib.engine, dnnl_cpu, 0), "engine creation");
    return lib;
  }
  lib.why_not = fmt::format("oneDNN could not be loaded ({})", tried);
  return lib;
}

const Library& library() {
  static const Library lib = load();
  return lib;
}

// A call's shape as a primitive sees it: everything but the pointers.
struct Key {
  DType type;
  bool trans_a, trans_b;
  int m, n, k, lda, ldb, ldc;
  uint32_t alpha, beta;  // bits, so that every value (and -0) is its own key
  int threads;
  auto operator<=>(const Key&) const = default;
};

struct Entry {
  dnnl_primitive_t primitive = nullptr;  // null: oneDNN has no kernel for this call
  dnnl_memory_desc_t a{}, b{}, c{}, scratch{};
  size_t scratch_bytes = 0;
  std::string implementation;
};

Key key_of(const GemmCall& call, int threads) {
  return {call.type,
          call.trans_a,
          call.trans_b,
          call.m,
          call.n,
          call.k,
          call.lda,
          call.ldb,
          call.ldc,
          std::bit_cast<uint32_t>(call.alpha),
          std::bit_cast<uint32_t>(call.beta),
          threads};
}

void set_threads(const Library& lib, int threads) {
  if (lib.omp_set_num_threads != nullptr) lib.omp_set_num_threads(threads);
}

// A row-major matrix of rows x cols, stored transposed or not with leading dimension ld.
dnnl_memory_desc_t matrix(const Library& lib, int rows, int cols, bool transposed, int ld,
                          dnnl_data_type_t type) {
  dnnl_memory_desc_t md;
  const dnnl_dims_t dims = {rows, cols};
  const dnnl_dims_t strides = {transposed ? 1 : ld, transposed ? ld : 1};
  check(lib.dnnl_memory_desc_init_by_strides(&md, 2, dims, type, strides), "memory desc");
  return md;
}

Entry make_entry(const Library& lib, const Key& key, float alpha, float beta) {
  // oneDNN sizes its work for the thread count it sees when the primitive is made.
  set_threads(lib, key.threads);
  const dnnl_data_type_t in = key.type == DType::BF16 ? dnnl_bf16 : dnnl_f32;
  Entry e;
  e.a = matrix(lib, key.m, key.k, key.trans_a, key.lda, in);
  e.b = matrix(lib, key.k, key.n, key.trans_b, key.ldb, in);
  e.c = matrix(lib, key.m, key.n, false, key.ldc, dnnl_f32);
  dnnl_matmul_desc_t desc;
  check(lib.dnnl_matmul_desc_init(&desc, &e.a, &e.b, nullptr, &e.c), "matmul desc");
  // alpha scales the product, beta adds the old C (a sum post-op); scratch memory is ours.
  dnnl_primitive_attr_t attr = nullptr;
  dnnl_post_ops_t post_ops = nullptr;
  check(lib.dnnl_primitive_attr_create(&attr), "attr creation");
  check(lib.dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user),
        "scratchpad mode");
  if (alpha != 1.0f)
    check(lib.dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha), "output scale");
  if (beta != 0.0f) {
    check(lib.dnnl_post_ops_create(&post_ops), "post-ops creation");
    check(lib.dnnl_post_ops_append_sum(post_ops, beta), "sum post-op");
    check(lib.dnnl_primitive_attr_set_post_ops(attr, post_ops), "post-ops");
  }
  dnnl_primitive_desc_t pd = nullptr;
  const dnnl_status_t made = lib.dnnl_primitive_desc_create(&pd, &desc, attr, lib.engine, nullptr);
  if (post_ops != nullptr) lib.dnnl_post_ops_destroy(post_ops);
  lib.dnnl_primitive_attr_destroy(attr);
  if (made == dnnl_unimplemented) return e;
  check(made, "matmul primitive descriptor");
  const char* impl = nullptr;
  check(lib.dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl), "query");
  e.implementation = impl != nullptr ? impl : "?";
  e.scratch = *lib.dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  e.scratch_bytes = lib.dnnl_memory_desc_get_size(&e.scratch);
  check(lib.dnnl_primitive_create(&e.primitive, pd), "matmul primitive");
  lib.dnnl_primitive_desc_destroy(pd);
  return e;
}

// Entries live as long as the process; a primitive is safe to run from several threads at once.
const Entry& entry(const Library& lib, const GemmCall& call, int threads) {
  static std::mutex mu;
  static auto* cache = new std::map<Key, Entry>();  // never freed: primitives outlive statics
  const Key key = key_of(call, threads);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(key);
  if (it == cache->end())
    it = cache->emplace(key, make_entry(lib, key, call.alpha, call.beta)).first;
  return it->second;
}

// Each thread's stream and scratch memory (the primitives' own, kept between calls).
struct ThreadState {
  const Library* lib = nullptr;
  dnnl_stream_t stream = nullptr;
  std::vector<char> scratch;
  ~ThreadState() {
    if (stream != nullptr) lib->dnnl_stream_destroy(stream);
  }
};

ThreadState& thread_state(const Library& lib) {
  thread_local ThreadState state;
  if (state.stream == nullptr) {
    check(lib.dnnl_stream_create(&state.stream, lib.engine, dnnl_stream_default_flags),
          "stream creation");
    state.lib = &lib;
  }
  return state;
}

}  // namespace

bool available() { return library().why_not.empty(); }

std::string unavailable_reason() { return library().why_not; }

std::string describe() {
  const Library& lib = library();
  if (!lib.why_not.empty()) return lib.why_not;
  const dnnl_version_t& v = *lib.version;
  std::string runtime = v.cpu_runtime == DNNL_RUNTIME_OMP   ? "OpenMP"
                        : v.cpu_runtime == DNNL_RUNTIME_SEQ ? "sequential"
                        : v.cpu_runtime == DNNL_RUNTIME_TBB ? "TBB"
                                                            : "threadpool";
  std::string line =
      fmt::format("oneDNN {}.{}.{} ({}), {} runtime", v.major, v.minor, v.patch, lib.path, runtime);
  if (v.cpu_runtime == DNNL_RUNTIME_OMP) {
    const WaitPolicy& w = wait_policy();
    line += w.value.empty() ? fmt::format(", {}", w.who)
                            : fmt::format(", OMP_WAIT_POLICY={} ({})", w.value, w.who);
  }
  return line;
}

bool matmul(const GemmCall& call, int threads) {
  const Library& lib = library();
  TANDEM_CHECK(lib.why_not.empty(), "oneDNN matmul without the library: {}", lib.why_not);
  const Entry& e = entry(lib, call, threads);
  if (e.primitive == nullptr) return false;
  ThreadState& state = thread_state(lib);
  if (state.scratch.size() < e.scratch_bytes) state.scratch.resize(e.scratch_bytes);
  // Memory objects only wrap the caller's pointers: made per call, as cheap as a small struct.
  dnnl_memory_t a = nullptr, b = nullptr, c = nullptr, scratch = nullptr;
  check(lib.dnnl_memory_create(&a, &e.a, lib.engine, const_cast<void*>(call.a)), "memory");
  check(lib.dnnl_memory_create(&b, &e.b, lib.engine, const_cast<void*>(call.b)), "memory");
  check(lib.dnnl_memory_create(&c, &e.c, lib.engine, call.c), "memory");
  dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
  int nargs = 3;
  if (e.scratch_bytes > 0) {
    check(lib.dnnl_memory_create(&scratch, &e.scratch, lib.engine, state.scratch.data()), "memory");
    args[nargs++] = {DNNL_ARG_SCRATCHPAD, scratch};
  }
  set_threads(lib, threads);
  const dnnl_status_t ran = lib.dnnl_primitive_execute(e.primitive, state.stream, nargs, args);
  const dnnl_status_t waited = ran == dnnl_success ? lib.dnnl_stream_wait(state.stream) : ran;
  for (dnnl_memory_t m : {a, b, c, scratch})
    if (m != nullptr) lib.dnnl_memory_destroy(m);
  check(waited, "matmul");
  return true;
}

std::string implementation(const GemmCall& call, int threads) {
  const Library& lib = library();
  if (!lib.why_not.empty()) return "";
  return entry(lib, call, threads).implementation;
}

}  // namespace tandem::onednn
