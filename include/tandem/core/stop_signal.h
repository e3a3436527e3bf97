// SIGTERM and SIGINT during long work (a batch scheduler's notice before a job's end, Ctrl-C):
// the first asks the work to stop cleanly at its next safe point (training: after the step in
// progress, with a checkpoint under --save); a second ends the process at once.
#pragma once

#include <chrono>

namespace tandem {

// Installs the handlers while it lives, restoring the previous ones after. The first signal
// prints "<who>: SIGTERM: stopping after <point> (again: stop at once)"; both strings must
// outlive it (string literals).
class StopSignals {
 public:
  StopSignals(const char* who, const char* point);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first signal received since construction (SIGTERM or SIGINT), or 0.
  static int received();
  // When the first signal arrived (steady clock); meaningful only while received() != 0. A wait
  // for a peer gives up some time after it (comm's stop grace, communicator.h).
  static std::chrono::steady_clock::time_point received_at();
};

}  // namespace tandem
