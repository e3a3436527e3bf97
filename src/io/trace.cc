// The Chrome trace-event recorder.
#include "tandem/io/trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "tandem/io/atomic_file.h"

namespace tandem::io {

TraceRecorder::TraceRecorder(bool enabled) : enabled_(enabled), origin_(Clock::now()) {
  // Fixed rows first, so compute, comm and swap appear in that order for every rank.
  tids_.emplace(std::string(kComputeStream), 1);
  tids_.emplace(std::string(kCommStream), 2);
  tids_.emplace(std::string(kSwapStream), 3);
}

int TraceRecorder::tid_of(std::string_view stream) {
  auto it = tids_.find(stream);
  if (it != tids_.end()) return it->second;
  const int tid = static_cast<int>(tids_.size()) + 1;
  tids_.emplace(std::string(stream), tid);
  return tid;
}

void TraceRecorder::record(int rank, std::string_view stream, std::string_view name,
                           Clock::time_point begin, Clock::time_point end) {
  if (!enabled_) return;
  // Whole nanoseconds, so timestamps print with at most three decimals of a microsecond.
  const auto ns = [this](Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t - origin_).count();
  };
  const int64_t b = ns(begin), e = ns(end);
  record_us(rank, stream, name, static_cast<double>(b) / 1e3,
            static_cast<double>(std::max<int64_t>(e - b, 0)) / 1e3);
}

void TraceRecorder::record_us(int rank, std::string_view stream, std::string_view name,
                              double ts_us, double dur_us) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back({rank, tid_of(stream), std::string(name), ts_us, dur_us});
}

void TraceRecorder::merge(const std::string& their_json, int64_t their_origin_ns) {
  const auto j = nlohmann::json::parse(their_json);
  const double shift_us = static_cast<double>(their_origin_ns - origin_ns()) / 1e3;
  for (const auto& e : j.at("traceEvents"))
    if (e.value("ph", "") == "X")
      record_us(e.at("pid").get<int>(), e.value("cat", "compute"), e.at("name").get<std::string>(),
                e.at("ts").get<double>() + shift_us, e.at("dur").get<double>());
}

int64_t TraceRecorder::origin_ns() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(origin_.time_since_epoch()).count();
}

TraceRecorder::Span::Span(TraceRecorder* t, int rank, std::string_view stream,
                          std::string_view name)
    : trace_(t != nullptr && t->enabled() ? t : nullptr), rank_(rank) {
  if (trace_ == nullptr) return;
  stream_ = stream;
  name_ = name;
  begin_ = Clock::now();
}

TraceRecorder::Span::~Span() {
  if (trace_ != nullptr) trace_->record(rank_, stream_, name_, begin_, Clock::now());
}

size_t TraceRecorder::event_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

std::string TraceRecorder::json() const {
  using nlohmann::ordered_json;
  std::vector<Event> events;
  std::map<int, std::string> names;
  {
    std::lock_guard<std::mutex> lock(mu_);
    events = events_;
    for (const auto& [name, tid] : tids_) names[tid] = name;
  }
  std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    if (a.rank != b.rank) return a.rank < b.rank;
    if (a.tid != b.tid) return a.tid < b.tid;
    return a.ts_us < b.ts_us;
  });
  ordered_json list = ordered_json::array();
  // Metadata: Perfetto labels each process "rank r" and each row by its stream name, in order.
  std::set<int> ranks;
  std::set<std::pair<int, int>> rows;
  for (const Event& e : events) {
    ranks.insert(e.rank);
    rows.insert({e.rank, e.tid});
  }
  for (int r : ranks) {
    list.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", r},
                    {"tid", 0},
                    {"args", {{"name", fmt::format("rank {}", r)}}}});
    list.push_back({{"name", "process_sort_index"},
                    {"ph", "M"},
                    {"pid", r},
                    {"tid", 0},
                    {"args", {{"sort_index", r}}}});
  }
  for (const auto& [r, tid] : rows) {
    list.push_back({{"name", "thread_name"},
                    {"ph", "M"},
                    {"pid", r},
                    {"tid", tid},
                    {"args", {{"name", names[tid]}}}});
    list.push_back({{"name", "thread_sort_index"},
                    {"ph", "M"},
                    {"pid", r},
                    {"tid", tid},
                    {"args", {{"sort_index", tid}}}});
  }
  for (const Event& e : events)
    list.push_back({{"name", e.name},
                    {"cat", names[e.tid]},
                    {"ph", "X"},
                    {"ts", e.ts_us},
                    {"dur", e.dur_us},
                    {"pid", e.rank},
                    {"tid", e.tid}});
  // One event per line: readable, and diffs of two traces line up.
  std::string out = "{\"traceEvents\":[\n";
  for (size_t i = 0; i < list.size(); ++i) {
    out += list[i].dump();
    out += i + 1 < list.size() ? ",\n" : "\n";
  }
  out += "],\"displayTimeUnit\":\"ms\"}\n";
  return out;
}

void TraceRecorder::write(const std::string& path) const { write_file_atomic(path, json()); }

}  // namespace tandem::io
