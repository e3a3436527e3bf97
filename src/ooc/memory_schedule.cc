// Turns a plan into regions with lifetimes and arena offsets, and per-operation transfers and
// recomputations (see memory_schedule.h for the rules).
#include "tandem/ooc/memory_schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "tandem/core/allocator.h"
#include "tandem/core/bytes.h"
#include "tandem/core/error.h"

namespace tandem::ooc {
namespace {

uint64_t f32_bytes(const Shape& s) { return static_cast<uint64_t>(s.numel()) * sizeof(float); }

// Offsets of consecutive buffers of these sizes, each aligned for tensors; the total rounded for
// O_DIRECT.
std::vector<uint64_t> pack(const std::vector<uint64_t>& bytes, uint64_t& total) {
  std::vector<uint64_t> offsets;
  uint64_t at = 0;
  for (uint64_t b : bytes) {
    offsets.push_back(at);
    at = round_up(at + b, kTensorAlignment);
  }
  total = round_up(std::max<uint64_t>(at, 1), kRegionAlignment);
  return offsets;
}
std::vector<uint64_t> sizes(const std::vector<nn::ChainLayout::Buffer>& buffers) {
  std::vector<uint64_t> bytes;
  for (const auto& b : buffers) bytes.push_back(b.bytes());
  return bytes;
}
std::vector<uint64_t> sizes(const std::vector<Shape>& f32_shapes) {
  std::vector<uint64_t> bytes;
  for (const Shape& s : f32_shapes) bytes.push_back(f32_bytes(s));
  return bytes;
}

}  // namespace

std::vector<UnitOp> expand(const nn::ChainLayout& chain) {
  std::vector<UnitOp> ops;
  for (const auto& pass : chain.order)
    for (int i = 0; i < chain.units; ++i)
      ops.push_back(UnitOp{pass.forward, pass.micro, pass.forward ? i : chain.units - 1 - i});
  return ops;
}

uint64_t place(std::vector<Interval>& intervals) {
  std::vector<size_t> order(intervals.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (intervals[a].bytes != intervals[b].bytes) return intervals[a].bytes > intervals[b].bytes;
    return intervals[a].first < intervals[b].first;
  });
  std::vector<size_t> placed;
  uint64_t extent = 0;
  std::vector<std::pair<uint64_t, uint64_t>>
      busy;  // [begin, end) of placed intervals that overlap in time
  for (size_t i : order) {
    Interval& r = intervals[i];
    busy.clear();
    for (size_t p : placed) {
      const Interval& q = intervals[p];
      if (q.first <= r.last && r.first <= q.last) busy.emplace_back(q.offset, q.offset + q.bytes);
    }
    std::sort(busy.begin(), busy.end());
    uint64_t at = 0;
    for (const auto& [b, e] : busy) {
      if (at + r.bytes <= b) break;
      at = std::max(at, e);
    }
    r.offset = at;
    extent = std::max(extent, at + r.bytes);
    placed.push_back(i);
  }
  return extent;
}

int MemorySchedule::add_region(std::string name, uint64_t bytes, int first, int last) {
  TANDEM_CHECK(first <= last && first >= 0 && last < static_cast<int>(ops_.size()),
               "region {} lives over [{}, {}] of {} operations", name, first, last, ops_.size());
  regions_.push_back(Region{std::move(name), bytes, 0, first, last});
  return static_cast<int>(regions_.size()) - 1;
}

int MemorySchedule::add_transfer(Transfer t) {
  transfers_.push_back(t);
  return static_cast<int>(transfers_.size()) - 1;
}

int MemorySchedule::op_index(const UnitOp& op) const {
  for (size_t i = 0; i < ops_.size(); ++i)
    if (ops_[i] == op) return static_cast<int>(i);
  return -1;
}

const UnitRegions& MemorySchedule::unit_regions(int micro, int unit) const {
  return units_.at(static_cast<size_t>(micro)).at(static_cast<size_t>(unit));
}
int MemorySchedule::head_input(int micro) const {
  return head_input_.at(static_cast<size_t>(micro));
}
int MemorySchedule::head(int micro) const { return head_.at(static_cast<size_t>(micro)); }

