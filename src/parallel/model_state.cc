// The whole model's weights and optimizer moments gathered from the grid's shards and scattered
// back.
#include "tandem/parallel/model_state.h"

#include <cstring>

namespace tandem::parallel {
namespace {

Tensor f32_view(float* p, Shape s) { return Tensor::view_of(p, DType::F32, std::move(s)); }

}  // namespace

std::vector<float> gather_weights(const ParallelGPT& model) {
  const int64_t global_size = nn::gpt_num_parameters(model.config());
  std::vector<float> whole(static_cast<size_t>(global_size), 0.0f);
  const Grid& grid = model.grid();
  if (grid.coord().dp == 0)
    model.layout().deposit(model.params().data_as<float>(), 0, model.layout().size(), whole.data());
  grid.world().all_reduce(f32_view(whole.data(), Shape{global_size}), comm::ReduceOp::Sum);
  return whole;
}

WholeModelState gather_state(const ParallelGPT& model, const DataParallelOptimizer& opt) {
  WholeModelState s;
  s.weights = gather_weights(model);
  const int64_t global_size = static_cast<int64_t>(s.weights.size());
  s.m.assign(s.weights.size(), 0.0f);
  s.v.assign(s.weights.size(), 0.0f);
  const Grid& grid = model.grid();
  if (opt.state_sliced() || grid.coord().dp == 0) {
    std::vector<float> m, v;
    for (size_t i = 0; i < opt.pieces().size(); ++i) {
      const DataParallelOptimizer::Piece& pc = opt.pieces()[i];
      m.resize(static_cast<size_t>(pc.end - pc.begin));
      v.resize(m.size());
      opt.read_state(i, m.data(), v.data());
      model.layout().deposit(m.data(), pc.begin, pc.end, s.m.data());
      model.layout().deposit(v.data(), pc.begin, pc.end, s.v.data());
    }
  }
  grid.world().all_reduce(f32_view(s.m.data(), Shape{global_size}), comm::ReduceOp::Sum);
  grid.world().all_reduce(f32_view(s.v.data(), Shape{global_size}), comm::ReduceOp::Sum);
  return s;
}

void scatter_state(const WholeModelState& state, const ParallelGPT& model,
                   DataParallelOptimizer& opt) {
  model.layout().extract(state.weights.data(), model.params().data_as<float>());
  std::vector<float> m, v;
  for (size_t i = 0; i < opt.pieces().size(); ++i) {
    const DataParallelOptimizer::Piece& pc = opt.pieces()[i];
    m.assign(static_cast<size_t>(pc.end - pc.begin), 0.0f);
    v.assign(m.size(), 0.0f);
    model.layout().for_each_run(pc.begin, pc.end, false, [&](const LocalTensor&, const FlatRun& r) {
      const int64_t at = r.local - pc.begin;
      std::memcpy(m.data() + at, state.m.data() + r.global,
                  static_cast<size_t>(r.count) * sizeof(float));
      std::memcpy(v.data() + at, state.v.data() + r.global,
                  static_cast<size_t>(r.count) * sizeof(float));
    });
    opt.write_state(i, m.data(), v.data());
  }
}

}  // namespace tandem::parallel
