// A runner that runs another and then sleeps, for tests of the tuner's choices: the delay says how
// slow each schedule is made to look, so which one the tuner must pick is known. `alter`, when
// given, changes the results it reports (a schedule made wrong on purpose).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string_view>
#include <thread>
#include <utility>

#include "tandem/exec/runner.h"

namespace tandem::testing {

class SlowedRunner final : public exec::Runner {
 public:
  using Alter = std::function<void(exec::TensorMap&)>;
  // `after_run`, when given, is called after each run (and its delay): a test's record of what ran.
  SlowedRunner(std::unique_ptr<exec::Runner> inner, std::chrono::milliseconds delay,
               Alter alter = {}, std::function<void()> after_run = {})
      : inner_(std::move(inner)),
        delay_(delay),
        alter_(std::move(alter)),
        after_run_(std::move(after_run)) {}
  const dsl::Program& program() const override { return inner_->program(); }
  const exec::Placement& placement() const override { return inner_->placement(); }
  Tensor input(std::string_view name) const override { return inner_->input(name); }
  void bind(std::string_view name, const Tensor& memory) override { inner_->bind(name, memory); }
  Tensor output(std::string_view name) const override { return inner_->output(name); }
  size_t allocated_bytes() const override { return inner_->allocated_bytes(); }
  void set_scalar(std::string_view name, double value) override { inner_->set_scalar(name, value); }
  void run_leaving_sends() override { inner_->run_leaving_sends(); }
  void wait_sends() override { inner_->wait_sends(); }
  void run() override {
    inner_->run();
    if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
    if (after_run_) after_run_();
  }
  exec::TensorMap results() const override {
    exec::TensorMap out = inner_->results();
    if (alter_) alter_(out);
    return out;
  }

 private:
  std::unique_ptr<exec::Runner> inner_;
  std::chrono::milliseconds delay_;
  Alter alter_;
  std::function<void()> after_run_;
};

}  // namespace tandem::testing
