// The progress display of `tandem train`: on a terminal one line redrawn in place (step/total, a
// bar, loss, validation loss, tokens/s, time left) at most a few times a second; elsewhere (a log
// file, CI) plain lines every N steps or seconds. The output stream, the terminal flag and the
// clock are injected, so tests see exactly what a user sees.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>

namespace tandem::io {

struct ProgressOptions {
  bool terminal = false;
  double redraw_interval_s = 0.25;  // terminal: at most 4 redraws a second
  int64_t every_steps = 50;         // not a terminal: a line at every multiple of N steps ...
  double every_s = 30.0;            // ... or every S seconds, whichever comes first
  int bar_width = 20;
};

class Progress {
 public:
  // Steps are counted from `first_step` (a resumed run starts there) to `total_steps`.
  // `now_s` returns seconds on a monotonic clock (default: steady_clock).
  Progress(std::ostream& out, int64_t total_steps, ProgressOptions options, int64_t first_step = 0,
           std::function<double()> now_s = {});

  // Step `step` is done. Prints or redraws when due; always on the last step and on a step that
  // carries a validation loss.
  void update(int64_t step, double loss, std::optional<double> val_loss, double tokens_per_s);
  // A line of its own (a warning, "saved checkpoint"), printed without garbling the bar.
  void message(const std::string& text);
  // Ends the display: the terminal line is finished with a newline.
  void finish();

  // The text of the status line for these values (no "\r", no newline).
  std::string line(int64_t step, double loss, std::optional<double> val_loss,
                   double tokens_per_s) const;

 private:
  void draw(const std::string& text);

  std::ostream& out_;
  int64_t total_, first_step_;
  ProgressOptions opt_;
  std::function<double()> now_;
  double start_s_;
  double last_draw_s_ = -1e300;
  bool drawn_ = false;
  std::optional<double> last_val_;
  std::string last_line_;
  bool line_open_ = false;  // terminal: a status line is on screen without its newline
};

}  // namespace tandem::io
