// The optimizer step benchmark (see optimizer_bench.h).
#include "optimizer_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "harness.h"
#include "optimizers.h"
#include "tandem/core/error.h"
#include "tandem/dsl/workloads.h"

namespace tandem::bench {
namespace {

const char* kUsage =
    "usage: bench_{adam,lamb}_step [--quick] [--sizes 16Mi,64Mi] [--dtypes f32,bf16] [--reps 10]\n"
    "                              [--warmup 2] [--tune-reps 3] [--retune] [--ranks 2]\n"
    "Threads by default; under `mpirun -np 2` the ranks are MPI processes.\n";

// The bytes one rank must move in the best case, by access pattern: it reads every rank's part
// of the gradient that it reduces (N elements in all), reads and writes its 1/p of w, m and v in
// place (LAMB also writes and reads back its direction r, since the norms must be known before w
// changes), and gathers the rest of w (read from its peers, written into its copy). A fused
// schedule streams them all in one pass, so the bound prices every byte at the fastest roof
// measured in the same run (Roofs, before the steps and in turns with them): no pattern here
// moves bytes faster through memory. A schedule that finds bytes in a cache (a peer's freshly
// written chunk, gathered while it is still in the shared L3) moves fewer through memory than
// these, and can beat the bound: the output says so when it happens.
struct Bound {
  double read_bytes = 0, rmw_bytes = 0, copy_bytes = 0;
  double bytes() const { return read_bytes + rmw_bytes + copy_bytes; }
  static double fastest(const Roofs& r) { return std::max({r.copy, r.read, r.rmw}); }
  double seconds(const Roofs& r) const { return bytes() / fastest(r); }
};

Bound bound_of(Optimizer which, int64_t n, DType grad, int p) {
  const double N = static_cast<double>(n);
  const double slice = which == Optimizer::Adam ? 24.0 : 36.0;
  return {N * static_cast<double>(dtype_size(grad)), slice * N / p, 8.0 * N * (p - 1) / p};
}

struct Baseline {
  Optimizer which;
  Ranks& ranks;
  DType grad;
  Tensor g, w, m, v, r;
  AdamHyper h;

