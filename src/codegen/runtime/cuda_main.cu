// The end of every emitted CUDA program: main() (MPI and NCCL set-up, device buffers from the
// plan's tables, the check against the reference interpreter's results, the timing loop).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "cuda_runtime.cuh"

// ---------------------------------------------------------------- main: set up, check, time

static void tdm_die(const std::string& what) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "rank %d: %s\n", rank, what.c_str());
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}
#define TDM_MUST_CUDA(call)                                                             \
  do {                                                                                  \
    const cudaError_t e_ = (call);                                                      \
    if (e_ != cudaSuccess) tdm_die(std::string(#call) + ": " + cudaGetErrorString(e_)); \
  } while (0)
#define TDM_MUST_NCCL(call)                                                             \
  do {                                                                                  \
    const ncclResult_t e_ = (call);                                                     \
    if (e_ != ncclSuccess) tdm_die(std::string(#call) + ": " + ncclGetErrorString(e_)); \
  } while (0)

static size_t tdm_size_of(int dt) { return dt == 0 ? 4 : 2; }

// The reference's run, as `tandem emit` wrote it: check/np<N>/meta.txt holds the symbols
// ("sym NAME EXTENT"), the scalars ("scalar ID VALUE") and dropout seeds ("seed ID VALUE");
// r<R>.in<ID>.bin and r<R>.want<ID>.bin hold rank R's piece of each input and expected result.
struct tdm_case {
  std::vector<int64_t> sym;
  std::vector<double> scalar;  // by stage id
  std::vector<uint64_t> seed;  // by stage id
  std::string dir;             // where the reference's files are; empty: no check
};

static bool tdm_read_case(const std::string& dir, tdm_case& c) {
  std::ifstream in(dir + "/meta.txt");
  if (!in) return false;
  c.dir = dir;
  std::string kind, key;
  while (in >> kind >> key) {
    if (kind == "sym") {
      int64_t v = 0;
      in >> v;
      for (int i = 0; i < tdm_nsyms; ++i)
        if (key == tdm_sym_names[i]) c.sym[static_cast<size_t>(i)] = v;
    } else if (kind == "scalar") {
      double v = 0;
      in >> v;
      c.scalar[static_cast<size_t>(std::stoi(key))] = v;
    } else if (kind == "seed") {
      uint64_t v = 0;
      in >> v;
      c.seed[static_cast<size_t>(std::stoi(key))] = v;
    } else {
      tdm_die("unreadable " + dir + "/meta.txt: '" + kind + "'");
    }
  }
  return true;
}

static std::vector<char> tdm_read_file(const std::string& path, size_t bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) tdm_die("cannot open " + path);
  std::vector<char> data(bytes);
  in.read(data.data(), static_cast<std::streamsize>(bytes));
  if (static_cast<size_t>(in.gcount()) != bytes || in.peek() != EOF)
    tdm_die(path + " does not hold " + std::to_string(bytes) +
            " bytes (sizes or rank count differ from the emit)");
  return data;
}

static float tdm_host_ld(const char* p, int dt, size_t i) {
  if (dt == 0) {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return dt == 1 ? fx::ld_bf16(h) : fx::ld_f16(h);
}

// Inputs for timing without a reference: positive values of one magnitude, as tune's inputs are.
__global__ void tdm_fill_input(void* p, int dt, int64_t n, uint64_t salt) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    tdm_st(p, dt, i, 0.25f + fx::uniform_of(fx::random_bits(salt, static_cast<uint64_t>(i))));
}

struct tdm_run_state {
  tandem_args a{};
  std::vector<void*> buf;
  std::vector<void*> owned;
  std::vector<int64_t> sym;
  std::vector<uint64_t> seed;
  double* acc = nullptr;
  float* scratch = nullptr;
};

// Allocates what the plan stores on this rank for the case's sizes, binds scalars and seeds.
static void tdm_setup(tdm_host& h, tdm_run_state& s, const tdm_case& c) {
  s.sym = c.sym;
  s.seed = c.seed;
  s.buf.assign(static_cast<size_t>(tdm_nstages), nullptr);
  tandem_args& a = s.a;
  a.buf = s.buf.data();
  a.sym = s.sym.data();
  a.seed = s.seed.data();
  a.p = h.group_size;
  a.r = h.group_rank;
  a.group = h.group;
  a.host = &h;
  a.collective = tdm_on_collective;
  a.transfer = tdm_on_transfer;
  a.sync = tdm_on_sync;
  a.sgemm = tdm_sgemm;
  size_t most = 0;
  for (int id = 0; id < tdm_nstages; ++id) {
    if (tdm_owner[id] != id || !tdm_mine(&a, id)) continue;
    const int64_t elems = tdm_buffer_elems(&a, id);
    const size_t bytes = static_cast<size_t>(elems > 0 ? elems : 1) * tdm_size_of(tdm_dtype_of[id]);
    void* p = nullptr;
    TDM_MUST_CUDA(cudaMalloc(&p, bytes));
    TDM_MUST_CUDA(cudaMemset(p, 0, bytes));
    s.buf[static_cast<size_t>(id)] = p;
    s.owned.push_back(p);
    most = std::max(most, bytes);
  }
  for (int id = 0; id < tdm_nstages; ++id)
    if (tdm_owner[id] >= 0 && tdm_owner[id] != id)
      s.buf[static_cast<size_t>(id)] = s.buf[static_cast<size_t>(tdm_owner[id])];
  TDM_MUST_CUDA(
      cudaMalloc(&s.acc, sizeof(double) * TANDEM_ACC_SLOTS * static_cast<size_t>(tdm_nstages)));
  a.acc = s.acc;
  const int64_t scratch = std::max<int64_t>(1, tandem_scratch_elems(&a));
  TDM_MUST_CUDA(cudaMalloc(&s.scratch, sizeof(float) * static_cast<size_t>(scratch)));
  a.scratch = s.scratch;
  if (most > h.staging_bytes) {
    if (h.staging != nullptr) TDM_MUST_CUDA(cudaFree(h.staging));
    TDM_MUST_CUDA(cudaMalloc(&h.staging, most));
    h.staging_bytes = most;
  }
  // Scalars live in one-element buffers, in their dtype.
  for (int id = 0; id < tdm_nstages; ++id) {
    if (tdm_kind_of[id] != 2 || s.buf[static_cast<size_t>(id)] == nullptr) continue;
    const float v = static_cast<float>(c.scalar[static_cast<size_t>(id)]);
    const int dt = tdm_dtype_of[id];
    uint16_t h16 = dt == 1 ? fx::st_bf16(v) : fx::st_f16(v);
    TDM_MUST_CUDA(cudaMemcpy(s.buf[static_cast<size_t>(id)],
                             dt == 0 ? static_cast<const void*>(&v) : &h16, tdm_size_of(dt),
                             cudaMemcpyHostToDevice));
  }
}

static void tdm_teardown(tdm_run_state& s) {
  for (void* p : s.owned) TDM_MUST_CUDA(cudaFree(p));
  TDM_MUST_CUDA(cudaFree(s.acc));
  TDM_MUST_CUDA(cudaFree(s.scratch));
  s.owned.clear();
}

static void tdm_run(tdm_host& h, tdm_run_state& s) {
  h.args = &s.a;
  tdm_gemm_host = &h;
  const int rc = tandem_run(&s.a);
  if (rc != 0 || h.failed)
    tdm_die(std::string("the run failed: ") + (h.failed ? h.error : "a step returned non-zero"));
}

static void tdm_wait(tdm_host& h) {
  TDM_MUST_CUDA(cudaStreamSynchronize(h.compute));
  TDM_MUST_CUDA(cudaStreamSynchronize(h.wire));
  if (h.failed) tdm_die(h.error);
}

// Loads the reference's inputs, runs once, compares each result with the reference's within
// tune's tolerances (|got - want| <= tol * (|want| + max |want|); f32 2e-4, bf16 2^-7, f16 2^-9).
static int tdm_check(tdm_host& h, tdm_run_state& s, const tdm_case& c, int world_rank) {
  std::vector<tdm_item> items;
  tdm_check_items(&s.a, items);
  const std::string prefix = c.dir + "/r" + std::to_string(world_rank);
  for (const tdm_item& it : items) {
    if (it.want) continue;
    const size_t bytes = static_cast<size_t>(it.elems) * tdm_size_of(it.dtype);
    const std::vector<char> data =
        tdm_read_file(prefix + ".in" + std::to_string(it.stage) + ".bin", bytes);
    if (bytes > 0) TDM_MUST_CUDA(cudaMemcpy(it.ptr, data.data(), bytes, cudaMemcpyHostToDevice));
  }
  tdm_run(h, s);
  tdm_wait(h);
  int bad_values = 0;
  for (const tdm_item& it : items) {
    if (!it.want) continue;
    const size_t bytes = static_cast<size_t>(it.elems) * tdm_size_of(it.dtype);
    const std::vector<char> want =
        tdm_read_file(prefix + ".want" + std::to_string(it.stage) + ".bin", bytes);
    std::vector<char> got(bytes);
    if (bytes > 0) TDM_MUST_CUDA(cudaMemcpy(got.data(), it.ptr, bytes, cudaMemcpyDeviceToHost));
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < it.elems; ++i)
      scale = std::max(scale, std::fabs(static_cast<double>(
                                  tdm_host_ld(want.data(), it.dtype, static_cast<size_t>(i)))));
    const double tol = it.dtype == 0 ? 2e-4 : (it.dtype == 1 ? 0x1p-7 : 0x1p-9);
    int64_t bad = 0;
    std::string first;
    for (int64_t i = 0; i < it.elems; ++i) {
      const double g = tdm_host_ld(got.data(), it.dtype, static_cast<size_t>(i));
      const double w = tdm_host_ld(want.data(), it.dtype, static_cast<size_t>(i));
      const double bound = std::fabs(w) + scale, diff = std::fabs(g - w);
      if (!std::isnan(diff) && bound > 0) worst = std::max(worst, diff / bound);
      if (std::isnan(g) != std::isnan(w) || diff > tol * bound) {
        if (bad < 3)
          first += " [" + std::to_string(i) + "] got " + std::to_string(g) + " want " +
                   std::to_string(w) + ";";
        ++bad;
      }
    }
    std::printf("rank %d: %-12s %s: %lld elements, max relative error %.3g%s%s\n", world_rank,
                tdm_stage_name[it.stage], bad == 0 ? "ok" : "DIFFERS",
                static_cast<long long>(it.elems), worst, bad == 0 ? "" : ":", first.c_str());
    bad_values += bad > 0;
  }
  return bad_values;
}

// Median and spread of `iters` timed runs (after two warm-ups), on the compute stream, which the
// last step of every run waits for.
static void tdm_time(tdm_host& h, tdm_run_state& s, int iters, int world_rank, int world_size) {
  cudaEvent_t start, stop;
  TDM_MUST_CUDA(cudaEventCreate(&start));
  TDM_MUST_CUDA(cudaEventCreate(&stop));
  for (int w = 0; w < 2; ++w) tdm_run(h, s);
  tdm_wait(h);
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    TDM_MUST_CUDA(cudaEventRecord(start, h.compute));
    tdm_run(h, s);
    if (tdm_order(&h, h.wire, h.compute) != 0) tdm_die(h.error);
    TDM_MUST_CUDA(cudaEventRecord(stop, h.compute));
    TDM_MUST_CUDA(cudaEventSynchronize(stop));
    tdm_wait(h);
    float t = 0;
    TDM_MUST_CUDA(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  float med = ms.empty() ? 0.0f : ms[ms.size() / 2], slowest = 0;
  MPI_Reduce(&med, &slowest, 1, MPI_FLOAT, MPI_MAX, 0, MPI_COMM_WORLD);
  if (world_rank == 0 && !ms.empty())
    std::printf(
        "%s / %s on %d ranks: median %.4f ms (slowest rank), this rank min %.4f max %.4f over %d "
        "runs\n",
        tdm_program_name, tdm_plan_name, world_size, slowest, ms.front(), ms.back(), iters);
  TDM_MUST_CUDA(cudaEventDestroy(start));
  TDM_MUST_CUDA(cudaEventDestroy(stop));
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int world_rank = 0, world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (world_size % tdm_groups != 0)
    tdm_die("program '" + std::string(tdm_program_name) + "' has " + std::to_string(tdm_groups) +
            " groups: run it on a multiple of that many ranks");

  tdm_host h;
  h.world_rank = world_rank;
  h.world_size = world_size;
  h.group_size = world_size / tdm_groups;
  h.group = world_rank / h.group_size;
  h.group_rank = world_rank % h.group_size;
  if (const char* env = std::getenv("TANDEM_CUDA_CHUNKS")) h.chunks = std::max(1, std::atoi(env));

  // One GPU per rank of a node.
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node);
  int local = 0, devices = 0;
  MPI_Comm_rank(node, &local);
  TDM_MUST_CUDA(cudaGetDeviceCount(&devices));
  if (devices < 1) tdm_die("no CUDA device");
  TDM_MUST_CUDA(cudaSetDevice(local % devices));

  // NCCL: the world communicator from an id rank 0 broadcasts over MPI, split into the groups.
  ncclUniqueId id;
  if (world_rank == 0) TDM_MUST_NCCL(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  TDM_MUST_NCCL(ncclCommInitRank(&h.world, world_size, id, world_rank));
  TDM_MUST_NCCL(ncclCommSplit(h.world, h.group, h.group_rank, &h.comm, nullptr));
  TDM_MUST_CUDA(cudaStreamCreateWithFlags(&h.compute, cudaStreamNonBlocking));
  TDM_MUST_CUDA(cudaStreamCreateWithFlags(&h.wire, cudaStreamNonBlocking));
  if (cublasCreate(&h.blas) != CUBLAS_STATUS_SUCCESS) tdm_die("cublasCreate failed");
  if (cublasSetStream(h.blas, h.compute) != CUBLAS_STATUS_SUCCESS)
    tdm_die("cublasSetStream failed");
  h.events.resize(256);
  for (cudaEvent_t& e : h.events)
    TDM_MUST_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  h.block_done.assign(4096, nullptr);

  // Arguments: SYMBOL=EXTENT (time at these sizes), --iters K, --check DIR, --no-check.
  tdm_case base;
  base.sym.assign(static_cast<size_t>(std::max(tdm_nsyms, 1)), -1);
  base.scalar.assign(static_cast<size_t>(tdm_nstages), 0.5);
  base.seed.assign(static_cast<size_t>(tdm_nstages), 1234);
  std::vector<std::pair<int, int64_t>> sizes;
  int iters = 20;
  std::string check_root = "check";
  bool check = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg == "--iters" && i + 1 < argc) {
      iters = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--check" && i + 1 < argc) {
      check_root = argv[++i];
    } else if (arg == "--no-check") {
      check = false;
    } else if (eq != std::string::npos) {
      int which = -1;
      for (int s = 0; s < tdm_nsyms; ++s)
        if (arg.compare(0, eq, tdm_sym_names[s]) == 0 && std::strlen(tdm_sym_names[s]) == eq)
          which = s;
      if (which < 0)
        tdm_die("'" + arg + "': not a symbol of program '" + std::string(tdm_program_name) + "'");
      sizes.push_back({which, std::atoll(arg.c_str() + eq + 1)});
    } else {
      tdm_die("unknown argument '" + arg +
              "': expected SYMBOL=EXTENT, --iters K, --check DIR or --no-check");
    }
  }

  int failures = 0;
  tdm_case ref = base;
  const bool have_ref =
      check && tdm_read_case(check_root + "/np" + std::to_string(world_size), ref);
  if (have_ref) {
    tdm_run_state s;
    tdm_setup(h, s, ref);
    failures = tdm_check(h, s, ref, world_rank);
    tdm_teardown(s);
    int all = 0;
    MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    failures = all;
    if (world_rank == 0)
      std::printf("check against the reference interpreter: %s\n",
                  failures == 0 ? "PASSED" : "FAILED");
  } else if (world_rank == 0) {
    std::printf(
        "no reference results in %s/np%d: correctness not checked (emit with --ranks %d to "
        "check)\n",
        check_root.c_str(), world_size, world_size);
  }

  // Timing: at the reference's sizes unless given; inputs made on the device when not checked.
  tdm_case timed = have_ref ? ref : base;
  timed.dir.clear();
  for (const auto& [which, extent] : sizes) timed.sym[static_cast<size_t>(which)] = extent;
  for (int i = 0; i < tdm_nsyms; ++i)
    if (timed.sym[static_cast<size_t>(i)] < 0)
      tdm_die(std::string("give the extent of ") + tdm_sym_names[i] + " as " + tdm_sym_names[i] +
              "=EXTENT");
  {
    tdm_run_state s;
    tdm_setup(h, s, timed);
    std::vector<tdm_item> items;
    tdm_check_items(&s.a, items);
    for (const tdm_item& it : items)
      if (!it.want && it.elems > 0)
        tdm_fill_input<<<tdm_blocks(it.elems), TDM_THREADS, 0, h.compute>>>(
            it.ptr, it.dtype, it.elems,
            static_cast<uint64_t>(it.stage) * 7919u + static_cast<uint64_t>(world_rank));
    TDM_MUST_CUDA(cudaGetLastError());
    tdm_wait(h);
    tdm_time(h, s, iters, world_rank, world_size);
    tdm_teardown(s);
  }

  ncclCommDestroy(h.comm);
  ncclCommDestroy(h.world);
  cublasDestroy(h.blas);
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
