// The progress display as a user sees it: exact lines on a log, the redrawn line on a terminal,
// redraw throttling, ETA, and messages that do not garble the bar.
#include "tandem/io/progress.h"

#include <gtest/gtest.h>

#include <sstream>

namespace tandem::io {
namespace {

struct FakeClock {
  double t = 100.0;
  std::function<double()> fn() {
    return [this] { return t; };
  }
};

TEST(Progress, PlainLinesEveryNStepsAndOnValidation) {
  std::ostringstream out;
  FakeClock clock;
  ProgressOptions opt;
  opt.terminal = false;
  opt.every_steps = 10;
  opt.every_s = 1e9;
  Progress p(out, 25, opt, 0, clock.fn());
  for (int step = 1; step <= 25; ++step) {
    clock.t += 0.5;
    std::optional<double> val;
    if (step == 15) val = 2.0;
    p.update(step, 3.0 - step * 0.05, val, 2000);
  }
  p.finish();
  EXPECT_EQ(out.str(),
            "step 1/25  loss 2.9500  2.0k tok/s  ETA 12s\n"
            "step 10/25  loss 2.5000  2.0k tok/s  ETA 8s\n"
            "step 15/25  loss 2.2500  val 2.0000  2.0k tok/s  ETA 5s\n"
            "step 20/25  loss 2.0000  val 2.0000  2.0k tok/s  ETA 3s\n"
            "step 25/25  loss 1.7500  val 2.0000  2.0k tok/s  done in 13s\n");
}

TEST(Progress, PlainLinesEveryNSeconds) {
  std::ostringstream out;
  FakeClock clock;
  ProgressOptions opt;
  opt.every_steps = 0;
  opt.every_s = 10;
  Progress p(out, 1000, opt, 0, clock.fn());
  for (int step = 1; step <= 30; ++step) {
    clock.t += 1.0;
    p.update(step, 1.0, std::nullopt, 100);
  }
  // Step 1 at once, then every 10 seconds.
  EXPECT_EQ(out.str(),
            "step 1/1000  loss 1.0000  100 tok/s  ETA 16m39s\n"
            "step 11/1000  loss 1.0000  100 tok/s  ETA 16m29s\n"
            "step 21/1000  loss 1.0000  100 tok/s  ETA 16m19s\n");
}

TEST(Progress, TerminalRedrawsOneLineAtMostFourTimesASecond) {
  std::ostringstream out;
  FakeClock clock;
  ProgressOptions opt;
  opt.terminal = true;
  opt.bar_width = 10;
  Progress p(out, 4, opt, 0, clock.fn());
  clock.t += 1.0;
  p.update(1, 2.0, std::nullopt, 500);  // drawn: the first
  clock.t += 0.1;
  p.update(2, 1.9, std::nullopt, 500);  // skipped: 0.1 s after the last redraw
  clock.t += 0.2;
  p.update(3, 1.8, std::nullopt, 500);  // drawn: 0.3 s after
  p.message("saved checkpoint to ckpt");
  clock.t += 0.01;
  p.update(4, 1.7, 1.75, 500);  // drawn: the last step, and a validation loss
  p.finish();
  const std::string clear = "\x1b[K";
  EXPECT_EQ(out.str(),
            "\rstep 1/4 [##........]  loss 2.0000  500 tok/s  ETA 3s" + clear +
                "\rstep 3/4 [#######...]  loss 1.8000  500 tok/s  ETA 0s" + clear + "\r" + clear +
                "saved checkpoint to ckpt\n" +
                "\rstep 3/4 [#######...]  loss 1.8000  500 tok/s  ETA 0s" + clear +
                "\rstep 4/4 [##########]  loss 1.7000  val 1.7500  500 tok/s  done in 1s" + clear +
                "\n");
}

TEST(Progress, EtaCountsFromTheResumedStep) {
  std::ostringstream out;
  FakeClock clock;
  ProgressOptions opt;
  Progress p(out, 100, opt, /*first_step=*/50, clock.fn());
  clock.t += 10;
  EXPECT_EQ(p.line(60, 1.0, std::nullopt, 100), "step 60/100  loss 1.0000  100 tok/s  ETA 40s");
  EXPECT_EQ(p.line(50, 1.0, std::nullopt, 100), "step 50/100  loss 1.0000  100 tok/s  ETA ?");
}

TEST(Progress, PlainMessagesAreOrdinaryLines) {
  std::ostringstream out;
  FakeClock clock;
  Progress p(out, 10, ProgressOptions{}, 0, clock.fn());
  p.message("hello");
  p.finish();
  EXPECT_EQ(out.str(), "hello\n");
}

}  // namespace
}  // namespace tandem::io
