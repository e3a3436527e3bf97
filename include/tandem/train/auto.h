// A setting the user may leave to tandem (`auto` on the command line): the value given, or, once
// the run has decided it, the value chosen and why. Every auto of a TrainConfig is one of these,
// decided once through decide(), the same on every rank (through comm/agree.h's vocabulary), in
// one step before the ranks start: grid_plan.h's resolve decides --grid auto, --gather-ahead auto
// (rank 0 measures, comm::decide_on_root), --tp-dtype auto and --grad-dtype auto (the
// autotuner's records read on each group the program runs on, comm::all_true). One cannot be
// decided there: --resident-blocks auto weighs the predicted step with each count of resident
// blocks, which needs the profile of the first step run on the rank's own model and memory, so
// each rank decides it after that profile and the tensor-parallel group takes the fewest
// (comm::all_min; rank_run.h's choose_resident_blocks). The start-up lines print each decision
// with its reason (train/settings.h's startup_lines).
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "tandem/core/error.h"

namespace tandem::train {

template <typename T>
class Auto {
 public:
  Auto() = default;  // auto: left to tandem
  // The user's value: nothing to decide, no reason to give.
  Auto(T given) : value_(std::move(given)), given_(true) {}  // NOLINT(google-explicit-constructor)

  bool is_auto() const { return !given_; }
  // Given, or decided.
  bool known() const { return value_.has_value(); }
  const T& value() const {
    TANDEM_CHECK(value_.has_value(), "an auto setting read before it was decided");
    return *value_;
  }
  // The value, or `unknown` while an auto is not decided (or, where it does not apply, never).
  T value_or(T unknown) const { return value_ ? *value_ : std::move(unknown); }
  // Why an auto was decided as it was ("" for a given value).
  const std::string& reason() const { return reason_; }

  // An auto's decision, made once.
  void decide(T value, std::string reason) {
    TANDEM_CHECK(is_auto() && !known(), "an auto setting decided twice, or a given one decided");
    value_ = std::move(value);
    reason_ = std::move(reason);
  }

  bool operator==(const Auto&) const = default;

 private:
  std::optional<T> value_;
  bool given_ = false;
  std::string reason_;
};

}  // namespace tandem::train