uint64_t MemorySchedule::swapped_bytes() const {
  uint64_t b = 0;
  for (const Transfer& t : transfers_)
    if (t.write) b += t.bytes;
  return b;
}

MemorySchedule::MemorySchedule(const nn::ChainLayout& chain, const Plan& plan)
    : chain_(chain), plan_(plan), ops_(expand(chain)) {
  plan.validate();
  const int n = chain.units;
  if (static_cast<int>(plan.units.size()) != n)
    user_error(
        "out-of-core plan '{}' has {} units; this stage runs {} (two per block: attention "
        "and MLP)",
        plan.str(), plan.units.size(), n);
  const bool has_head = !chain.head.empty();
  if (!has_head && recomputes(plan.units.back()))
    user_error(
        "out-of-core plan '{}': the last unit of a stage that hands its output to the "
        "next stage cannot be recomputed (recomputing would send it again)",
        plan.str());
  TANDEM_CHECK(!chain.kinds.empty(), "a chain without unit kinds");
  for (const auto& k : chain.kinds) {
    uint64_t total = 0;
    buffer_offsets_.push_back(pack(sizes(k.buffers), total));
    buffers_bytes_.push_back(total);
  }
  input_bytes_ = round_up(f32_bytes(chain.input), kRegionAlignment);
  uint64_t head_bytes = 0, ws_bytes = 0;
  if (has_head) head_offsets_ = pack(sizes(chain.head), head_bytes);
  workspace_offsets_ = pack(sizes(chain.workspace), ws_bytes);

  int micros = 0;
  for (const auto& p : chain.order) micros = std::max(micros, p.micro + 1);
  auto idx = [&](bool fwd, int k, int u) {
    const int i = op_index(UnitOp{fwd, k, u});
    TANDEM_CHECK(i >= 0, "the step has no {} of unit {} for micro-batch {}",
                 fwd ? "forward" : "backward", u, k);
    return i;
  };
  const int last_op = static_cast<int>(ops_.size()) - 1;
  actions_.assign(ops_.size(), OpActions{});
  units_.assign(static_cast<size_t>(micros), std::vector<UnitRegions>(static_cast<size_t>(n)));
  head_input_.assign(static_cast<size_t>(micros), -1);
  head_.assign(static_cast<size_t>(micros), -1);
  workspace_ = add_region("workspace", ws_bytes, 0, last_op);

  // Writes wait where their source region's memory is next free to be reused.
  std::vector<std::pair<int, int>> writes;  // (transfer, source region)
  std::vector<Interval> tier;               // one per swapped (micro, unit)
  std::vector<int> tier_users;              // transfers placed by tier[i]
  for (int k = 0; k < micros; ++k) {
    const std::string m = fmt::format("m{}.", k);
    for (int j = 0; j < n; ++j) {
      const Decision d = plan.units[static_cast<size_t>(j)];
      const std::string name = m + chain.unit_name(j);
      const uint64_t buffers_bytes = buffers_bytes_[kind(j)];
      const int f = idx(true, k, j), b = idx(false, k, j);
      const int in_first = j == 0 ? f : idx(true, k, j - 1);
      // A swapped unit's memory is free after the operation its write overlaps (none for 's').
      const int release = d == Decision::SwapSync ? f : std::min(f + 1, last_op);
      UnitRegions& r = units_[static_cast<size_t>(k)][static_cast<size_t>(j)];
      const int in_last = d == Decision::Keep || d == Decision::Recompute ? b
                          : swaps(d)                                      ? release
                                                                          : f;
      const int buf_last = d == Decision::Keep ? b : swaps(d) ? release : f;
      r.input_fwd = add_region(name + ".input", input_bytes_, in_first, in_last);
      r.buffers_fwd = add_region(name + ".buffers", buffers_bytes, f, buf_last);
      if (swaps(d)) {
        const int read_op = std::min(b, std::max(b - plan.prefetch, release + 1));
        r.back = add_region(name + ".back", input_bytes_ + buffers_bytes, read_op, b);
        const int wx = add_transfer(Transfer{true, r.input_fwd, 0, input_bytes_, 0, k, j});
        const int wb =
            add_transfer(Transfer{true, r.buffers_fwd, 0, buffers_bytes, input_bytes_, k, j});
        const int rd =
            add_transfer(Transfer{false, r.back, 0, input_bytes_ + buffers_bytes, 0, k, j, wb});
        actions_[static_cast<size_t>(f)].issue_writes.push_back(wx);
        actions_[static_cast<size_t>(f)].issue_writes.push_back(wb);
        writes.emplace_back(wx, r.input_fwd);
        writes.emplace_back(wb, r.buffers_fwd);
        actions_[static_cast<size_t>(read_op)].issue_reads.push_back(rd);
        actions_[static_cast<size_t>(b)].finish_reads.push_back(rd);
        tier.push_back(Interval{input_bytes_ + buffers_bytes, f, b});
        tier_users.push_back(wx);
      }
    }
    // The head's input is the last unit's output.
    const int fl = idx(true, k, n - 1), bl = idx(false, k, n - 1);
    head_input_[static_cast<size_t>(k)] =
        add_region(m + "head.input", input_bytes_, fl, has_head ? bl : fl);
    if (has_head)
      head_[static_cast<size_t>(k)] = add_region(m + "head.buffers", head_bytes, fl, bl);
    // Recomputed segments [a, e]: re-run at the backward of e, each unit's regions live until
    // its own backward.
    for (int e = n - 1; e >= 0; --e) {
      const Decision d = plan.units[static_cast<size_t>(e)];
      if (d != Decision::Recompute && d != Decision::Continue) continue;
      int a = e;
      while (plan.units[static_cast<size_t>(a)] == Decision::Continue) --a;
      const int be = idx(false, k, e);
      for (int i = a; i <= e; ++i) {
        UnitRegions& r = units_[static_cast<size_t>(k)][static_cast<size_t>(i)];
        const std::string name = m + chain.unit_name(i);
        const int bi = idx(false, k, i);
        r.buffers_re = add_region(name + ".buffers.re", buffers_bytes_[kind(i)], be, bi);
        if (i > a) r.input_re = add_region(name + ".input.re", input_bytes_, be, bi);
        actions_[static_cast<size_t>(be)].recompute.push_back(i);
      }
      if (e < n - 1)
        units_[static_cast<size_t>(k)][static_cast<size_t>(e)].out_scratch =
            add_region(m + chain.unit_name(e) + ".out.re", input_bytes_, be, be);
      e = a;  // the loop's --e moves to the unit before the segment
    }
  }
  for (const auto& [t, src] : writes) {
    const int wait_at = regions_[static_cast<size_t>(src)].last_op + 1;
    if (wait_at <= last_op) actions_[static_cast<size_t>(wait_at)].finish_writes.push_back(t);
  }
  // Fast tier: every region at an offset.
  std::vector<Interval> iv;
  for (const Region& r : regions_) iv.push_back(Interval{r.bytes, r.first_op, r.last_op});
  peak_ = place(iv);
  for (size_t i = 0; i < regions_.size(); ++i) regions_[i].offset = iv[i].offset;
  // Slow tier: each swapped unit's input then buffers, contiguous, so one read brings both.
  tier_bytes_ = place(tier);
  for (size_t i = 0; i < tier.size(); ++i) {
    const int wx = tier_users[i];
    transfers_[static_cast<size_t>(wx)].tier_offset = tier[i].offset;
    transfers_[static_cast<size_t>(wx) + 1].tier_offset = tier[i].offset + input_bytes_;
    transfers_[static_cast<size_t>(wx) + 2].tier_offset = tier[i].offset;
  }
}

}  // namespace tandem::ooc
