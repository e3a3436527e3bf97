// The out-of-core runtime: arena placement, transfers and recomputation, operation by
// operation, as the MemorySchedule says.
#include "tandem/ooc/runtime.h"

#include <fmt/format.h>

#include <algorithm>

#include "tandem/core/bytes.h"
#include "tandem/core/error.h"

namespace tandem::ooc {
namespace {}  // namespace

// Hands out one region's memory to the Workspace, buffer after buffer, as it asks.
class Runtime::RegionAllocator final : public Allocator {
 public:
  RegionAllocator(char* base, const std::vector<uint64_t>& offsets)
      : base_(base), offsets_(offsets) {}
  void* allocate(size_t) override {
    TANDEM_CHECK(next_ < offsets_.size(), "workspace asked for more than {} buffers",
                 offsets_.size());
    return base_ + offsets_[next_++];
  }
  void deallocate(void*, size_t) noexcept override {}
  std::string_view name() const override { return "ooc-region"; }

 private:
  char* base_;
  const std::vector<uint64_t>& offsets_;
  size_t next_ = 0;
};

namespace {

double seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

Profile StepMeasure::profile(double write_bytes_per_s, double read_bytes_per_s) const {
  return median_profile({*this}, write_bytes_per_s, read_bytes_per_s);
}

Profile StepMeasure::median_profile(const std::vector<StepMeasure>& steps, double write_bytes_per_s,
                                    double read_bytes_per_s) {
  TANDEM_CHECK(!steps.empty(), "a profile needs a step");
  auto median = [&](std::vector<double> StepMeasure::*times) {
    std::vector<double> out;
    for (size_t j = 0; j < (steps.front().*times).size(); ++j) {
      std::vector<double> v;
      for (const StepMeasure& s : steps) v.push_back((s.*times)[j]);
      std::sort(v.begin(), v.end());
      out.push_back(v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]));
    }
    return out;
  };
  Profile p;
  p.forward_s = median(&StepMeasure::forward_s);
  p.backward_s = median(&StepMeasure::backward_s);
  p.recompute_s = median(&StepMeasure::recompute_s);
  for (size_t j = 0; j < p.recompute_s.size(); ++j)
    if (p.recompute_s[j] <= 0) p.recompute_s[j] = p.forward_s[j];
  p.write_bytes_per_s = write_bytes_per_s;
  p.read_bytes_per_s = read_bytes_per_s;
  return p;
}

Runtime::Runtime(const nn::GPTConfig& config, int B, int T, uint64_t budget)
    : config_(config), B_(B), T_(T), arena_(budget) {}

Runtime::~Runtime() {
  workspace_.reset();
  if (transfers_ != nullptr) {
    try {
      transfers_->wait_all();  // nothing may still read or write the arena
    } catch (...) {
    }
  }
}

void Runtime::set_schedule(const MemorySchedule& schedule, TransferEngine::Client* transfers,
                           SlowTier* tier) {
  TANDEM_CHECK(cursor_ == 0 && arena_.live_bytes() == 0,
               "schedule changed in the middle of a step");
  if (schedule.peak_bytes() > arena_.budget())
    user_error("out-of-core plan {} needs {} ({} bytes), more than the memory budget of {}",
               schedule.plan().str(), human_bytes(schedule.peak_bytes()), schedule.peak_bytes(),
               human_bytes(arena_.budget()));
  if (!schedule.transfers().empty() && (transfers == nullptr || tier == nullptr))
    internal_error(fmt::format("plan {} swaps but no slow tier was given", schedule.plan().str()));
  if (tier != nullptr && schedule.tier_bytes() > tier->capacity())
    internal_error(fmt::format("plan {} needs {} bytes of slow tier, it has {}",
                               schedule.plan().str(), schedule.tier_bytes(), tier->capacity()));
  schedule_ = std::make_unique<MemorySchedule>(schedule);
  transfers_ = transfers;
  tier_ = tier;
  const size_t ops = schedule.ops().size();
  starting_.assign(ops, {});
  ending_.assign(ops, {});
  for (size_t r = 0; r < schedule.regions().size(); ++r) {
    starting_[static_cast<size_t>(schedule.regions()[r].first_op)].push_back(static_cast<int>(r));
    ending_[static_cast<size_t>(schedule.regions()[r].last_op)].push_back(static_cast<int>(r));
  }
  tickets_.assign(schedule.transfers().size(), 0);
  const int n = schedule.chain().units;
  int micros = 0;
  for (const auto& p : schedule.chain().order) micros = std::max(micros, p.micro + 1);
  input_at_.assign(static_cast<size_t>(micros),
                   std::vector<uint64_t>(static_cast<size_t>(n) + 1, 0));
  buffers_at_.assign(static_cast<size_t>(micros), std::vector<uint64_t>(static_cast<size_t>(n), 0));
  // The workspace is live for the whole step: its region is placed now.
  const int ws = schedule.workspace();
  workspace_.reset();  // its buffers' deleters call the allocator it was made with
  workspace_alloc_ =
      std::make_unique<RegionAllocator>(arena_.at(offset_of(ws)), schedule_->workspace_offsets());
  workspace_ = std::make_unique<nn::Workspace>(config_, B_, T_, *workspace_alloc_);
  measuring_ = StepMeasure{};
  measuring_.forward_s.assign(static_cast<size_t>(n), 0);
  measuring_.backward_s.assign(static_cast<size_t>(n), 0);
  measuring_.recompute_s.assign(static_cast<size_t>(n), 0);
  counts_.assign(3 * static_cast<size_t>(n), 0);
}

