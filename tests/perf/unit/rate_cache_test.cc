// The rates' cache: a second load reads the same rates without measuring, another request (other
// shapes, threads, ranks here, tiers) is measured for itself, a damaged file is measured again
// and replaced, TANDEM_PERF_REMEASURE=1 measures anew, and the file is private. The measurement
// is injected: no test here times anything.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "support/scratch.h"
#include "tandem/perf/rates.h"

namespace tandem::perf {
namespace rate_cache_test {

namespace fs = std::filesystem;
using tandem::testing::ScratchDir;
using tandem::testing::user_error_of;

RateRequest request() {
  RateRequest q;
  q.model.n_layers = 2;
  q.model.d_model = 32;
  q.ranks = 4;
  q.local_ranks = 4;
  q.threads = 1;
  return q;
}

// A measurement that counts its calls and returns rates that differ each time.
struct FakeMeasure {
  int calls = 0;
  Rates operator()(const RateRequest& q) {
    ++calls;
    Rates r;
    r.gemm_flops_per_s[1] = 1e9 * calls;
    r.gemm_flops_per_s[2] = 0.9e9 * calls;
    r.gemm_alone_flops_per_s = {{1, 1.5e9 * calls}, {2, 1.4e9 * calls}};
    r.gemm_core_flops_per_s = {{1, 1.25e9 * calls}, {2, 1.2e9 * calls}};
    r.host_ranks = q.local_ranks;
    r.host_slots = 1.5;
    r.link_core_share = 0.375;
    r.update_core_share = 0.25;
    r.attention = {1.5, 1.25};
    r.link_bytes_per_s = 2e9;
    r.link_latency_s = 1e-5;
    r.swap_tier = {1e9, 2e9};
    r.update_params_per_s = 3e8;
    r.embedding_token_s = 2e-7;
    r.zero_floats_per_s = 4e9;
    r.compute_source = "fake " + std::to_string(q.threads);
    return r;
  }
};

Rates cached(const std::string& dir, FakeMeasure& m, const RateRequest& q, bool* hit) {
  return cached_rates(q, dir, hit, [&m](const RateRequest& r) { return m(r); });
}

TEST(RateCache, ASecondLoadReadsTheSameRates) {
  ScratchDir dir;
  FakeMeasure m;
  bool hit = true;
  const Rates first = cached(dir.path("cache"), m, request(), &hit);
  EXPECT_FALSE(hit);
  const Rates second = cached(dir.path("cache"), m, request(), &hit);
  EXPECT_TRUE(hit);
  EXPECT_EQ(m.calls, 1);
  EXPECT_EQ(second.to_json(), first.to_json());
  EXPECT_EQ(second.gemm_flops_per_s, first.gemm_flops_per_s);
  // The rates with the host's ranks computing at once, and alone, both kept.
  EXPECT_EQ(second.gemm_alone_flops_per_s, first.gemm_alone_flops_per_s);
  EXPECT_EQ(second.gemm_alone_flops_per_s.at(2), 1.4e9);
  // A core's rate while the host's cores are busy, and how many ranks share how many cores.
  EXPECT_EQ(second.gemm_core_flops_per_s, first.gemm_core_flops_per_s);
  EXPECT_EQ(second.gemm_core_flops_per_s.at(1), 1.25e9);
  EXPECT_EQ(second.host_ranks, 4);
  EXPECT_EQ(second.host_slots, 1.5);
  // The cores' share of a second of the link and of the update.
  EXPECT_EQ(second.link_core_share, 0.375);
  EXPECT_EQ(second.update_core_share, 0.25);
  EXPECT_EQ(second.attention.forward, 1.5);
  EXPECT_EQ(second.update_params_per_s, 3e8);
  EXPECT_EQ(second.embedding_token_s, 2e-7);
  EXPECT_EQ(second.zero_floats_per_s, 4e9);
}

// The GEMM rate is measured with the ranks on this machine computing at once: how many they are
// is part of the key, and a key of rates measured before a core's rate was (v2 and before), or
// the cores' share of the link's and the update's seconds (v3), or the step's other work (v4), is
// not this one.
TEST(RateCache, TheKeyCountsTheRanksComputingAtOnce) {
  RateRequest alone = request(), four = request();
  alone.local_ranks = 1;
  EXPECT_NE(alone.key(), four.key());
  const nlohmann::json k = nlohmann::json::parse(four.key());
  EXPECT_EQ(k.at("local_ranks"), 4);
  EXPECT_EQ(k.at("what"), "tandem performance-model rates v6");
}

TEST(RateCache, WhatTheRatesDependOnIsTheKey) {
  ScratchDir dir;
  FakeMeasure m;
  bool hit = false;
  cached(dir.path("cache"), m, request(), &hit);
  RateRequest wider = request();
  wider.model.d_model = 64;
  RateRequest threads = request();
  threads.threads = 2;
  RateRequest here = request();
  here.local_ranks = 2;
  RateRequest tiers = request();
  tiers.state_tier = ooc::TierSpec{};
  for (const RateRequest& q : {wider, threads, here, tiers}) {
    cached(dir.path("cache"), m, q, &hit);
    EXPECT_FALSE(hit) << q.key();
  }
  EXPECT_EQ(m.calls, 5);
  cached(dir.path("cache"), m, threads, &hit);
  EXPECT_TRUE(hit);
}

TEST(RateCache, ADamagedFileIsMeasuredAgain) {
  ScratchDir dir;
  FakeMeasure m;
  bool hit = false;
  cached(dir.path("cache"), m, request(), &hit);
  const std::vector<std::string> files = dir.list("cache/perf");
  ASSERT_EQ(files.size(), 1u);
  const fs::path file = fs::path(dir.path("cache/perf")) / files[0];
  for (const char* damaged : {"{\"key\": ", "[]", "{\"key\": 1, \"rates\": {}}"}) {
    SCOPED_TRACE(damaged);
    std::ofstream(file, std::ios::trunc) << damaged;
    const int before = m.calls;
    const Rates r = cached(dir.path("cache"), m, request(), &hit);
    EXPECT_FALSE(hit);
    EXPECT_EQ(m.calls, before + 1);
    EXPECT_EQ(r.gemm_flops_per_s.at(1), 1e9 * m.calls);
    cached(dir.path("cache"), m, request(), &hit);  // rewritten: read back now
    EXPECT_TRUE(hit);
  }
  struct stat st;
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

TEST(RateCache, RemeasureMeasuresAnew) {
  ScratchDir dir;
  FakeMeasure m;
  bool hit = false;
  cached(dir.path("cache"), m, request(), &hit);
  ::setenv("TANDEM_PERF_REMEASURE", "1", 1);
  const Rates again = cached(dir.path("cache"), m, request(), &hit);
  ::unsetenv("TANDEM_PERF_REMEASURE");
  EXPECT_FALSE(hit);
  EXPECT_EQ(m.calls, 2);
  EXPECT_EQ(cached(dir.path("cache"), m, request(), &hit).to_json(), again.to_json());
  EXPECT_TRUE(hit);
}

// Rates that read back wrong name what is wrong.
TEST(RateCache, RatesFromJsonNameWhatIsWrong) {
  FakeMeasure m;
  nlohmann::json j = m(request()).to_json();
  EXPECT_EQ(Rates::from_json(j).to_json(), j);
  nlohmann::json missing = j;
  missing.erase("link_bytes_per_s");
  EXPECT_EQ(user_error_of([&] { Rates::from_json(missing); }),
            "the performance model's rates lack 'link_bytes_per_s'");
  nlohmann::json zero = j;
  zero["link_bytes_per_s"] = 0;
  EXPECT_EQ(user_error_of([&] { Rates::from_json(zero); }),
            "the performance model's rate 'link_bytes_per_s' is 0, not a positive number");
  nlohmann::json alone = j;
  alone.erase("gemm_alone_flops_per_s");
  EXPECT_EQ(user_error_of([&] { Rates::from_json(alone); }),
            "the performance model's rates lack 'gemm_alone_flops_per_s'");
  alone = j;
  alone["gemm_alone_flops_per_s"]["1"] = -1;
  EXPECT_EQ(user_error_of([&] { Rates::from_json(alone); }),
            "the performance model's GEMM rate alone at tp 1 is -1");
  nlohmann::json core = j;
  core.erase("gemm_core_flops_per_s");
  EXPECT_EQ(user_error_of([&] { Rates::from_json(core); }),
            "the performance model's rates lack 'gemm_core_flops_per_s'");
  core = j;
  core["gemm_core_flops_per_s"]["2"] = 0;
  EXPECT_EQ(user_error_of([&] { Rates::from_json(core); }),
            "the performance model's GEMM rate a core at tp 2 is 0");
  nlohmann::json host = j;
  host["host_slots"] = 0.5;
  EXPECT_EQ(user_error_of([&] { Rates::from_json(host); }),
            "the performance model's host holds 4 ranks and 0.5 cores' worth of them, not at "
            "least 1 each");
  host = j;
  host["host_ranks"] = 0;
  EXPECT_EQ(user_error_of([&] { Rates::from_json(host); }),
            "the performance model's host holds 0 ranks and 1.5 cores' worth of them, not at "
            "least 1 each");
  host.erase("host_ranks");
  EXPECT_EQ(user_error_of([&] { Rates::from_json(host); }),
            "the performance model's rates lack 'host_ranks'");
  nlohmann::json share = j;
  share["link_core_share"] = 1.5;
  EXPECT_EQ(user_error_of([&] { Rates::from_json(share); }),
            "the performance model's 'link_core_share' is 1.5, not a share of a core from 0 to 1");
  share = j;
  share["update_core_share"] = -0.25;
  EXPECT_EQ(user_error_of([&] { Rates::from_json(share); }),
            "the performance model's 'update_core_share' is -0.25, not a share of a core from 0 "
            "to 1");
  share.erase("update_core_share");
  EXPECT_EQ(user_error_of([&] { Rates::from_json(share); }),
            "the performance model's rates lack 'update_core_share'");
  nlohmann::json other = j;
  other["embedding_token_s"] = -1e-6;
  EXPECT_EQ(user_error_of([&] { Rates::from_json(other); }),
            "the performance model's rates hold a negative latency, update rate, embedding time "
            "or zeroing rate");
  other.erase("zero_floats_per_s");
  EXPECT_EQ(user_error_of([&] { Rates::from_json(other); }),
            "the performance model's rates lack 'zero_floats_per_s'");
  nlohmann::json gemm = j;
  gemm["gemm_flops_per_s"] = nlohmann::json::object();
  EXPECT_EQ(user_error_of([&] { Rates::from_json(gemm); }),
            "the performance model's rates have no GEMM rate");
}

}  // namespace rate_cache_test
}  // namespace tandem::perf
