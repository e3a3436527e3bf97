// Chrome trace-event recording (the JSON format chrome://tracing and Perfetto open): complete
// events ("ph": "X", microseconds) on one row per (rank, stream), with metadata events naming
// each process "rank <r>" and each row by its stream ("compute", "comm", "swap", "data"). Several
// rank threads record at once; the file is written atomically at the end.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::io {

// Streams with fixed row numbers, so rows appear in this order in every trace; other names get
// the next numbers in order of first use.
inline constexpr std::string_view kComputeStream = "compute";
inline constexpr std::string_view kCommStream = "comm";
inline constexpr std::string_view kSwapStream = "swap";
inline constexpr std::string_view kExchangeStream = "dp exchange";  // the communication thread
inline constexpr std::string_view kStateStream = "model state";     // --model-state's transfers
// Each rank assembling a step's batch from the corpus.
inline constexpr std::string_view kDataStream = "data";

class TraceRecorder {
 public:
  using Clock = std::chrono::steady_clock;

  // A disabled recorder (no --trace) records nothing and costs one branch per call.
  explicit TraceRecorder(bool enabled = true);

  bool enabled() const { return enabled_; }
  // Times are measured from this point (by default, construction).
  Clock::time_point origin() const { return origin_; }

  // One complete event: `name` ran on `stream` of `rank` from `begin` to `end`.
  void record(int rank, std::string_view stream, std::string_view name, Clock::time_point begin,
              Clock::time_point end);
  // The same with times in microseconds since origin() (for tests and replayed timings).
  void record_us(int rank, std::string_view stream, std::string_view name, double ts_us,
                 double dur_us);

  // Records from construction to destruction: `auto s = trace.span(0, "compute", "forward");`.
  class Span {
   public:
    Span(TraceRecorder* t, int rank, std::string_view stream, std::string_view name);
    ~Span();
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;

   private:
    TraceRecorder* trace_;
    int rank_;
    std::string stream_, name_;
    Clock::time_point begin_;
  };
  Span span(int rank, std::string_view stream, std::string_view name) {
    return Span(this, rank, stream, name);
  }

  // Another recorder's complete events (its json(), its origin() in nanoseconds of the same
  // steady clock) re-recorded on this one's origin: one process's trace from another's, so that
  // one file shows every rank (across machines the shift is only as good as their clocks).
  void merge(const std::string& their_json, int64_t their_origin_ns);
  // origin() in nanoseconds since the steady clock's epoch: what merge() takes.
  int64_t origin_ns() const;

  size_t event_count() const;
  // {"traceEvents": [...], "displayTimeUnit": "ms"}: metadata events first, then complete events
  // ordered by (rank, row, start time).
  std::string json() const;
  // Writes json() to `path` atomically (a failure leaves any previous file intact).
  void write(const std::string& path) const;

 private:
  struct Event {
    int rank;
    int tid;
    std::string name;
    double ts_us, dur_us;
  };
  int tid_of(std::string_view stream);  // callers hold mu_

  bool enabled_;
  Clock::time_point origin_;
  mutable std::mutex mu_;
  std::vector<Event> events_;
  std::map<std::string, int, std::less<>> tids_;
};

}  // namespace tandem::io