uint64_t Runtime::offset_of(int region) const {
  return schedule_->regions()[static_cast<size_t>(region)].offset;
}

int Runtime::expect(bool forward, int k, int u) {
  TANDEM_CHECK(schedule_ != nullptr, "no out-of-core schedule set");
  TANDEM_CHECK(cursor_ < static_cast<int>(schedule_->ops().size()),
               "more operations than the step has");
  const UnitOp& op = schedule_->ops()[static_cast<size_t>(cursor_)];
  TANDEM_CHECK(op == (UnitOp{forward, k, u}),
               "the model ran the {} of unit {} (micro-batch {}) where "
               "the plan expects the {} of unit {} (micro-batch {})",
               forward ? "forward" : "backward", u, k, op.forward ? "forward" : "backward", op.unit,
               op.micro);
  return cursor_;
}

void Runtime::start_op(int i) {
  const auto begin = Clock::now();
  if (i == 0) {
    step_begin_ = begin;
    arena_.reset_high_water();
  }
  for (int r : starting_[static_cast<size_t>(i)]) {
    const Region& reg = schedule_->regions()[static_cast<size_t>(r)];
    arena_.acquire(reg.offset, reg.bytes, reg.name);
  }
  const OpActions& a = schedule_->actions()[static_cast<size_t>(i)];
  const auto& tr = schedule_->transfers();
  for (int w : a.finish_writes) transfers_->wait(tickets_[static_cast<size_t>(w)]);
  for (int r : a.issue_reads) {
    const Transfer& t = tr[static_cast<size_t>(r)];
    if (t.after_write >= 0) transfers_->wait(tickets_[static_cast<size_t>(t.after_write)]);
    tickets_[static_cast<size_t>(r)] = transfers_->read_async(
        *tier_, t.tier_offset, arena_.at(offset_of(t.region) + t.region_offset), t.bytes,
        fmt::format("m{}.{}", t.micro, schedule_->chain().unit_name(t.unit)));
  }
  for (int r : a.finish_reads) transfers_->wait(tickets_[static_cast<size_t>(r)]);
  mark_ = Clock::now();
  measuring_.stall_s += seconds(mark_ - begin);
}

void Runtime::end_op(int i) {
  for (int r : ending_[static_cast<size_t>(i)]) arena_.release(offset_of(r));
  if (++cursor_ == static_cast<int>(schedule_->ops().size())) {
    if (transfers_ != nullptr) transfers_->wait_all();
    cursor_ = 0;
    const int n = schedule_->chain().units;
    measuring_.step_s = seconds(Clock::now() - step_begin_);
    measuring_.high_water = arena_.high_water();
    for (int j = 0; j < n; ++j)
      for (int q = 0; q < 3; ++q) {
        auto& v = q == 0   ? measuring_.forward_s
                  : q == 1 ? measuring_.backward_s
                           : measuring_.recompute_s;
        const int c = counts_[static_cast<size_t>(3 * j + q)];
        if (c > 0) v[static_cast<size_t>(j)] /= c;
      }
    last_ = measuring_;
    for (auto* v : {&measuring_.forward_s, &measuring_.backward_s, &measuring_.recompute_s})
      std::fill(v->begin(), v->end(), 0.0);
    measuring_.stall_s = 0;
    std::fill(counts_.begin(), counts_.end(), 0);
  }
}

void Runtime::begin_forward(int k, int u) {
  const size_t m = micro(k), b = static_cast<size_t>(u);
  const int mk = static_cast<int>(m);
  const int n = schedule_->chain().units;
  if (!evaluating_) start_op(expect(true, k, u));
  const UnitRegions& r = schedule_->unit_regions(mk, u);
  input_at_[m][b] = offset_of(r.input_fwd);
  buffers_at_[m][b] = offset_of(r.buffers_fwd);
  input_at_[m][b + 1] = offset_of(u + 1 < n ? schedule_->unit_regions(mk, u + 1).input_fwd
                                            : schedule_->head_input(mk));
  mark_ = Clock::now();
}

