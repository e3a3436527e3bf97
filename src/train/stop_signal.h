// SIGTERM and SIGINT during training (a batch scheduler's notice before a job's end, Ctrl-C): the
// first asks the run to stop cleanly after the step in progress, with a checkpoint under --save;
// a second ends the process at once. Internal to train/.
#pragma once

namespace tandem::train::detail {

// Installs the handlers while it lives, restoring the previous ones after.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first signal received since construction (SIGTERM or SIGINT), or 0.
  static int received();
};

}  // namespace tandem::train::detail
