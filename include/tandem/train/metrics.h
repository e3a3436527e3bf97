// Per-step training metrics as JSON lines (one object per line: step, loss, validation loss when
// measured, tokens/s, seconds per phase), for plotting and for comparing runs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tandem::train {

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

// One line, without the newline:
// {"step":10,"loss":2.5,"val_loss":2.75,"tokens_per_s":1024.0,"phase_s":{"forward":0.1},"lr":0.001}
// Non-finite numbers are written as null (JSON has no NaN).
std::string metrics_json_line(const StepMetrics& m);

// Appends one line per step to a file, each line written with one write(2) call as soon as it is
// recorded, so a crashed run's file holds every completed step and no partial line.
class MetricsWriter {
 public:
  // `append` continues the file of a resumed run; otherwise the file starts empty. An unwritable
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

}  // namespace tandem::train
