// The progress display: a redrawn status line on a terminal, periodic plain lines elsewhere.
#include "tandem/io/progress.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "tandem/io/console.h"

namespace tandem::io {

namespace {
double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

Progress::Progress(std::ostream& out, int64_t total_steps, ProgressOptions options,
                   int64_t first_step, std::function<double()> now_s)
    : out_(out),
      total_(total_steps),
      first_step_(first_step),
      opt_(options),
      now_(now_s ? std::move(now_s) : std::function<double()>(steady_seconds)),
      start_s_(now_()) {}

std::string Progress::line(int64_t step, double loss, std::optional<double> val_loss,
                           double tokens_per_s) const {
  std::string s = fmt::format("step {}/{}", step, total_);
  if (opt_.terminal && opt_.bar_width > 0 && total_ > 0) {
    const double frac =
        std::clamp(static_cast<double>(step) / static_cast<double>(total_), 0.0, 1.0);
    const int filled = static_cast<int>(frac * opt_.bar_width);
    s += fmt::format(" [{}{}]", std::string(static_cast<size_t>(filled), '#'),
                     std::string(static_cast<size_t>(opt_.bar_width - filled), '.'));
  }
  s += fmt::format("  loss {:.4f}", loss);
  const std::optional<double> val = val_loss ? val_loss : last_val_;
  if (val) s += fmt::format("  val {:.4f}", *val);
  s += "  " + io::format_rate(tokens_per_s);
  // Time left from the average pace since this run (or resumption) began.
  const double elapsed = now_() - start_s_;
  const int64_t done = step - first_step_;
  double eta = -1;
  if (step >= total_) {
    eta = 0;
  } else if (done > 0 && elapsed > 0) {
    eta = elapsed / static_cast<double>(done) * static_cast<double>(total_ - step);
  }
  s += step >= total_ ? fmt::format("  done in {}", io::format_duration(elapsed))
                      : "  ETA " + io::format_duration(eta);
  return s;
}

void Progress::draw(const std::string& text) {
  if (opt_.terminal) {
    // Back to column 0, write, clear whatever a longer previous line left to the right.
    out_ << '\r' << text << "\x1b[K" << std::flush;
    line_open_ = true;
  } else {
    out_ << text << '\n' << std::flush;
  }
  last_line_ = text;
}

void Progress::update(int64_t step, double loss, std::optional<double> val_loss,
                      double tokens_per_s) {
  const double now = now_();
  bool due = step >= total_ || val_loss.has_value();
  if (opt_.terminal) {
    due = due || now - last_draw_s_ >= opt_.redraw_interval_s;
  } else {
    due = due || !drawn_ || (opt_.every_steps > 0 && step % opt_.every_steps == 0) ||
          now - last_draw_s_ >= opt_.every_s;
  }
  if (!due) {
    if (val_loss) last_val_ = val_loss;
    return;
  }
  draw(line(step, loss, val_loss, tokens_per_s));
  if (val_loss) last_val_ = val_loss;
  last_draw_s_ = now;
  drawn_ = true;
}

void Progress::message(const std::string& text) {
  if (opt_.terminal && line_open_) {
    out_ << '\r' << "\x1b[K" << text << '\n' << '\r' << last_line_ << "\x1b[K" << std::flush;
  } else {
    out_ << text << '\n' << std::flush;
  }
}

void Progress::finish() {
  if (opt_.terminal && line_open_) out_ << '\n' << std::flush;
  line_open_ = false;
}

}  // namespace tandem::io
