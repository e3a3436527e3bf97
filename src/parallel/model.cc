// One rank's part of the GPT-2 model under data, tensor and pipeline parallelism: the 1F1B
// micro-batch loop, the stages, and the DSL programs at the communication points.
#include "tandem/parallel/model.h"

#include <algorithm>
#include <cstring>

#include "tandem/core/error.h"
#include "tandem/dsl/workloads.h"
#include "tandem/parallel/pipeline.h"

namespace tandem::parallel {
namespace {

using Clock = std::chrono::steady_clock;

// The tag of the activation gradients sent back over a pipeline boundary: above any stage id
// the pipeline program tags its sends with.
constexpr int kGradTag = 30000;

Tensor view(const float* p, Shape s) {
  return Tensor::view_of(const_cast<float*>(p), DType::F32, std::move(s));
}

void copy(float* dst, const Tensor& src, int64_t n) {
  TANDEM_CHECK(src.dtype() == DType::F32 && src.numel() == n, "program output {} where {} floats "
               "were expected", src.str(), n);
  std::memcpy(dst, src.data(), static_cast<size_t>(n) * sizeof(float));
}

}  // namespace

std::vector<std::string> epilogue_schedule_preferences() {
  // ReduceScatter, the bias/dropout/residual on this rank's 1/tp of the rows, AllGather: the
  // interpreter does 1/tp of the elementwise work per rank (CoCoNeT's RS-C-AG).
  return {"RS-C-AG", "AR-C"};
}

struct ParallelGPT::Slot {
  nn::EmbeddingActivations embedding;
  std::vector<nn::BlockActivations> blocks;
  nn::FinalActivations head;
  Tensor input;  // (B, T, C): the activations received from the previous stage
};

struct ParallelGPT::Programs {
  std::unique_ptr<ProgramRunner> megatron_train, megatron_eval, pipeline_train, pipeline_eval;
};

ParallelGPT::ParallelGPT(const nn::GPTConfig& config, Grid& grid, int micro_rows, int T,
                         int micro_batches)
    : config_(config),
      grid_(grid),
      layout_(config, grid.shape(), grid.coord().tp, grid.coord().pp),
      micro_rows_(micro_rows),
      T_(T),
      micro_batches_(micro_batches) {
  if (micro_rows < 1 || micro_batches < 1)
    user_error("a step needs at least one micro-batch of at least one row (got {} of {} rows)",
               micro_batches, micro_rows);
  if (T < 1 || T > config.max_positions)
    user_error("sequence length {} is outside [1, {}]", T, config.max_positions);
  params_ = Tensor::zeros(DType::F32, Shape{layout_.size()});
  grads_ = Tensor::zeros(DType::F32, Shape{layout_.size()});
  const int tp = grid.shape().tp, B = micro_rows;
  const int slots = in_flight_limit(grid.shape().pp, grid.coord().pp, micro_batches);
  for (int i = 0; i < slots; ++i) {
    auto s = std::make_unique<Slot>();
    if (layout_.has_embedding()) s->embedding = nn::allocate_embedding_activations(config, B, T);
    else s->input = Tensor::empty(DType::F32, Shape{B, T, config.d_model});
    for (int l = layout_.first_layer(); l < layout_.end_layer(); ++l)
      s->blocks.push_back(allocate_shard_block_activations(config, tp, B, T));
    if (layout_.has_final()) s->head = nn::allocate_final_activations(config, B, T);
    slots_.push_back(std::move(s));
  }
  ws_ = std::make_unique<nn::Workspace>(config, B, T);
  if (grid.from_prev() != nullptr)
    for (int k = 0; k < micro_batches; ++k)
      grad_send_.push_back(Tensor::empty(DType::F32, Shape{B, T, config.d_model}));

  // The programs, one runner per dropout probability (it is part of the program).
  programs_ = std::make_unique<Programs>();
  bool any_shard = false;
  for (int l = layout_.first_layer(); l < layout_.end_layer(); ++l) any_shard |= shard_path(l);
  const double p = config.dropout;
  if (any_shard) {
    programs_->megatron_train = std::make_unique<ProgramRunner>(
        dsl::workloads::megatron_layer(DType::F32, p), epilogue_schedule_preferences());
    programs_->megatron_eval = p > 0 ? std::make_unique<ProgramRunner>(
                                           dsl::workloads::megatron_layer(DType::F32, 0.0),
                                           epilogue_schedule_preferences())
                                     : nullptr;
  }
  if (grid.to_next() != nullptr || grid.from_prev() != nullptr) {
    programs_->pipeline_train = std::make_unique<ProgramRunner>(
        dsl::workloads::pipeline_stage(DType::F32, p), epilogue_schedule_preferences());
    programs_->pipeline_eval = p > 0 ? std::make_unique<ProgramRunner>(
                                           dsl::workloads::pipeline_stage(DType::F32, 0.0),
                                           epilogue_schedule_preferences())
                                     : nullptr;
  }
}

ParallelGPT::~ParallelGPT() {
  // Sends still in flight read grad_send_: let them finish before the buffers go.
  for (comm::Request& r : pending_sends_) {
    try {
      r.wait();
    } catch (...) {
    }
  }
}

std::string ParallelGPT::epilogue_schedule() const {
  return programs_->megatron_train ? programs_->megatron_train->schedule_name() : "";
}
std::string ParallelGPT::pipeline_schedule() const {
  return programs_->pipeline_train ? programs_->pipeline_train->schedule_name() : "";
}

bool ParallelGPT::shard_path(int layer) const {
  const bool boundary = layer == layout_.end_layer() - 1 && grid_.to_next() != nullptr;
  return grid_.shape().tp > 1 || boundary;
}

void ParallelGPT::emit(std::string_view stream, std::string_view name, Clock::time_point begin) {
  const auto end = Clock::now();
  const double total = std::chrono::duration<double>(end - begin).count();
  double self = total;
  if (stream == "comm") {
    nested_comm_s_ += total;
  } else {
    self = std::max(0.0, total - nested_comm_s_);
    nested_comm_s_ = 0.0;
  }
  if (sink_) sink_(stream, name, begin, end, self);
}

void ParallelGPT::check_micro(const std::vector<MicroBatch>& micro) const {
  if (static_cast<int>(micro.size()) != micro_batches_)
    user_error("a step of this model takes {} micro-batches, not {}", micro_batches_, micro.size());
  for (const MicroBatch& mb : micro) {
    if (mb.B != micro_rows_ || mb.T != T_)
      user_error("micro-batch of {} x {} tokens; this model was set up for {} x {}", mb.B, mb.T,
                 micro_rows_, T_);
    if (layout_.has_embedding() && mb.tokens == nullptr) user_error("micro-batch without tokens");
    if (layout_.has_final() && mb.targets == nullptr) user_error("micro-batch without targets");
    // nn checks token ranges in gpt_forward; the stages called here do not, so check them once.
    const int64_t n = static_cast<int64_t>(mb.B) * mb.T;
    for (int64_t i = 0; i < n; ++i) {
      if (mb.tokens != nullptr && (mb.tokens[i] < 0 || mb.tokens[i] >= config_.vocab_size))
        user_error("token {} at position {} is outside the vocabulary [0, {})", mb.tokens[i], i,
                   config_.vocab_size);
      if (mb.targets != nullptr && (mb.targets[i] < 0 || mb.targets[i] >= config_.vocab_size))
        user_error("target {} at position {} is outside the vocabulary [0, {})", mb.targets[i], i,
                   config_.vocab_size);
    }
  }
}

void ParallelGPT::run_epilogue(const EpilogueArgs& e, bool training, bool boundary) {
  const auto begin = Clock::now();
  const int tp = grid_.shape().tp;
  const bool drop = training && config_.dropout > 0;
  exec::RunArgs args;
  args.symbols = {{"B", e.N}, {"K", e.K}, {"H", e.H}};
  args.scalars = {{"seed", static_cast<double>(e.seed)}};
  args.inputs = {{"x", view(e.x, Shape{e.N, e.K / tp})},
                 {"w", view(e.w, Shape{e.K / tp, e.H})},
                 {"bias", view(e.bias, Shape{e.H})},
                 {"residual", view(e.residual, Shape{e.N, e.H})}};
  if (boundary) {
    const ProgramRunner& r = drop || !programs_->pipeline_eval ? *programs_->pipeline_train
                                                               : *programs_->pipeline_eval;
    exec::TensorMap out = r.run(*grid_.to_next(), args);
    copy(e.out, out.at("out"), e.N * e.H);
    emit("comm", "pipeline send h." + std::to_string(e.layer), begin);
  } else {
    const ProgramRunner& r = drop || !programs_->megatron_eval ? *programs_->megatron_train
                                                               : *programs_->megatron_eval;
    exec::TensorMap out = r.run(grid_.tp(), args);
    copy(e.out, out.at("out"), e.N * e.H);
    emit("comm", std::string("megatron h.") + std::to_string(e.layer) + (e.mlp ? ".mlp" : ".attn"),
         begin);
  }
}

void ParallelGPT::receive_activations(const nn::StepRng& rng, bool training, float* into, int B,
                                      int T) {
  const auto begin = Clock::now();
  const int64_t N = static_cast<int64_t>(B) * T, C = config_.d_model;
  const bool drop = training && config_.dropout > 0;
  exec::RunArgs args;  // group 1 binds no inputs; the shapes and the scalar are the sender's
  args.symbols = {{"B", N}, {"K", 4 * C}, {"H", C}};
  args.scalars = {{"seed", static_cast<double>(epilogue_seed(
                               rng, layout_.first_layer() - 1, nn::DropoutSite::MlpResidual))}};
  const ProgramRunner& r = drop || !programs_->pipeline_eval ? *programs_->pipeline_train
                                                             : *programs_->pipeline_eval;
  exec::TensorMap out = r.run(*grid_.from_prev(), args);
  copy(into, out.at("h"), N * C);
  emit("comm", "pipeline recv", begin);
}

void ParallelGPT::forward_micro(const MicroBatch& mb, Slot& slot, const nn::StepRng& rng,
                                bool training, double& loss_sum) {
  const int B = mb.B, T = mb.T;
  const float* x = nullptr;
  if (layout_.has_embedding()) {
    const auto begin = Clock::now();
    nn::embedding_forward(config_, layout_.embedding(params_.data_as<float>()), slot.embedding,
                          mb.tokens, B, T, rng);
    emit("compute", "forward embedding", begin);
    x = slot.embedding.ptr(nn::EmbeddingAct::Out);
  } else {
    receive_activations(rng, training, slot.input.data_as<float>(), B, T);
    x = slot.input.data_as<float>();
  }
  const ShardBlock sb{config_, grid_.shape().tp, grid_.coord().tp, &grid_.tp()};
  float* base = params_.data_as<float>();
  for (int l = layout_.first_layer(); l < layout_.end_layer(); ++l) {
    const nn::BlockActivations& a = slot.blocks[static_cast<size_t>(l - layout_.first_layer())];
    const auto begin = Clock::now();
    nested_comm_s_ = 0.0;
    if (shard_path(l)) {
      const bool boundary = l == layout_.end_layer() - 1 && grid_.to_next() != nullptr;
      shard_block_forward(
          sb, l, layout_.block(base, l), a, x, *ws_, B, T, rng,
          [&](const EpilogueArgs& e) { run_epilogue(e, training, false); },
          [&](const EpilogueArgs& e) { run_epilogue(e, training, boundary); });
    } else {
      nn::block_forward(config_, l, layout_.block(base, l), a, x, *ws_, B, T, rng);
    }
    emit("compute", "forward h." + std::to_string(l), begin);
    x = a.ptr(nn::BlockAct::Out);
  }
  if (layout_.has_final()) {
    const auto begin = Clock::now();
    loss_sum += nn::final_forward(config_, layout_.final_stage(base), slot.head, x, mb.targets, B, T);
    emit("compute", "forward head", begin);
  }
}

void ParallelGPT::backward_micro(const MicroBatch& mb, Slot& slot, const nn::StepRng& rng,
                                 float dloss, int k) {
  const int B = mb.B, T = mb.T;
  const int64_t n = static_cast<int64_t>(B) * T * config_.d_model;
  float* base = params_.data_as<float>();
  float* gbase = grads_.data_as<float>();
  float* dres = ws_->dresidual();  // (B, T, C) d(loss)/d(residual stream)
  auto stage_input = [&]() -> const float* {
    return layout_.has_embedding() ? slot.embedding.ptr(nn::EmbeddingAct::Out)
                                   : slot.input.data_as<float>();
  };
  auto block_input = [&](int l) -> const float* {
    return l == layout_.first_layer()
               ? stage_input()
               : slot.blocks[static_cast<size_t>(l - 1 - layout_.first_layer())].ptr(nn::BlockAct::Out);
  };
  if (layout_.has_final()) {
    const auto begin = Clock::now();
    std::memset(dres, 0, static_cast<size_t>(n) * sizeof(float));
    nn::final_backward(config_, layout_.final_stage(base), layout_.final_stage(gbase), slot.head,
                       block_input(layout_.end_layer()), mb.targets, dloss, dres, *ws_, B, T);
    emit("compute", "backward head", begin);
  } else {
    const auto begin = Clock::now();
    comm::Communicator& link = *grid_.to_next();
    link.recv(view(dres, Shape{n}), grid_.shape().tp + grid_.coord().tp, kGradTag);
    emit("comm", "pipeline recv grad", begin);
  }
  const ShardBlock sb{config_, grid_.shape().tp, grid_.coord().tp, &grid_.tp()};
  for (int l = layout_.end_layer() - 1; l >= layout_.first_layer(); --l) {
    const nn::BlockActivations& a = slot.blocks[static_cast<size_t>(l - layout_.first_layer())];
    const auto begin = Clock::now();
    nested_comm_s_ = 0.0;
    if (shard_path(l))
      shard_block_backward(sb, l, layout_.block(base, l), layout_.block(gbase, l), a, block_input(l),
                           dres, *ws_, B, T, rng);
    else
      nn::block_backward(config_, l, layout_.block(base, l), layout_.block(gbase, l), a,
                         block_input(l), dres, *ws_, B, T, rng);
    emit("compute", "backward h." + std::to_string(l), begin);
  }
  if (layout_.has_embedding()) {
    const auto begin = Clock::now();
    nn::embedding_backward(config_, layout_.embedding(gbase), dres, mb.tokens, *ws_, B, T, rng);
    emit("compute", "backward embedding", begin);
  } else {
    // Asynchronous, so that this stage goes on to its next forward while the previous stage is
    // still busy: waiting here would deadlock 1F1B (both stages sending at once).
    Tensor& buf = grad_send_[static_cast<size_t>(k)];
    std::memcpy(buf.data(), dres, static_cast<size_t>(n) * sizeof(float));
    pending_sends_.push_back(grid_.from_prev()->isend(buf, grid_.coord().tp, kGradTag));
  }
}

double ParallelGPT::forward_backward(const std::vector<MicroBatch>& micro, uint64_t seed,
                                     uint64_t step) {
  check_micro(micro);
  const int M = micro_batches_;
  const int slots = static_cast<int>(slots_.size());
  const float dloss = 1.0f / static_cast<float>(M);
  double loss_sum = 0.0;
  auto rng_of = [&](int k) {
    return nn::StepRng{seed, step, micro[static_cast<size_t>(k)].sample_offset, true};
  };
  for (const PipeOp& op : one_f_one_b(grid_.shape().pp, grid_.coord().pp, M)) {
    const MicroBatch& mb = micro[static_cast<size_t>(op.micro)];
    Slot& slot = *slots_[static_cast<size_t>(op.micro % slots)];
    if (op.kind == PipeOp::Forward) forward_micro(mb, slot, rng_of(op.micro), true, loss_sum);
    else backward_micro(mb, slot, rng_of(op.micro), dloss, op.micro);
  }
  const auto begin = Clock::now();
  for (comm::Request& r : pending_sends_) r.wait();
  pending_sends_.clear();
  if (!grad_send_.empty()) emit("comm", "pipeline send grads (wait)", begin);
  return loss_sum;
}

double ParallelGPT::forward(const std::vector<MicroBatch>& micro) {
  check_micro(micro);
  double loss_sum = 0.0;
  for (size_t k = 0; k < micro.size(); ++k)
    forward_micro(micro[k], *slots_[0], nn::StepRng{0, 0, micro[k].sample_offset, false}, false,
                  loss_sum);
  return loss_sum;
}

void ParallelGPT::reduce_tied_gradients() {
  comm::Communicator* tied = grid_.tied();
  if (tied == nullptr) return;
  const auto begin = Clock::now();
  // Stage 0 holds wte first; the last stage holds its copy last (shard.h).
  const LocalTensor& wte = grid_.first_stage() ? layout_.tensors().front() : layout_.tensors().back();
  TANDEM_CHECK(wte.name == "wte", "tied tensor is '{}'", wte.name);
  tied->all_reduce(grads_.flat_slice(wte.local_offset, wte.numel()), comm::ReduceOp::Sum);
  emit("comm", "tied embedding all_reduce", begin);
}

}  // namespace tandem::parallel
