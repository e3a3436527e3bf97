// The Schedule value: its program before and after rewrites, its fused stages and overlaps, the
// history of transformations, and the TANDEM_DEBUG_IR pass printing.
#include "tandem/schedule/schedule.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cstdio>

#include "tandem/core/env.h"
#include "tandem/core/error.h"
#include "tandem/schedule/as_slice.h"
#include "tandem/schedule/dead_stages.h"
#include "tandem/schedule/fuse.h"
#include "tandem/schedule/lower.h"
#include "tandem/schedule/overlap.h"
#include "tandem/schedule/reorder.h"
#include "tandem/schedule/split.h"

namespace tandem::schedule {

std::string StageRef::str() const {
  return name.empty() ? fmt::format("%{}", id) : fmt::format("'{}'", name);
}

namespace {
std::atomic<int> g_debug_override{-1};
}  // namespace

bool debug_ir() {
  static const bool env = env_int("TANDEM_DEBUG_IR", 0) != 0;
  const int o = g_debug_override.load(std::memory_order_relaxed);
  return o < 0 ? env : o != 0;
}

void set_debug_ir(int on) {
  g_debug_override.store(on < 0 ? -1 : (on != 0 ? 1 : 0), std::memory_order_relaxed);
}

void run_pass(std::string_view name, const std::function<void()>& pass,
              const std::function<std::string()>& show) {
  const auto start = std::chrono::steady_clock::now();
  pass();
  if (!debug_ir()) return;
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  fmt::print(stderr, "tandem ir: after {} ({:.1f} us)\n{}\n", name, us, show());
}

Schedule::Schedule(dsl::Program program) : original_(program), program_(std::move(program)) {
  program_.validate();
}

std::string Schedule::name() const {
  if (!name_.empty()) return name_;
  if (history_.empty()) return "unscheduled";
  return fmt::format("{}", fmt::join(history_, "; "));
}

std::optional<int> Schedule::lookup(const StageRef& ref, std::string_view who,
                                    std::string* why) const {
  if (!ref.name.empty()) {
    if (auto id = program_.find(ref.name)) return *id;
    std::vector<std::string> named;
    for (const dsl::Stage& s : program_.stages())
      if (!s.name.empty()) named.push_back(s.name);
    *why = fmt::format("{}: program '{}' has no stage named '{}' (its named stages: {})", who,
                       program_.name(), ref.name, fmt::join(named, ", "));
    return std::nullopt;
  }
  if (ref.id < 0 || ref.id >= static_cast<int>(program_.stages().size())) {
    *why = fmt::format("{}: program '{}' has no stage %{} (it has {} stages)", who, program_.name(),
                       ref.id, program_.stages().size());
    return std::nullopt;
  }
  return ref.id;
}

int Schedule::resolve(const StageRef& ref, std::string_view who) const {
  std::string why;
  if (auto id = lookup(ref, who, &why)) return *id;
  user_error("{}", why);
}

int Schedule::fused_index(int id) const {
  for (size_t f = 0; f < fused_.size(); ++f)
    if (std::binary_search(fused_[f].stages.begin(), fused_[f].stages.end(), id))
      return static_cast<int>(f);
  return -1;
}

int Schedule::overlap_index(int id) const {
  for (size_t o = 0; o < overlaps_.size(); ++o)
    if (std::binary_search(overlaps_[o].stages.begin(), overlaps_[o].stages.end(), id))
      return static_cast<int>(o);
  return -1;
}

void Schedule::rewrite(dsl::Program program, const std::vector<int>& old_to_new) {
  auto remap = [&](std::vector<int>& ids) {
    std::vector<int> out;
    for (int id : ids) {
      const int n = old_to_new.at(static_cast<size_t>(id));
      if (n >= 0) out.push_back(n);
    }
    std::sort(out.begin(), out.end());
    ids = std::move(out);
  };
  for (FusedStage& f : fused_) {
    remap(f.stages);
    if (f.collective >= 0) f.collective = old_to_new.at(static_cast<size_t>(f.collective));
  }
  fused_.erase(std::remove_if(fused_.begin(), fused_.end(),
                              [](const FusedStage& f) { return f.stages.empty(); }),
               fused_.end());
  for (int& t : tracked_)
    if (t >= 0) t = old_to_new.at(static_cast<size_t>(t));
  for (Overlap& o : overlaps_) remap(o.stages);
  overlaps_.erase(std::remove_if(overlaps_.begin(), overlaps_.end(),
                                 [](const Overlap& o) { return o.stages.empty(); }),
                  overlaps_.end());
  program_ = std::move(program);
}

int Schedule::add_fused(FusedStage f) {
  std::sort(f.stages.begin(), f.stages.end());
  fused_.push_back(std::move(f));
  return static_cast<int>(fused_.size()) - 1;
}

int Schedule::add_overlap(Overlap o) {
  std::sort(o.stages.begin(), o.stages.end());
  overlaps_.push_back(std::move(o));
  return static_cast<int>(overlaps_.size()) - 1;
}

void Schedule::record(std::string what, std::chrono::steady_clock::time_point start) {
  history_.push_back(what);
  if (!debug_ir()) return;
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  std::string annotations;
  for (const FusedStage& f : fused_) {
    std::vector<std::string> names;
    for (int s : f.stages) names.push_back(program_.display_name(s));
    annotations += fmt::format("  fused: {{{}}}\n", fmt::join(names, ", "));
  }
  for (const Overlap& o : overlaps_) {
    std::vector<std::string> names;
    for (int s : o.stages) names.push_back(program_.display_name(s));
    annotations +=
        fmt::format("  overlapped in {} blocks: {{{}}}\n", o.blocks, fmt::join(names, ", "));
  }
  fmt::print(stderr, "tandem ir: after {} ({:.1f} us)\n{}{}\n", what, us, program_.str(),
             annotations);
}

Plan Schedule::lower() const { return schedule::lower(*this); }
std::string Schedule::str() const { return lower().str(); }

Schedule::SplitResult Schedule::split(const StageRef& allreduce) {
  return schedule::split(*this, allreduce);
}
std::vector<int> Schedule::reorder(const StageRef& allgather, const std::vector<StageRef>& stages) {
  return schedule::reorder(*this, allgather, stages);
}
int Schedule::fuse(const std::vector<StageRef>& stages) { return schedule::fuse(*this, stages); }
int Schedule::overlap(const std::vector<StageRef>& stages, int blocks) {
  return schedule::overlap(*this, stages, blocks);
}
void Schedule::as_slice(const StageRef& input) { schedule::as_slice(*this, input); }
void Schedule::eliminate_dead_stages() { schedule::eliminate_dead_stages(*this); }

}  // namespace tandem::schedule
