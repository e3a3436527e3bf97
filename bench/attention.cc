// Causal attention forward + backward: the fused, blocked kernel (flash_attention_*, saves the
// log-sum-exp) against the kernel that saves the softmax (attention_*), at GPT-2 XL's heads (25
// of 64) by default. Checks the two agree once, warms up, repeats, and prints the median and
// spread of each pass, GFLOP/s (the causal half of the products), the ratio, the bytes each
// saves for the backward and its scratch, and the process's peak resident memory. --products
// bf16 runs the fused kernel's block products on bf16 operands too (checked against the saved
// softmax to bf16's rounding; on a CPU without AVX512_BF16 they are widened to f32 for OpenBLAS,
// core/gemm.h: that measures the conversions' cost, not bf16 arithmetic).
//   build/release/bench/bench_attention [--seq 1024,2048] [--heads 25] [--kv-heads 25]
//       [--head-size 64] [--batch 1] [--reps 5] [--threads N] [--kernel both|fused|saved]
//       [--blocks 64x64,32x128,...] [--products f32,bf16]
// One kernel at a time (--kernel fused or saved) gives each one's peak resident memory alone.
#include <fmt/format.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tandem/core/bf16.h"
#include "tandem/core/blas.h"
#include "tandem/core/gemm.h"
#include "tandem/core/rng.h"
#include "tandem/nn/layers.h"

namespace {

using namespace tandem;
using namespace tandem::nn;

// Wall time, and the process's CPU time (all threads): on a shared machine the second moves
// less with the other users' load.
struct Timing {
  double median = 0, spread = 0, cpu = 0;  // ms: wall median, wall max - min, CPU median
};

double cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) / 1e6;
}

template <typename Fn>
Timing time_ms(int reps, Fn&& fn) {
  fn();  // warm-up
  std::vector<double> ms, cpu;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_ms();
    fn();
    cpu.push_back(cpu_ms() - c0);
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  std::sort(cpu.begin(), cpu.end());
  return {ms[ms.size() / 2], ms.back() - ms.front(), cpu[cpu.size() / 2]};
}

std::string cpu_line() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "unknown CPU", flags;
  while (std::getline(in, line)) {
    if (model == "unknown CPU" && line.rfind("model name", 0) == 0)
      model = line.substr(line.find(':') + 2);
    if (flags.empty() && line.rfind("flags", 0) == 0)
      for (const char* f : {"avx2", "avx512f", "avx512_bf16"})
        if ((line + " ").find(std::string(" ") + f + " ") != std::string::npos)
          flags += std::string(flags.empty() ? "" : " ") + f;
  }
  return model + " (" + flags + ")";
}

std::vector<int> ints(const std::string& s) {
  std::vector<int> v;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) v.push_back(std::atoi(item.c_str()));
  return v;
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

