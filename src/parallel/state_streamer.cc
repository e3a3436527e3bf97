// The model's state between the shards and whole tensors, one tensor at a time.
#include "tandem/parallel/state_streamer.h"

#include <algorithm>
#include <cstring>

#include "tandem/core/error.h"

namespace tandem::parallel {
namespace {

Tensor f32_view(float* p, int64_t n) { return Tensor::view_of(p, DType::F32, Shape{n}); }

// Calls fn(local, global, count) for the overlap of local elements [begin, end) with every run of
// this rank's copies of tensor `name` (writers only, or all copies).
template <typename Fn>
void for_each_run_of(const ShardLayout& layout, const std::string& name, bool writers_only,
                     Fn&& fn) {
  for (const LocalTensor& lt : layout.tensors())
    if (lt.name == name && (lt.writer || !writers_only))
      for (const FlatRun& r : lt.runs) fn(r);
}

}  // namespace

namespace {

// The block whose local elements hold `local`, when the model keeps its blocks outside its flat
// buffer (in a store, or sharded); -1 when the element is in the flat buffer.
int stored_block(const ParallelGPT& model, int64_t local) {
  return model.state().blocks_elsewhere() ? model.layout().block_of(local) : -1;
}

}  // namespace

void init_weights(const ParallelGPT& model, uint64_t seed) {
  const ShardLayout& layout = model.layout();
  float* local = model.params().data_as<float>();
  std::vector<float> block;
  for (const LocalTensor& lt : layout.tensors()) {
    const int l = stored_block(model, lt.local_offset);
    if (l < 0) {
      for (const FlatRun& r : lt.runs)
        nn::gpt_init_values(model.config(), lt.name, r.global, r.count, local + r.local, seed);
      continue;
    }
    // A stored block's tensors are initialised into one block buffer, written once complete.
    const auto [b, e] = layout.block_range(l);
    block.resize(static_cast<size_t>(layout.block_floats()));
    for (const FlatRun& r : lt.runs)
      nn::gpt_init_values(model.config(), lt.name, r.global, r.count, block.data() + (r.local - b),
                          seed);
    if (lt.local_offset + lt.numel() == e) model.state().write_block_weights(l, block.data());
  }
}

// A piece's moments being assembled by scatter.
struct StateStreamer::Staged {
  std::vector<float> m, v;
  int64_t m_filled = 0, v_filled = 0;
  bool written = false;
};

StateStreamer::StateStreamer(const ParallelGPT& model, DataParallelOptimizer* opt)
    : model_(model), opt_(opt) {
  if (opt_ == nullptr) return;
  const std::vector<ModelState::Piece>& pieces = model_.state().pieces();
  staged_.resize(pieces.size());
  for (size_t i = 0; i < staged_.size(); ++i) staged_[i].written = pieces[i].end == pieces[i].begin;
}

StateStreamer::~StateStreamer() = default;

const float* StateStreamer::local_weights(int64_t local) {
  const int l = stored_block(model_, local);
  if (l < 0) return model_.params().data_as<float>() + local;
  const int64_t b = model_.layout().block_range(l).first;
  if (cached_block_ != l) {
    cached_block_w_.resize(static_cast<size_t>(model_.layout().block_floats()));
    model_.state().read_block_weights(l, cached_block_w_.data());
    cached_block_ = l;
  }
  return cached_block_w_.data() + (local - b);
}

const float* StateStreamer::slice_weights(int layer) {
  if (cached_slice_ != layer) {
    const auto [b, e] = model_.state().weight_slice(layer);
    cached_slice_w_.resize(static_cast<size_t>(e - b));
    model_.state().read_weight_slice(layer, cached_slice_w_.data());
    cached_slice_ = layer;
  }
  return cached_slice_w_.data();
}

const std::vector<float>& StateStreamer::piece_state(size_t piece, StatePart part) {
  if (cached_piece_ != static_cast<int64_t>(piece)) {
    const ModelState::Piece& pc = model_.state().pieces()[piece];
    cached_m_.resize(static_cast<size_t>(pc.end - pc.begin));
    cached_v_.resize(cached_m_.size());
    model_.state().read_moments(piece, cached_m_.data(), cached_v_.data());
    cached_piece_ = static_cast<int64_t>(piece);
  }
  return part == StatePart::M ? cached_m_ : cached_v_;
}

void StateStreamer::gather(StatePart part, const nn::ParamSpec& spec, float* out) {
  const int64_t n = spec.numel();
  std::fill(out, out + n, 0.0f);
  const ShardLayout& layout = model_.layout();
  const bool dp_lead = model_.grid().replica() == 0;  // one of the dp x cp replicas
  if (part == StatePart::Weights) {
    ModelState& state = model_.state();
    for_each_run_of(layout, spec.name, true, [&](const FlatRun& r) {
      const int l = state.weights_sharded() ? stored_block(model_, r.local) : -1;
      if (l < 0) {
        if (dp_lead)
          std::memcpy(out + (r.global - spec.offset), local_weights(r.local),
                      static_cast<size_t>(r.count) * sizeof(float));
        return;
      }
      // A sharded block: each dp rank deposits the part of the run in its slice.
      const auto [sb, se] = state.weight_slice(l);
      const int64_t b = std::max(r.local, sb), e = std::min(r.local + r.count, se);
      if (b < e)
        std::memcpy(out + (r.global + (b - r.local) - spec.offset), slice_weights(l) + (b - sb),
                    static_cast<size_t>(e - b) * sizeof(float));
    });
  } else {
    TANDEM_CHECK(opt_ != nullptr, "gathering moments without an optimizer");
    // Sliced moments: each dp rank deposits its slices; whole copies: dp rank 0's.
    if (opt_->state_sliced() || dp_lead) {
      const std::vector<ModelState::Piece>& pieces = model_.state().pieces();
      for_each_run_of(layout, spec.name, true, [&](const FlatRun& r) {
        for (size_t i = 0; i < pieces.size(); ++i) {
          const int64_t b = std::max(r.local, pieces[i].begin),
                        e = std::min(r.local + r.count, pieces[i].end);
          if (b >= e) continue;
          const std::vector<float>& s = piece_state(i, part);
          std::memcpy(out + (r.global + (b - r.local) - spec.offset),
                      s.data() + (b - pieces[i].begin), static_cast<size_t>(e - b) * sizeof(float));
        }
      });
    }
  }
  // Adding the other ranks' zeros is exact.
  model_.grid().world().all_reduce(f32_view(out, n), comm::ReduceOp::Sum);
}

void StateStreamer::scatter(StatePart part, const nn::ParamSpec& spec, float* in) {
  model_.grid().world().broadcast(f32_view(in, spec.numel()), 0);
  const ShardLayout& layout = model_.layout();
  if (part == StatePart::Weights) {
    float* local = model_.params().data_as<float>();
    for_each_run_of(layout, spec.name, false, [&](const FlatRun& r) {
      const size_t bytes = static_cast<size_t>(r.count) * sizeof(float);
      const int l = stored_block(model_, r.local);
      if (l < 0) return (void)std::memcpy(local + r.local, in + (r.global - spec.offset), bytes);
      // A stored block's weights are staged whole, written once every element has come.
      const int64_t b = layout.block_range(l).first;
      StagedBlock& st = staged_blocks_[l];
      if (st.w.empty()) st.w.assign(static_cast<size_t>(layout.block_floats()), 0.0f);
      std::memcpy(st.w.data() + (r.local - b), in + (r.global - spec.offset), bytes);
      st.filled += r.count;
      if (st.filled == layout.block_floats()) {
        model_.state().write_block_weights(l, st.w.data());
        staged_blocks_.erase(l);
      }
    });
    return;
  }
  TANDEM_CHECK(opt_ != nullptr, "scattering moments without an optimizer");
  const std::vector<ModelState::Piece>& pieces = model_.state().pieces();
  for_each_run_of(layout, spec.name, false, [&](const FlatRun& r) {
    for (size_t i = 0; i < pieces.size(); ++i) {
      const int64_t b = std::max(r.local, pieces[i].begin),
                    e = std::min(r.local + r.count, pieces[i].end);
      if (b >= e) continue;
      Staged& st = staged_[i];
      TANDEM_CHECK(!st.written, "piece {} of the moments scattered twice", i);
      const size_t len = static_cast<size_t>(pieces[i].end - pieces[i].begin);
      std::vector<float>& dst = part == StatePart::M ? st.m : st.v;
      if (dst.empty()) dst.assign(len, 0.0f);
      std::memcpy(dst.data() + (b - pieces[i].begin), in + (r.global + (b - r.local) - spec.offset),
                  static_cast<size_t>(e - b) * sizeof(float));
      (part == StatePart::M ? st.m_filled : st.v_filled) += e - b;
      if (st.m_filled == static_cast<int64_t>(len) && st.v_filled == static_cast<int64_t>(len)) {
        model_.state().write_moments(i, st.m.data(), st.v.data());
        st = Staged{};
        st.written = true;
      }
    }
  });
}

void StateStreamer::finish() {
  TANDEM_CHECK(staged_blocks_.empty(), "{} blocks' weights were not completely scattered",
               staged_blocks_.size());
  for (size_t i = 0; i < staged_.size(); ++i)
    TANDEM_CHECK(staged_[i].written, "piece {} of the moments was not completely scattered", i);
}

std::vector<float> gather_weights(const ParallelGPT& model) {
  std::vector<float> whole(static_cast<size_t>(nn::gpt_num_parameters(model.config())));
  StateStreamer streamer(model, nullptr);
  for (const nn::ParamSpec& spec : nn::gpt_parameter_specs(model.config()))
    streamer.gather(StatePart::Weights, spec, whole.data() + spec.offset);
  return whole;
}

}  // namespace tandem::parallel
