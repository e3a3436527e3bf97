// Pipeline stage: group 0 (half the ranks) runs the Megatron layer and hands its output to group
// 1. Baseline: all-reduce in group 0, epilogue, then every rank sends the full output to its
// peer; tandem: the autotuned schedule, and the fused slice send (reduce-scatter with the
// epilogue inside, each rank sends its slice, group 1 all-gathers) timed alongside, and tandem's
// own unfused schedule (the program as written: all-reduce, epilogue loop, send), so that the
// headline is against the faster of the two unfused steps. A bound from the same run: what
// perfect overlap could reach, the largest of group 0's GEMM, the reduce-scatter any schedule
// needs (the faster of MPI's and tandem's), and the hand-off of the output's bytes once, each
// timed alone. 4 ranks by default (two groups of two: with one rank per group there is nothing to
// reduce or slice).
#include <fmt/format.h>

#include <algorithm>

#include "baselines/harness.h"
#include "baselines/layer.h"
#include "tandem/core/blas.h"
#include "tandem/core/error.h"
#include "tandem/dsl/workloads.h"
#include "tandem/schedule/lower.h"
#include "tandem/schedule/recipe.h"

namespace tandem::bench {
namespace {

const char* kUsage =
    "usage: bench_pipeline_stage [--quick] [--sizes B,K_PER_RANK,H (2048,1024,1024)] [--reps 10]\n"
    "                            [--warmup 2] [--tune-reps 3] [--retune] [--ranks 4]\n"
    "Threads by default; under `mpirun -np 4` the ranks are MPI processes.\n";

constexpr double kDropout = 0.1;
constexpr uint64_t kSeed = 1234;
constexpr int kTag = 11;

// The schedule CoCoNeT calls the fused slice send, or the closest one enumerated.
std::string slice_send_schedule(const dsl::Program& program) {
  std::string fallback;
  for (const auto& s : schedule::enumerate_schedules(program)) {
    if (s.name == "fused(RS-C)-P2P-AG") return s.name;
    const auto& c = s.recipe.collectives;
    const bool sends_slices =
        std::any_of(c.begin(), c.end(), [](const schedule::CollectiveRecipe& r) {
          return r.move == schedule::Move::ReorderTransfers;
        });
    if (fallback.empty() && sends_slices) fallback = s.name;
  }
  return fallback;
}

void bench(Ranks& R, const Options& o, int64_t B, int64_t Kp, int64_t H) {
  comm::Communicator& comm = R.comm;
  const int p = comm.size(), rank = comm.rank();
  if (p % 2 != 0)
    user_error("the pipeline stage needs an even number of ranks (two equal groups), not {}", p);
  const int half = p / 2, group = rank / half;
  const std::string label = fmt::format("pipeline_f32_{}", R.backend());
  if (R.root())
    fmt::print(
        "\npipeline stage, group 0 per rank [{} x {}] x [{} x {}] then to group 1, {} ranks ({} "
        "per group), {} "
        "backend; load average {} on {} hardware threads\n",
        B, Kp, Kp, H, p, half, R.backend(), load_average(), hardware_threads());

  const dsl::Program program = dsl::workloads::pipeline_stage(DType::F32, kDropout);
  const dsl::SymbolMap sizes = {{"B", B}, {"K", Kp * half}, {"H", H}};
  const Tuned tuned = tune_and_compile(R, program, sizes, o);
  print_tuning(R, tuned);
  const std::string slice_name = slice_send_schedule(program);

  // Group 0's inputs: its columns of x, rows of w; bias and residual the same on every rank.
  Tensor x = Tensor::empty(DType::F32, Shape{B, Kp}), w = Tensor::empty(DType::F32, Shape{Kp, H});
  Tensor bias = Tensor::empty(DType::F32, Shape{H}),
         residual = Tensor::empty(DType::F32, Shape{B, H});
  fill_uniform(x, 10 + static_cast<uint64_t>(rank), -1.0f, 1.0f);
  fill_uniform(w, 20 + static_cast<uint64_t>(rank), -0.05f, 0.05f);
  fill_uniform(bias, 30, -0.5f, 0.5f);
  fill_uniform(residual, 40, -1.0f, 1.0f);
  Tensor z = Tensor::empty(DType::F32, Shape{B, H}), out = Tensor::empty(DType::F32, Shape{B, H});

  // The baseline's group communicator.
  std::unique_ptr<comm::Communicator> gcomm;
  MPI_Comm gmpi = MPI_COMM_NULL;
  if (R.is_mpi())
    MPI_Comm_split(R.mpi, group, rank, &gmpi);
  else
    gcomm = comm.split(group, rank);

  auto baseline = [&] {
    if (group == 0) {
      blas::sgemm(false, false, static_cast<int>(B), static_cast<int>(H), static_cast<int>(Kp),
                  1.0f, x.data_as<float>(), static_cast<int>(Kp), w.data_as<float>(),
                  static_cast<int>(H), 0.0f, z.data_as<float>(), static_cast<int>(H));
      if (R.is_mpi())
        MPI_Allreduce(MPI_IN_PLACE, z.data(), static_cast<int>(B * H), MPI_FLOAT, MPI_SUM, gmpi);
      else
        gcomm->all_reduce(z, comm::ReduceOp::Sum);
      bias_dropout_residual(z.data_as<float>(), bias.data_as<float>(), residual.data_as<float>(),
                            out.data_as<float>(), B, H, kSeed, kDropout);
      if (R.is_mpi())
        MPI_Send(out.data(), static_cast<int>(B * H), MPI_FLOAT, rank + half, kTag, R.mpi);
      else
        comm.send(out, rank + half, kTag);
    } else {
      if (R.is_mpi())
        MPI_Recv(out.data(), static_cast<int>(B * H), MPI_FLOAT, rank - half, kTag, R.mpi,
                 MPI_STATUS_IGNORE);
      else
        comm.recv(out, rank - half, kTag);
    }
  };

  // The tuned winner runs at its record's chunk size; the other schedules at the process's.
  auto make_runner = [&](std::shared_ptr<const exec::CompiledPlan> compiled,
                         size_t chunk_bytes = 0) {
    exec::RunnerOptions options;
    options.chunk_bytes = chunk_bytes;
    auto run = std::make_unique<exec::CompiledRunner>(std::move(compiled), comm, sizes, options);
    if (group == 0) {
      run->load("x", x);
      run->load("w", w);
      run->load("bias", bias);
      run->load("residual", residual);
    }
    run->set_scalar("seed", static_cast<double>(kSeed));
    return run;
  };
  auto tandem = make_runner(tuned.compiled, tuned.result.record.chunk_bytes);
  const bool slice_differs = !slice_name.empty() && slice_name != tuned.result.record.winner;
  std::unique_ptr<exec::CompiledRunner> sliced;
  if (slice_differs)
    sliced = make_runner(
        exec::compile_plan(schedule::schedule_by_name(program, slice_name).schedule.lower()));
  const schedule::Recipe as_written = schedule::Recipe::unscheduled(program);
  auto unfused = make_runner(exec::compile_plan(as_written.apply(program).lower()));

  // Check: the layer's output on group 0 and what group 1 received, against the baseline's.
  baseline();
  const std::string name = group == 0 ? "out" : "h";
  tandem->run();
  std::string bad = compare(name + " (tandem)", tandem->output(name), out, 1e-4);
  if (sliced) {
    sliced->run();
    if (bad.empty()) bad = compare(name + " (slice send)", sliced->output(name), out, 1e-4);
  }
  unfused->run();
  if (bad.empty()) bad = compare(name + " (unfused)", unfused->output(name), out, 1e-4);
  require_agreement(R, bad);

  // The bound's parts, each alone: group 0's GEMM and epilogue, its reduce-scatter of the product,
  // and the output's rows handed over once (each rank of group 0 sends its 1/half to its peer).
  const int64_t rows = B / half;
  const Tensor part = Tensor::empty(DType::F32, Shape{rows, H});
  const Tensor my_rows = z.flat_slice(static_cast<int64_t>(rank % half) * rows * H, rows * H);
  auto gemm = [&] {
    if (group == 0)
      blas::sgemm(false, false, static_cast<int>(B), static_cast<int>(H), static_cast<int>(Kp),
                  1.0f, x.data_as<float>(), static_cast<int>(Kp), w.data_as<float>(),
                  static_cast<int>(H), 0.0f, z.data_as<float>(), static_cast<int>(H));
  };
  auto epilogue = [&] {
    if (group == 0)
      bias_dropout_residual(z.data_as<float>(), bias.data_as<float>(), residual.data_as<float>(),
                            out.data_as<float>(), B, H, kSeed, kDropout);
  };
  auto reduce_scatter = [&] {
    if (group != 0) return;
    if (R.is_mpi())
      MPI_Reduce_scatter_block(z.data(), part.data(), static_cast<int>(rows * H), MPI_FLOAT,
                               MPI_SUM, gmpi);
    else
      gcomm->reduce_scatter(z.flat_slice(0, rows * half * H), part, comm::ReduceOp::Sum);
  };
  // tandem's own reduce-scatter, on MPI processes too, on buffers from the group's allocator (as
  // the runners' are: one node's ranks read them directly).
  std::unique_ptr<comm::Communicator> tgroup = R.is_mpi() ? comm.split(group, rank) : nullptr;
  Tensor z_comm, part_comm;
  if (tgroup) {
    Allocator& a = comm::buffer_allocator(*tgroup, host_allocator());
    z_comm = Tensor::zeros(DType::F32, Shape{rows * half * H}, a);
    part_comm = Tensor::zeros(DType::F32, Shape{rows * H}, a);
  }
  auto tandem_reduce_scatter = [&] {
    if (group == 0) tgroup->reduce_scatter(z_comm, part_comm, comm::ReduceOp::Sum);
  };
  auto hand_off = [&] {
    const int peer = group == 0 ? rank + half : rank - half;
    const Tensor& buf = group == 0 ? my_rows : part;
    if (R.is_mpi()) {
      if (group == 0)
        MPI_Send(buf.data(), static_cast<int>(rows * H), MPI_FLOAT, peer, kTag, R.mpi);
      else
        MPI_Recv(buf.data(), static_cast<int>(rows * H), MPI_FLOAT, peer, kTag, R.mpi,
                 MPI_STATUS_IGNORE);
    } else if (group == 0) {
      comm.send(buf, peer, kTag);
    } else {
      comm.recv(buf, peer, kTag);
    }
  };

  std::vector<Contender> contenders = {{"baseline", baseline, {}},
                                       {"tandem", [&] { tandem->run(); }, {}},
                                       {"unfused", [&] { unfused->run(); }, {}},
                                       {"gemm", gemm, {}},
                                       {"epilogue", epilogue, {}},
                                       {"reduce_scatter", reduce_scatter, {}},
                                       {"hand_off", hand_off, {}}};
  // (On threads the reduce-scatter above is tandem's own already.)
  const size_t tandem_rs = contenders.size();
  if (tgroup) contenders.push_back({"tandem_reduce_scatter", tandem_reduce_scatter, {}});
  const size_t slice = contenders.size();
  if (sliced) contenders.push_back({"slice", [&] { sliced->run(); }, {}});
  const std::vector<Stats> s = time_interleaved(comm, contenders, o.warmup, o.reps);
  if (gmpi != MPI_COMM_NULL) MPI_Comm_free(&gmpi);
  if (!R.root()) return;
  const std::string coll = R.is_mpi() ? "MPI_Allreduce + MPI_Send" : "thread all_reduce + send";
  print_row(fmt::format("baseline: sgemm + {} of the full output", coll), s[0]);
  print_row(fmt::format("tandem: {}", tuned.result.record.winner), s[1]);
  print_row(fmt::format("tandem unfused: {} (the program as written)", as_written.str()), s[2]);
  if (sliced) print_row(fmt::format("fused slice send: {}", slice_name), s[slice]);
  print_row("  group 0's sgemm alone", s[3]);
  print_row("  group 0's epilogue loop alone", s[4]);
  print_row(fmt::format("  group 0's {} alone",
                        R.is_mpi() ? "MPI_Reduce_scatter_block" : "reduce_scatter"),
            s[5]);
  if (tgroup) print_row("  group 0's tandem reduce_scatter alone", s[tandem_rs]);
  print_row(fmt::format("  hand-off alone: each rank of group 0 sends its {} rows", rows), s[6]);
  // The epilogue loop above is the baseline's, not a roof (tandem's own runs several times
  // faster), so the bound leaves it out and is the looser for it.
  const double rs_floor = tgroup ? std::min(s[5].median, s[tandem_rs].median) : s[5].median;
  const double bound = std::max({s[3].median, rs_floor, s[6].median});
  fmt::print(
      "  bound: perfect overlap, max(sgemm, the faster reduce-scatter, hand-off) = {:.2f} ms\n",
      bound * 1e3);
  print_ratio(label + "_speedup", s[0].median / s[1].median);
  // The headline: against the faster unfused step, the baseline's or tandem's own.
  print_ratio(label + "_speedup_vs_best_unfused", std::min(s[0].median, s[2].median) / s[1].median);
  if (!slice_name.empty())
    print_ratio(label + "_slice_send_speedup", s[0].median / (sliced ? s[slice] : s[1]).median);
  print_ratio(label + "_vs_bound", s[1].median / bound);
}

}  // namespace
}  // namespace tandem::bench

int main(int argc, char** argv) {
  using namespace tandem::bench;
  Options o = parse_options(argc, argv, kUsage, 4);
  try {
    const std::vector<int64_t> dims = layer_dims(o, {2048, 1024, 1024}, {128, 64, 64});
    run_spmd(o, [&](Ranks& R) { bench(R, o, dims[0], dims[1], dims[2]); });
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