std::string mib(double bytes) { return fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024.0)); }

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> seqs = {1024};
  int B = 1, NH = 25, KVH = 0, HS = 64, reps = 5, threads = 0;
  std::string kernel = "both";
  std::vector<FlashBlocks> blocks = {FlashBlocks{}};
  std::vector<DType> products = {DType::F32};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--seq")
      seqs = ints(v);
    else if (a == "--heads")
      NH = std::atoi(v.c_str());
    else if (a == "--kv-heads")
      KVH = std::atoi(v.c_str());
    else if (a == "--head-size")
      HS = std::atoi(v.c_str());
    else if (a == "--batch")
      B = std::atoi(v.c_str());
    else if (a == "--reps")
      reps = std::atoi(v.c_str());
    else if (a == "--threads")
      threads = std::atoi(v.c_str());
    else if (a == "--kernel")
      kernel = v;
    else if (a == "--blocks") {
      blocks.clear();
      std::stringstream in(v);
      std::string item;
      while (std::getline(in, item, ','))
        blocks.push_back({std::atoi(item.c_str()), std::atoi(item.c_str() + item.find('x') + 1)});
    } else if (a == "--products") {
      products.clear();
      std::stringstream in(v);
      std::string item;
      while (std::getline(in, item, ',')) {
        if (item != "f32" && item != "bf16") {
          fmt::print(stderr, "--products {}: f32 or bf16\n", item);
          return 2;
        }
        products.push_back(item == "bf16" ? DType::BF16 : DType::F32);
      }
    } else {
      fmt::print(stderr, "unknown flag {}\n", a);
      return 2;
    }
  }
  if (KVH == 0) KVH = NH;
  if (threads > 0) blas::set_num_threads(threads);
  const bool fused = kernel != "saved", saved = kernel != "fused";
  fmt::print("{}\nBLAS {} threads={}; attention threads {}\n", cpu_line(), blas::kernel_name(),
             blas::num_threads(), std::min(blas::num_threads(), attention_max_threads()));
  fmt::print("causal attention, batch {}, {} query heads, {} key/value heads of {}\n", B, NH, KVH,
             HS);
  if (std::find(products.begin(), products.end(), DType::BF16) != products.end())
    fmt::print("bf16 products: {}, {}\n", gemm_library(DType::BF16), bf16_describe());
  AttentionDropout drop;  // none: GPT-2 XL's fine-tuning and Llama train without it
  for (int T : seqs) {
    const int64_t N = static_cast<int64_t>(B) * T, W = static_cast<int64_t>(NH + 2 * KVH) * HS,
                  C = static_cast<int64_t>(NH) * HS;
    std::vector<float> qkv(static_cast<size_t>(N * W)), dout(static_cast<size_t>(N * C));
    for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = 2.0f * random_uniform(1, i, 0) - 1.0f;
    for (size_t i = 0; i < dout.size(); ++i) dout[i] = 2.0f * random_uniform(2, i, 0) - 1.0f;
    std::vector<float> dqkv(qkv.size());
    // The useful multiply-adds, those of the causal half: 2 products forward, 4 backward (the
    // fused kernel's recomputed scores are a fifth, not counted), the same figure for both.
    const double pairs = static_cast<double>(T) * (T + 1) / 2.0 * B * NH * HS;
    fmt::print("\nT {}\n{:<16} {:>10} {:>10} {:>10} {:>8} {:>9} {:>9} {:>13} {:>13}\n", T, "kernel",
               "fwd ms", "bwd ms", "total ms", "spread%", "cpu ms", "GFLOP/s", "saved", "scratch");
    std::vector<float> out_saved;
    double saved_total = 0, saved_cpu = 0;
    if (saved) {
      std::vector<float> out(static_cast<size_t>(N * C)), att(static_cast<size_t>(B) * NH * T * T),
          scratch(static_cast<size_t>(attention_scratch_floats(T)));
      const Timing f = time_ms(reps, [&] {
        attention_forward(out.data(), att.data(), scratch.data(), qkv.data(), B, T, NH, KVH, HS,
                          drop);
      });
      const Timing b = time_ms(reps, [&] {
        attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T,
                           NH, KVH, HS, drop);
      });
      saved_total = f.median + b.median;
      saved_cpu = f.cpu + b.cpu;
      fmt::print("{:<16} {:>10.1f} {:>10.1f} {:>10.1f} {:>8.1f} {:>9.1f} {:>9.1f} {:>13} {:>13}\n",
                 "saved softmax", f.median, b.median, saved_total,
                 100.0 * (f.spread + b.spread) / saved_total, saved_cpu,
                 2.0 * 6 * pairs / saved_total / 1e6, mib(4.0 * att.size()),
                 mib(4.0 * scratch.size()));
      out_saved = out;
    }
    if (!fused) continue;
    for (const FlashBlocks& k : blocks)
      for (DType pt : products) {
        const bool half = pt == DType::BF16;
        std::vector<float> out(static_cast<size_t>(N * C)), lse(static_cast<size_t>(B) * NH * T),
            scratch(static_cast<size_t>(flash_attention_scratch_floats(T, HS, k, pt)));
        // Checked once against the saved-softmax kernel (when it ran), before timing: to f32's
        // rounding, or bf16's with bf16 products.
        flash_attention_forward(out.data(), lse.data(), scratch.data(), qkv.data(), B, T, NH, KVH,
                                HS, drop, k, pt);
        if (!out_saved.empty()) {
          double worst = 0, scale = 0;
          for (size_t i = 0; i < out.size(); ++i) {
            worst = std::max(worst, static_cast<double>(std::fabs(out[i] - out_saved[i])));
            scale = std::max(scale, static_cast<double>(std::fabs(out_saved[i])));
          }
          if (!(worst <= (half ? 2e-2 : 1e-5) * scale)) {
            fmt::print(stderr, "fused output differs by {} (max |out| {})\n", worst, scale);
            return 1;
          }
        }
        const Timing f = time_ms(reps, [&] {
          flash_attention_forward(out.data(), lse.data(), scratch.data(), qkv.data(), B, T, NH, KVH,
                                  HS, drop, k, pt);
        });
        const Timing b = time_ms(reps, [&] {
          flash_attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), out.data(),
                                   lse.data(), B, T, NH, KVH, HS, drop, k, pt);
        });
        const double total = f.median + b.median;
        fmt::print("{:<16} {:>10.1f} {:>10.1f} {:>10.1f} {:>8.1f} {:>9.1f} {:>9.1f} {:>13} {:>13}",
                   fmt::format("fused {}x{}{}", k.rows, k.cols, half ? " bf16" : ""), f.median,
                   b.median, total, 100.0 * (f.spread + b.spread) / total, f.cpu + b.cpu,
                   2.0 * 6 * pairs / total / 1e6, mib(4.0 * lse.size()), mib(4.0 * scratch.size()));
        // The speed-up over the saved-softmax kernel, in wall time and in CPU time.
        if (saved_total > 0)
          fmt::print("  {:.2f}x wall {:.2f}x cpu", saved_total / total,
                     saved_cpu / (f.cpu + b.cpu));
        fmt::print("\n");
      }
  }
  fmt::print("\npeak resident {:.0f} MiB\n", peak_rss_mib());
  return 0;
}
