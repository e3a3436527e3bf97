// Per-step training metrics as JSON lines (one object per line: step, loss, validation loss when
// measured, tokens/s, seconds per phase), for plotting and for comparing runs.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem::io {

struct StepMetrics {
  int64_t step = 0;
  double loss = 0.0;
  std::optional<double> val_loss;  // only on steps that evaluated
  double tokens_per_s = 0.0;
  // Seconds per phase, in the order they ran: {"forward", 0.12}, {"backward", 0.25}, ...
  std::vector<std::pair<std::string, double>> phase_s;
  // Anything else worth plotting (learning rate, gradient norm), as top-level fields.
  std::vector<std::pair<std::string, double>> extra;
};

// Seconds spent per named phase of a step, in the order phases first ran; a phase that runs
// several times a step (one forward per micro-batch) accumulates.
class PhaseTimer {
 public:
  using Clock = std::chrono::steady_clock;

  void add(std::string_view phase, double seconds);

  // Adds the time from construction to destruction to `phase`.
  class Scope {
   public:
    Scope(PhaseTimer* timer, std::string_view phase);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    PhaseTimer* timer_;
    std::string phase_;
    Clock::time_point begin_;
  };
  Scope time(std::string_view phase) { return Scope(this, phase); }

  const std::vector<std::pair<std::string, double>>& phases() const { return phases_; }
  double total() const;
  void clear() { phases_.clear(); }

 private:
  std::vector<std::pair<std::string, double>> phases_;
};

// One line, without the newline:
// {"step":10,"loss":2.5,"val_loss":2.75,"tokens_per_s":1024.0,"phase_s":{"forward":0.1},"lr":0.001}
// Non-finite numbers are written as null (JSON has no NaN).
std::string metrics_json_line(const StepMetrics& m);

// Appends one line per step to a file, each line written with one write(2) call as soon as it is
// recorded, so a crashed run's file holds every completed step and no partial line.
class MetricsWriter {
 public:
  // `append` continues the file of a resumed run, after its last whole line (a partial last line,
  // from a run stopped mid-write, is cut off); otherwise the file starts empty. An unwritable
  // path is a UserError naming it.
  explicit MetricsWriter(const std::string& path, bool append = false);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  void write(const StepMetrics& m);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace tandem::io