  void all_reduce() {
    const int64_t n = g.numel();
    if (ranks.is_mpi()) {
      if (grad == DType::F32)
        MPI_Allreduce(MPI_IN_PLACE, g.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, ranks.mpi);
      else
        MPI_Allreduce(MPI_IN_PLACE, g.data(), static_cast<int>(n), MPI_UINT16_T, bf16_sum_op(),
                      ranks.mpi);
    } else {
      ranks.comm.all_reduce(g, comm::ReduceOp::Sum);
    }
  }
  void update() {
    const int64_t n = g.numel();
    float *pw = w.data_as<float>(), *pm = m.data_as<float>(), *pv = v.data_as<float>();
    if (which == Optimizer::Adam) {
      if (grad == DType::F32)
        adamw_f32(g.data_as<float>(), pw, pm, pv, n, h);
      else
        adamw_bf16(g.data_as<uint16_t>(), pw, pm, pv, n, h);
    } else {
      if (grad == DType::F32)
        lamb_f32(g.data_as<float>(), pw, pm, pv, r.data_as<float>(), n, h);
      else
        lamb_bf16(g.data_as<uint16_t>(), pw, pm, pv, r.data_as<float>(), n, h);
    }
  }
  void step() {
    all_reduce();
    update();
  }
};

// This rank's stored piece of a runner's input, as a flat range of the whole tensor.
Tensor piece_of_whole(const exec::CompiledRunner& run, const std::string& name,
                      const Tensor& whole) {
  const auto pc = run.piece(name);
  if (pc.dim < 0) return whole;
  return whole.flat_slice(pc.offset, pc.count);  // 1-D: rows are elements
}

void bench_one(Ranks& R, const Options& o, Optimizer which, int64_t n, DType grad,
               RoofStreams& streams, const Roofs& roofs_before) {
  comm::Communicator& comm = R.comm;
  const int p = comm.size(), rank = comm.rank();
  const std::string opt = which == Optimizer::Adam ? "adam" : "lamb";
  const std::string label =
      fmt::format("{}_{}_{}_{}", opt, dtype_name(grad), size_label(n), R.backend());
  if (R.root())
    fmt::print(
        "\n{} step, N={} ({}), {} gradients, {} ranks, {} backend; load average {} on {} hardware "
        "threads\n",
        opt, size_label(n), n, dtype_name(grad), p, R.backend(), load_average(),
        hardware_threads());

  const dsl::Program program =
      which == Optimizer::Adam ? dsl::workloads::adam(grad) : dsl::workloads::lamb(grad);
  const dsl::SymbolMap sizes = {{"N", n}};
  const Tuned tuned = tune_and_compile(R, program, sizes, o);
  print_tuning(R, tuned);

  // The inputs: each rank its own gradient, the same weights and moments everywhere.
  Baseline b{which,
             R,
             grad,
             Tensor::empty(grad, Shape{n}),
             Tensor::empty(DType::F32, Shape{n}),
             Tensor::empty(DType::F32, Shape{n}),
             Tensor::empty(DType::F32, Shape{n}),
             which == Optimizer::Lamb ? Tensor::empty(DType::F32, Shape{n}) : Tensor(),
             AdamHyper{}};
  b.h.grad_scale = 1.0f / static_cast<float>(p);
  Tensor g0 = Tensor::empty(grad, Shape{n});
  fill_uniform(g0, 100 + static_cast<uint64_t>(rank), -1.0f, 1.0f);
  fill_uniform(b.w, 1, -1.0f, 1.0f);
  fill_uniform(b.m, 2, -0.01f, 0.01f);
  fill_uniform(b.v, 3, 0.0f, 1e-4f);
  std::memcpy(b.g.data(), g0.data(), g0.nbytes());

  exec::RunnerOptions as_tuned;
  as_tuned.chunk_bytes = tuned.result.record.chunk_bytes;
  exec::CompiledRunner run(tuned.compiled, comm, sizes, as_tuned);
  run.load("g", g0);
  run.load("w", b.w);
  run.load("m", b.m);
  run.load("v", b.v);
  const exec::ScalarMap scalars = {{"lr", b.h.lr},
                                   {"beta1", b.h.beta1},
                                   {"beta2", b.h.beta2},
                                   {"eps", b.h.eps},
                                   {"weight_decay", b.h.weight_decay},
                                   {"step", b.h.step},
                                   {"grad_scale", b.h.grad_scale}};
  for (const auto& [k, v] : scalars) run.set_scalar(k, v);

  // Check before timing: one step of each from the same state must agree.
  b.step();
  run.run();
  std::string bad;
  for (const char* name : {"w", "m", "v"}) {
    const Tensor& whole = name[0] == 'w' ? b.w : (name[0] == 'm' ? b.m : b.v);
    const std::string msg = compare(fmt::format("{} after one step", name), run.input(name),
                                    piece_of_whole(run, name, whole), 1e-5);
    if (bad.empty()) bad = msg;
  }
  require_agreement(R, bad);

  const std::vector<Contender> contenders = {
      {"baseline", [&] { b.step(); }, [&] { std::memcpy(b.g.data(), g0.data(), g0.nbytes()); }},
      {"tandem", [&] { run.run(); }, [&] { run.load("g", g0); }},
      {"all_reduce", [&] { b.all_reduce(); },
       [&] { std::memcpy(b.g.data(), g0.data(), g0.nbytes()); }},
      {"update", [&] { b.update(); }, {}},
      // The roofs again, in turns with the steps, so that they see the machine the steps saw.
      {"roof_read", [&] { streams.read(); }, {}},
      {"roof_rmw", [&] { streams.rmw(); }, {}},
      {"roof_copy", [&] { streams.copy(); }, {}},
  };
  const std::vector<Stats> s = time_interleaved(comm, contenders, o.warmup, o.reps);
  if (!R.root()) return;
  const Roofs in_turns = {streams.copy_rate(s[6].min), streams.read_rate(s[4].min),
                          streams.rmw_rate(s[5].min)};
  const Roofs roofs = fastest_of(roofs_before, in_turns);
  fmt::print(
      "  roofs in turns with the steps (the fastest of {}): copy {:.2f} GB/s, read {:.2f} GB/s, "
      "read-modify-write {:.2f} GB/s; the bound takes the faster of each\n",
      o.reps, in_turns.copy / 1e9, in_turns.read / 1e9, in_turns.rmw / 1e9);
  const Bound b_of = bound_of(which, n, grad, p);
  const double bytes = b_of.bytes();
  const double bound = b_of.seconds(roofs);
  auto gbs = [&](const Stats& st) {
    return fmt::format("{:6.2f} GB/s of the bound's bytes", bytes / st.median / 1e9);
  };
  const std::string coll =
      R.is_mpi() ? (grad == DType::F32 ? "MPI_Allreduce" : "MPI_Allreduce (user bf16 op)")
                 : "thread all_reduce";
  const std::string loop = which == Optimizer::Adam ? "AdamW loop" : "LAMB loops";
  print_row(fmt::format("baseline: {} + {}", coll, loop), s[0], gbs(s[0]));
  print_row(fmt::format("  {} alone", coll), s[2]);
  print_row(fmt::format("  {} alone", loop), s[3]);
  print_row(fmt::format("tandem: {}", tuned.result.record.winner), s[1], gbs(s[1]));
  fmt::print(
      "  {:<52} {:9.2f} ms  (per rank {:.3f} GB: {:.3f} read, {:.3f} read-modify-written, {:.3f} "
      "copied; "
      "at the fastest roof, {:.2f} GB/s)\n",
      "memory-traffic bound", bound * 1e3, bytes / 1e9, b_of.read_bytes / 1e9, b_of.rmw_bytes / 1e9,
      b_of.copy_bytes / 1e9, Bound::fastest(roofs) / 1e9);
  // Medians a script can read: bench/run_steps.sh sets tandem on threads against the baseline on
  // MPI processes (what a PyTorch DDP user runs) from two runs of this program.
  fmt::print("median {}_baseline_ms {:.3f}\nmedian {}_tandem_ms {:.3f}\n", label, s[0].median * 1e3,
             label, s[1].median * 1e3);
  print_ratio(label + "_speedup", s[0].median / s[1].median);
  print_ratio(label + "_vs_bound", s[1].median / bound);
  if (s[1].median < bound)
    fmt::print(
        "  note: tandem ran under the bound: it moved fewer bytes through memory than the bound "
        "counts "
        "(some came from a cache), so here the bound is not one\n");
}

}  // namespace

int optimizer_bench_main(Optimizer which, int argc, char** argv) {
  Options o = parse_options(argc, argv, kUsage);
  std::vector<int64_t> sizes;
  if (o.sizes.empty())
    o.sizes = o.quick ? std::vector<std::string>{"1Mi"} : std::vector<std::string>{"16Mi", "64Mi"};
  if (o.dtypes.empty()) o.dtypes = {"f32", "bf16"};
  try {
    for (const auto& s : o.sizes) sizes.push_back(tune::parse_extent(s, "--sizes"));
    std::vector<DType> dtypes;
    for (const auto& d : o.dtypes) {
      dtypes.push_back(parse_dtype(d));
      if (dtypes.back() == DType::F16)
        user_error("--dtypes: f16 has no baseline here (f32 or bf16)");
    }
    run_spmd(o, [&](Ranks& R) {
      const size_t copy_bytes = o.quick ? size_t{32} << 20 : size_t{256} << 20;
      RoofStreams streams(copy_bytes);
      for (int64_t n : sizes)
        for (DType t : dtypes) {
          // Measured next to each step's timing, and again in turns with it, so that both see
          // the same machine.
          const Roofs roofs = measure_roofs(R.comm, streams, 7);
          if (R.root())
            fmt::print(
                "\nroofs per rank with {} ranks streaming {} MiB at once ({} backend; the fastest "
                "of 7): copy "
                "{:.2f} GB/s, read {:.2f} GB/s, read-modify-write {:.2f} GB/s\n",
                R.comm.size(), copy_bytes >> 20, R.backend(), roofs.copy / 1e9, roofs.read / 1e9,
                roofs.rmw / 1e9);
          bench_one(R, o, which, n, t, streams, roofs);
        }
    });
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace tandem::bench
