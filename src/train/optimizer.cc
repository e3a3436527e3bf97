// The data-parallel AdamW / LAMB step: the optimizer program run on the data-parallel group with
// its schedule, over this rank's shard of the parameters.
#include "tandem/train/optimizer.h"

#include <cstring>
#include <utility>

#include "tandem/core/dtype.h"
#include "tandem/core/error.h"
#include "tandem/dsl/workloads.h"

namespace tandem::train {
namespace {

using parallel::ProgramSession;

}  // namespace

void OptimizerConfig::validate() const {
  if (name != "adamw" && name != "lamb")
    user_error("--optimizer {}: the optimizers are adamw and lamb", name);
  if (grad_dtype != "f32" && grad_dtype != "bf16")
    user_error("--grad-dtype {}: the gradient dtypes are f32 and bf16", grad_dtype);
  if (!(beta1 >= 0 && beta1 < 1)) user_error("--beta1 {} must be in [0, 1)", beta1);
  if (!(beta2 >= 0 && beta2 < 1)) user_error("--beta2 {} must be in [0, 1)", beta2);
  if (!(eps > 0)) user_error("--eps {} must be positive", eps);
  if (!(weight_decay >= 0)) user_error("--weight-decay {} must be 0 or more", weight_decay);
}

nlohmann::json OptimizerConfig::to_json() const {
  return {{"beta1", beta1},
          {"beta2", beta2},
          {"eps", eps},
          {"weight_decay", weight_decay},
          {"grad_dtype", grad_dtype}};
}

dsl::Program optimizer_program(const OptimizerConfig& config) {
  const DType g = config.grad_dtype == "bf16" ? DType::BF16 : DType::F32;
  return config.name == "lamb" ? dsl::workloads::lamb(g) : dsl::workloads::adam(g);
}

std::vector<std::string> optimizer_schedule_preferences() {
  // ZeRO-1 as one program: the update runs inside the ReduceScatter's per-chunk hook on this
  // rank's 1/dp of the elements, the new weights are AllGathered, and the moments are stored
  // sliced.
  return {"fused(RS-C-AG)+slice(m,v)", "RS-C-AG+slice(m,v)", "AR-C"};
}

DataParallelOptimizer::DataParallelOptimizer(const OptimizerConfig& config,
                                             const parallel::ShardLayout& layout,
                                             comm::Communicator& dp,
                                             const std::vector<std::string>& schedules,
                                             parallel::ExecutorKind executor)
    : config_(config), dp_(dp) {
  config.validate();
  runner_ = std::make_unique<parallel::ProgramRunner>(
      optimizer_program(config), schedules.empty() ? optimizer_schedule_preferences() : schedules,
      executor);
  const dsl::Program& p = runner_->program();
  const std::optional<int> m_id = p.find("m");
  TANDEM_CHECK(m_id.has_value(), "optimizer program '{}' has no input m", p.name());
  sliced_ = p.stage(*m_id).type.layout.is_sliced();

  std::vector<std::pair<int64_t, int64_t>> ranges;
  if (config.name == "lamb") {
    for (const parallel::LocalTensor& t : layout.tensors())
      ranges.emplace_back(t.local_offset, t.local_offset + t.numel());
  } else {
    ranges.emplace_back(0, layout.size());
  }
  const int P = dp.size(), r = dp.rank();
  for (auto [begin, end] : ranges) {
    const int64_t n = end - begin;
    Segment seg{begin, end, runner_->prepare(dp, {{"N", n}})};
    Piece piece;
    piece.begin = sliced_ ? begin + comm::Partition::offset(n, P, r) : begin;
    piece.end = sliced_ ? piece.begin + comm::Partition::count(n, P, r) : end;
    piece.m = seg.session->input("m");
    piece.v = seg.session->input("v");
    TANDEM_CHECK(piece.m.numel() == piece.end - piece.begin && piece.v.numel() == piece.m.numel(),
                 "optimizer state m {} for elements [{}, {})", piece.m.str(), piece.begin, piece.end);
    piece.m.fill(0.0f);  // Adam's moments start at zero
    piece.v.fill(0.0f);
    segments_.push_back(std::move(seg));
    pieces_.push_back(std::move(piece));
  }
}

void DataParallelOptimizer::step(const Tensor& params, const Tensor& grads, double lr, int64_t step) {
  TANDEM_CHECK(params.numel() == grads.numel(), "params {} vs grads {}", params.str(), grads.str());
  float* w = params.data_as<float>();
  const float* g = grads.data_as<float>();
  for (Segment& s : segments_) {
    ProgramSession& run = *s.session;
    const size_t bytes = static_cast<size_t>(s.end - s.begin) * sizeof(float);
    const Tensor gin = run.input("g");
    if (gin.dtype() == DType::F32) {
      std::memcpy(gin.data(), g + s.begin, bytes);
    } else {  // mixed precision: round each gradient to the program's dtype
      void* dst = gin.data();
      for (int64_t i = 0; i < s.end - s.begin; ++i)
        store_from_f32(dst, gin.dtype(), static_cast<size_t>(i), g[s.begin + i]);
    }
    std::memcpy(run.input("w").data(), w + s.begin, bytes);
    run.set_scalar("lr", lr);
    run.set_scalar("beta1", config_.beta1);
    run.set_scalar("beta2", config_.beta2);
    run.set_scalar("eps", config_.eps);
    run.set_scalar("weight_decay", config_.weight_decay);
    run.set_scalar("step", static_cast<double>(step));
    run.set_scalar("grad_scale", 1.0 / dp_.size());  // the summed gradients' mean
    run.run();  // w, m and v are updated in the session's storage
    std::memcpy(w + s.begin, run.input("w").data(), bytes);
  }
}

}  // namespace tandem::train
