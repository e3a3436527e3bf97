// Metrics lines and Chrome traces: the exact JSON written, appending across a resume, and many
// rank threads recording into one trace at once.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "support/files.h"
#include "support/scratch.h"
#include "tandem/io/metrics.h"
#include "tandem/io/trace.h"

namespace tandem::io {
namespace {

using nlohmann::json;
using testing::ScratchDir;

TEST(Metrics, OneJsonObjectPerLine) {
  StepMetrics m;
  m.step = 10;
  m.loss = 2.5;
  m.val_loss = 2.75;
  m.tokens_per_s = 1024;
  m.phase_s = {{"forward", 0.125}, {"backward", 0.25}, {"optimizer", 0.0625}};
  m.extra = {{"lr", 0.001}};
  EXPECT_EQ(metrics_json_line(m),
            R"({"step":10,"loss":2.5,"val_loss":2.75,"tokens_per_s":1024.0,)"
            R"("phase_s":{"forward":0.125,"backward":0.25,"optimizer":0.0625},"lr":0.001})");
  StepMetrics bare;
  bare.step = 1;
  bare.loss = std::nan("");
  bare.tokens_per_s = 3.5;
  EXPECT_EQ(metrics_json_line(bare), R"({"step":1,"loss":null,"tokens_per_s":3.5})");
}

TEST(Metrics, WriterTruncatesOrAppends) {
  ScratchDir dir;
  const std::string path = dir.path("m.jsonl");
  {
    MetricsWriter w(path);
    for (int s = 1; s <= 3; ++s) {
      StepMetrics m;
      m.step = s;
      m.loss = 5.0 - s;
      w.write(m);
    }
  }
  {
    MetricsWriter w(path, /*append=*/true);  // a resumed run continues the file
    StepMetrics m;
    m.step = 4;
    m.val_loss = 0.75;
    w.write(m);
  }
  std::istringstream lines(testing::read_bytes(path));
  std::string line;
  int64_t step = 0;
  while (std::getline(lines, line)) {
    const json j = json::parse(line);
    EXPECT_EQ(j["step"], ++step);
  }
  EXPECT_EQ(step, 4);
  { MetricsWriter w(path); }  // a new run starts the file afresh
  EXPECT_EQ(testing::read_bytes(path), "");
}

// A run stopped mid-line (a full disk, a kill) leaves a partial last line: a resumed run cuts it
// off, so that every line of the file is one JSON object. A file of one partial line is emptied;
// a long file is searched back past the first 4096 bytes.
TEST(Metrics, AppendingCutsAPartialLastLine) {
  ScratchDir dir;
  const std::string path = dir.path("m.jsonl");
  StepMetrics m;
  m.step = 3;
  m.loss = 1.5;
  const std::string whole = R"({"step":1,"loss":2.0,"tokens_per_s":1.0})"
                            "\n";
  const std::string padding(5000, ' ');
  for (const std::string& before : {std::string(), whole, whole + whole, whole + padding + "\n"}) {
    for (const std::string& partial :
         {std::string(), std::string(R"({"step":2,"lo)"), R"({"step":2)" + padding}) {
      testing::write_bytes(path, before + partial);
      {
        MetricsWriter w(path, /*append=*/true);
        w.write(m);
      }
      EXPECT_EQ(testing::read_bytes(path), before + metrics_json_line(m) + "\n")
          << "before: " << before.size() << " bytes, partial: " << partial.size() << " bytes";
    }
  }
}

TEST(PhaseTimer, AccumulatesInFirstUseOrder) {
  PhaseTimer t;
  t.add("forward", 0.5);
  t.add("backward", 1.0);
  t.add("forward", 0.25);  // a second micro-batch
  {
    auto s = t.time("optimizer");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(t.phases().size(), 3u);
  EXPECT_EQ(t.phases()[0], (std::pair<std::string, double>{"forward", 0.75}));
  EXPECT_EQ(t.phases()[1].first, "backward");
  EXPECT_EQ(t.phases()[2].first, "optimizer");
  EXPECT_GE(t.phases()[2].second, 0.001);
  EXPECT_NEAR(t.total(), 1.75 + t.phases()[2].second, 1e-12);
  StepMetrics m;
  m.phase_s = t.phases();
  EXPECT_NE(metrics_json_line(m).find(R"("phase_s":{"forward":0.75,"backward":1.0,"optimizer":)"),
            std::string::npos);
  t.clear();
  EXPECT_TRUE(t.phases().empty());
}

TEST(Trace, ExactEventsWithNamedRows) {
  TraceRecorder t;
  t.record_us(1, "comm", "allreduce", 30.5, 10.25);
  t.record_us(0, "compute", "forward", 20, 5);
  t.record_us(0, "compute", "backward", 0, 8);
  t.record_us(0, "optimizer", "adamw", 40, 1);  // a stream with no fixed row comes after swap
  EXPECT_EQ(t.event_count(), 4u);
  EXPECT_EQ(t.json(),
            "{\"traceEvents\":[\n"
            R"({"name":"process_name","ph":"M","pid":0,"tid":0,"args":{"name":"rank 0"}},)"
            "\n"
            R"({"name":"process_sort_index","ph":"M","pid":0,"tid":0,"args":{"sort_index":0}},)"
            "\n"
            R"({"name":"process_name","ph":"M","pid":1,"tid":0,"args":{"name":"rank 1"}},)"
            "\n"
            R"({"name":"process_sort_index","ph":"M","pid":1,"tid":0,"args":{"sort_index":1}},)"
            "\n"
            R"({"name":"thread_name","ph":"M","pid":0,"tid":1,"args":{"name":"compute"}},)"
            "\n"
            R"({"name":"thread_sort_index","ph":"M","pid":0,"tid":1,"args":{"sort_index":1}},)"
            "\n"
            R"({"name":"thread_name","ph":"M","pid":0,"tid":4,"args":{"name":"optimizer"}},)"
            "\n"
            R"({"name":"thread_sort_index","ph":"M","pid":0,"tid":4,"args":{"sort_index":4}},)"
            "\n"
            R"({"name":"thread_name","ph":"M","pid":1,"tid":2,"args":{"name":"comm"}},)"
            "\n"
            R"({"name":"thread_sort_index","ph":"M","pid":1,"tid":2,"args":{"sort_index":2}},)"
            "\n"
            R"({"name":"backward","cat":"compute","ph":"X","ts":0.0,"dur":8.0,"pid":0,"tid":1},)"
            "\n"
            R"({"name":"forward","cat":"compute","ph":"X","ts":20.0,"dur":5.0,"pid":0,"tid":1},)"
            "\n"
            R"({"name":"adamw","cat":"optimizer","ph":"X","ts":40.0,"dur":1.0,"pid":0,"tid":4},)"
            "\n"
            R"({"name":"allreduce","cat":"comm","ph":"X","ts":30.5,"dur":10.25,"pid":1,"tid":2})"
            "\n"
            "],\"displayTimeUnit\":\"ms\"}\n");
}

TEST(Trace, SpansMeasureWallTime) {
  TraceRecorder t;
  {
    auto s = t.span(0, kComputeStream, "sleep");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const json j = json::parse(t.json());
  const json& ev = j["traceEvents"].back();
  EXPECT_EQ(ev["name"], "sleep");
  EXPECT_EQ(ev["ph"], "X");
  EXPECT_GE(ev["dur"].get<double>(), 2000.0);
  EXPECT_GE(ev["ts"].get<double>(), 0.0);
}

TEST(Trace, DisabledRecordsNothing) {
  TraceRecorder t(false);
  t.record_us(0, "compute", "x", 0, 1);
  { auto s = t.span(0, "compute", "y"); }
  EXPECT_EQ(t.event_count(), 0u);
  EXPECT_EQ(json::parse(t.json())["traceEvents"].size(), 0u);
}

TEST(Trace, ManyRankThreadsAtOnce) {
  constexpr int kRanks = 4, kEvents = 500;
  TraceRecorder t;
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&t, r] {
      for (int i = 0; i < kEvents; ++i) {
        auto s = t.span(r, i % 2 ? kCommStream : kComputeStream, "step");
        if (i % 50 == 0) t.record_us(r, kSwapStream, "prefetch", i, 1);
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(t.event_count(), static_cast<size_t>(kRanks * (kEvents + kEvents / 50)));

  ScratchDir dir;
  t.write(dir.path("trace.json"));
  const json j = json::parse(testing::read_bytes(dir.path("trace.json")));
  std::map<int, int> per_rank;
  std::set<std::pair<int, std::string>> named_rows;
  for (const json& e : j["traceEvents"]) {
    if (e["ph"] == "X") {
      ++per_rank[e["pid"].get<int>()];
      EXPECT_GE(e["dur"].get<double>(), 0.0);
    } else if (e["name"] == "thread_name") {
      named_rows.insert({e["pid"].get<int>(), e["args"]["name"].get<std::string>()});
    }
  }
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(per_rank[r], kEvents + kEvents / 50);
    for (const char* row : {"compute", "comm", "swap"})
      EXPECT_TRUE(named_rows.count({r, row})) << r << row;
  }
  EXPECT_EQ(dir.list(), std::vector<std::string>{"trace.json"});
}

}  // namespace
}  // namespace tandem::io