void Runtime::end_forward(int k, int u) {
  if (evaluating_) return;
  const int i = cursor_;
  measuring_.forward_s[static_cast<size_t>(u)] += seconds(Clock::now() - mark_);
  ++counts_[static_cast<size_t>(3 * u)];
  const auto& tr = schedule_->transfers();
  for (int w : schedule_->actions()[static_cast<size_t>(i)].issue_writes) {
    const Transfer& t = tr[static_cast<size_t>(w)];
    tickets_[static_cast<size_t>(w)] = transfers_->write_async(
        *tier_, t.tier_offset, arena_.at(offset_of(t.region) + t.region_offset), t.bytes,
        fmt::format("m{}.{}", t.micro, schedule_->chain().unit_name(t.unit)));
  }
  end_op(i);
}

std::vector<int> Runtime::begin_backward(int k, int u) {
  TANDEM_CHECK(!evaluating_, "a backward during evaluation");
  const int i = expect(false, k, u);
  start_op(i);
  const size_t m = static_cast<size_t>(k);
  const int n = schedule_->chain().units;
  const UnitRegions& r = schedule_->unit_regions(k, u);
  const std::vector<int>& re = schedule_->actions()[static_cast<size_t>(i)].recompute;
  if (r.back >= 0) {
    input_at_[m][static_cast<size_t>(u)] = offset_of(r.back);
    buffers_at_[m][static_cast<size_t>(u)] = offset_of(r.back) + schedule_->input_bytes();
  }
  for (int b : re) {
    const UnitRegions& rb = schedule_->unit_regions(k, b);
    buffers_at_[m][static_cast<size_t>(b)] = offset_of(rb.buffers_re);
    if (rb.input_re >= 0) input_at_[m][static_cast<size_t>(b)] = offset_of(rb.input_re);
  }
  if (!re.empty()) {
    const int e = re.back();
    input_at_[m][static_cast<size_t>(e) + 1] =
        offset_of(e + 1 < n ? schedule_->unit_regions(k, e).out_scratch : schedule_->head_input(k));
  }
  return re;
}

void Runtime::end_recompute(int k, int i) {
  const auto now = Clock::now();
  measuring_.recompute_s[static_cast<size_t>(i)] += seconds(now - mark_);
  ++counts_[static_cast<size_t>(3 * i + 2)];
  mark_ = now;
}

void Runtime::end_backward(int k, int u) {
  measuring_.backward_s[static_cast<size_t>(u)] += seconds(Clock::now() - mark_);
  ++counts_[static_cast<size_t>(3 * u + 1)];
  end_op(cursor_);
}

void Runtime::begin_evaluation() {
  TANDEM_CHECK(cursor_ == 0, "evaluation in the middle of a step");
  evaluating_ = true;
}

void Runtime::end_evaluation() { evaluating_ = false; }

float* Runtime::input(int k, int u) {
  return reinterpret_cast<float*>(arena_.at(input_at_[micro(k)][static_cast<size_t>(u)]));
}

nn::BlockActivations Runtime::unit(int k, int u) {
  const nn::ChainLayout::UnitKind& kind = schedule_->chain().kind(u);
  const auto& offsets = schedule_->buffer_offsets(u);
  const uint64_t base = buffers_at_[micro(k)][static_cast<size_t>(u)];
  const Shape& io = schedule_->chain().input;
  nn::BlockActivations a;
  for (size_t i = 0; i < kind.saves.size(); ++i)
    a[kind.saves[i]] =
        Tensor::view_of(arena_.at(base + offsets[i]), kind.buffers[i].dtype, kind.buffers[i].shape);
  a[kind.output] = Tensor::view_of(input(k, u + 1), DType::F32, io);
  if (kind.input) a[*kind.input] = Tensor::view_of(input(k, u), DType::F32, io);
  return a;
}

nn::FinalActivations Runtime::head(int k) {
  const auto& buffers = schedule_->chain().head;
  TANDEM_CHECK(!buffers.empty(), "this stage has no head");
  const uint64_t base = offset_of(schedule_->head(static_cast<int>(micro(k))));
  nn::FinalActivations a;
  for (int i = 0; i < nn::kNumActs<nn::FinalAct>; ++i) {
    const auto& b = buffers[static_cast<size_t>(i)];
    a[static_cast<nn::FinalAct>(i)] = Tensor::view_of(
        arena_.at(base + schedule_->head_offsets()[static_cast<size_t>(i)]), b.dtype, b.shape);
  }
  return a;
}

}  // namespace tandem::ooc
