// The data-parallel AdamW / LAMB step: the optimizer program run on the data-parallel group with
// its schedule, over this rank's shard of the parameters.
#include "tandem/train/optimizer.h"

#include "tandem/core/error.h"
#include "tandem/dsl/workloads.h"

namespace tandem::train {
namespace {

Tensor view(float* p, int64_t n) { return Tensor::view_of(p, DType::F32, Shape{n}); }

}  // namespace

void OptimizerConfig::validate() const {
  if (name != "adamw" && name != "lamb")
    user_error("--optimizer {}: the optimizers are adamw and lamb", name);
  if (!(beta1 >= 0 && beta1 < 1)) user_error("--beta1 {} must be in [0, 1)", beta1);
  if (!(beta2 >= 0 && beta2 < 1)) user_error("--beta2 {} must be in [0, 1)", beta2);
  if (!(eps > 0)) user_error("--eps {} must be positive", eps);
  if (!(weight_decay >= 0)) user_error("--weight-decay {} must be 0 or more", weight_decay);
}

nlohmann::json OptimizerConfig::to_json() const {
  return {{"beta1", beta1}, {"beta2", beta2}, {"eps", eps}, {"weight_decay", weight_decay}};
}

std::vector<std::string> optimizer_schedule_preferences() {
  // ZeRO-1 as one program: ReduceScatter, the update on 1/dp of the elements, AllGather of the
  // weights, moments sliced. (The fused variants lower to the same rewritten program; they differ
  // only in the plan, which the reference interpreter does not run.)
  return {"RS-C-AG+slice(m,v)", "RS-C-AG", "AR-C"};
}

DataParallelOptimizer::DataParallelOptimizer(const OptimizerConfig& config,
                                             const parallel::ShardLayout& layout,
                                             comm::Communicator& dp)
    : config_(config), dp_(dp) {
  config.validate();
  const dsl::Program program = config.name == "lamb" ? dsl::workloads::lamb(DType::F32)
                                                     : dsl::workloads::adam(DType::F32);
  runner_ = std::make_unique<parallel::ProgramRunner>(program, optimizer_schedule_preferences());
  const dsl::Program& p = runner_->program();
  const std::optional<int> m_id = p.find("m");
  TANDEM_CHECK(m_id.has_value(), "optimizer program '{}' has no input m", p.name());
  sliced_ = p.stage(*m_id).type.layout.is_sliced();

  if (config.name == "lamb") {
    for (const parallel::LocalTensor& t : layout.tensors())
      segments_.push_back({t.local_offset, t.local_offset + t.numel(), 0});
  } else {
    segments_.push_back({0, layout.size(), 0});
  }
  const int P = dp.size(), r = dp.rank();
  int64_t state = 0;
  for (Segment& s : segments_) {
    const int64_t n = s.end - s.begin;
    Piece piece;
    piece.begin = sliced_ ? s.begin + comm::Partition::offset(n, P, r) : s.begin;
    piece.end = sliced_ ? piece.begin + comm::Partition::count(n, P, r) : s.end;
    piece.state_offset = state;
    state += piece.end - piece.begin;
    s.piece = pieces_.size();
    pieces_.push_back(piece);
  }
  m_ = Tensor::zeros(DType::F32, Shape{state});
  v_ = Tensor::zeros(DType::F32, Shape{state});
}

void DataParallelOptimizer::step(const Tensor& params, const Tensor& grads, double lr, int64_t step) {
  TANDEM_CHECK(params.numel() == grads.numel(), "params {} vs grads {}", params.str(), grads.str());
  float* w = params.data_as<float>();
  float* g = grads.data_as<float>();
  exec::RunArgs args;
  args.scalars = {{"lr", lr},
                  {"beta1", config_.beta1},
                  {"beta2", config_.beta2},
                  {"eps", config_.eps},
                  {"weight_decay", config_.weight_decay},
                  {"step", static_cast<double>(step)},
                  {"grad_scale", 1.0 / dp_.size()}};  // the summed gradients' mean
  for (const Segment& s : segments_) {
    const Piece& pc = pieces_[s.piece];
    const int64_t n = s.end - s.begin, k = pc.end - pc.begin;
    args.symbols = {{"N", n}};
    args.inputs = {{"g", view(g + s.begin, n)},
                   {"w", view(w + s.begin, n)},
                   {"m", view(m_.data_as<float>() + pc.state_offset, k)},
                   {"v", view(v_.data_as<float>() + pc.state_offset, k)}};
    runner_->run(dp_, args);  // w, m and v are updated in place
  }
}

}  // namespace tandem::train
