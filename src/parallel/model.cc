// One rank's part of the GPT-2 model under data, tensor and pipeline parallelism: the 1F1B
// micro-batch loop, the stages, and the DSL programs at the communication points.
#include "tandem/parallel/model.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "tandem/core/error.h"
#include "tandem/dsl/workloads.h"
#include "tandem/parallel/pipeline.h"

namespace tandem::parallel {
namespace {

using Clock = std::chrono::steady_clock;

Tensor view(const float* p, Shape s) {
  return Tensor::view_of(const_cast<float*>(p), DType::F32, std::move(s));
}

// The epilogue's inputs and output, bound where the layer's tensors lie: no copy in or out.
// Llama's row-parallel projections have no bias, so its epilogue's program has no "bias" input.
std::vector<std::string> epilogue_bound(const nn::GPTConfig& config) {
  if (epilogue_bias(config) == dsl::workloads::Bias::Without) return {"x", "w", "residual", "out"};
  return {"x", "w", "bias", "residual", "out"};
}

// A communication point's program with its preferences and their chunk size.
std::unique_ptr<ProgramRunner> program_runner(const dsl::Program& program,
                                              const SchedulePreferences& preferences,
                                              exec::RunnerKind executor) {
  return std::make_unique<ProgramRunner>(program, preferences.names, executor,
                                         preferences.chunk_bytes);
}

}  // namespace

std::vector<std::string> epilogue_schedule_preferences() {
  // CoCoNeT's fused(RS-C-AG): the bias, dropout and residual run inside the ReduceScatter's
  // per-chunk hook on this rank's 1/tp of the rows, then one AllGather.
  return {"fused(RS-C-AG)", "RS-C-AG", "AR-C"};
}

std::vector<std::string> pipeline_schedule_preferences() {
  // CoCoNeT's pipeline schedule: the epilogue fused into the ReduceScatter, each rank sends its
  // 1/tp slice to its peer of the next stage, whose group AllGathers it (1/tp of the bytes on
  // the inter-stage link).
  return {"fused(RS-C)-P2P-AG", "fused(RS-C-AG)", "AR-C"};
}

// In-core training: every micro-batch in flight keeps all its buffers, allocated once, in one of
// min(M, P - stage) slots (micro-batch k in slot k % slots; evaluation uses slot 0).
class ParallelGPT::Resident final : public nn::ActivationMemory {
 public:
  Resident(const nn::GPTConfig& config, const ShardLayout& layout, int tp, int B, int T, int slots)
      : ws_(config, B, T) {
    for (int i = 0; i < slots; ++i) {
      Slot s;
      // x_0: the embedding's output, or what the previous stage sends.
      s.inputs.push_back(Tensor::empty(DType::F32, Shape{B, T, config.d_model}));
      for (int l = layout.first_layer(); l < layout.end_layer(); ++l) {
        s.blocks.push_back(allocate_shard_block_activations(config, tp, B, T));
        s.inputs.push_back(s.blocks.back()[nn::BlockAct::Out]);
      }
      if (layout.has_final()) s.head = nn::allocate_final_activations(config, B, T);
      slots_.push_back(std::move(s));
    }
  }
  void begin_forward(int, int) override {}
  void end_forward(int, int) override {}
  std::vector<int> begin_backward(int, int) override { return {}; }
  void end_recompute(int, int) override {}
  void end_backward(int, int) override {}
  void begin_evaluation() override { evaluating_ = true; }
  void end_evaluation() override { evaluating_ = false; }
  // Unit u is half u % 2 of block u / 2: the attention half's input is the block's, the MLP's
  // its Resid1; x_units is the last block's Out.
  float* input(int k, int u) override {
    const size_t j = static_cast<size_t>(u / nn::kBlockHalves);
    if (u % nn::kBlockHalves == 0) return slot(k).inputs[j].data_as<float>();
    return slot(k).blocks[j].ptr(nn::BlockAct::Resid1);
  }
  nn::BlockActivations unit(int k, int u) override {
    return slot(k).blocks[static_cast<size_t>(u / nn::kBlockHalves)];
  }
  nn::FinalActivations head(int k) override { return slot(k).head; }
  nn::Workspace& workspace() override { return ws_; }

 private:
  struct Slot {
    std::vector<Tensor> inputs;  // x_0 .. x_n
    std::vector<nn::BlockActivations> blocks;
    nn::FinalActivations head;
  };
  Slot& slot(int k) { return slots_[evaluating_ ? 0 : static_cast<size_t>(k) % slots_.size()]; }
  std::vector<Slot> slots_;
  nn::Workspace ws_;
  bool evaluating_ = false;
};

nn::ChainLayout ParallelGPT::chain_layout(const nn::GPTConfig& config, const Grid& grid,
                                          int micro_rows, int T, int micro_batches) {
  return chain_layout(config, grid.shape(), grid.coord(), micro_rows, T, micro_batches);
}

nn::ChainLayout ParallelGPT::chain_layout(const nn::GPTConfig& config, const GridShape& shape,
                                          const GridCoord& coord, int micro_rows, int T,
                                          int micro_batches) {
  const ShardLayout layout(config, shape, coord.tp, coord.pp);
  std::vector<nn::ChainLayout::Pass> order;
  for (const PipeOp& op : one_f_one_b(shape.pp, coord.pp, micro_batches))
    order.push_back({op.kind == PipeOp::Forward, op.micro});
  return nn::gpt_chain_layout(
      config, micro_rows, T, layout.first_layer(), layout.end_layer() - layout.first_layer(),
      layout.has_final(), std::move(order), shard_block_shapes(config, shape.tp, micro_rows, T));
}

// The programs and their sessions. A program's dropout probability is part of it, so with
// dropout there is one program for training and one (p = 0) for evaluation; without, the
// evaluation sessions are the training ones.
struct ParallelGPT::Programs {
  // [0] training, [1] evaluation; the pipeline program sending to the next stage, and receiving
  // from the previous one.
  std::unique_ptr<ProgramRunner> megatron[2], pipeline[2], pipeline_recv[2];
  std::unique_ptr<exec::Runner> attn_s[2], mlp_s[2], send_s[2], recv_s[2];
  // The gradient sums in place (sum_in_place, each with its schedule tuned at its size): the tp
  // backward's input gradients (tp > 1), and the tied embedding's between the first and the last
  // stage (bound to its gradient).
  std::unique_ptr<ProgramRunner> tp_sum_program, tied_sum_program;
  std::unique_ptr<exec::Runner> tp_sum, tied_sum;
  // The backward's hand-off of the gradient of a stage's input to the previous stage
  // (grad_handoff): sent from the link to the previous stage, received on the link to the next.
  std::unique_ptr<ProgramRunner> handoff;
  std::unique_ptr<exec::Runner> grad_send, grad_recv;
  exec::Runner* attn[2] = {nullptr, nullptr};  // K = C: attention's projection
  exec::Runner* mlp[2] = {nullptr, nullptr};   // K = 4C: the MLP's projection
  exec::Runner* send[2] = {nullptr, nullptr};  // this stage's last block, handed to the next
  exec::Runner* recv[2] = {nullptr, nullptr};  // the previous stage's hand-off
};

ParallelGPT::ParallelGPT(const nn::GPTConfig& config, Grid& grid, int micro_rows, int T,
                         int micro_batches, const ProgramOptions& options,
                         nn::ActivationMemory* memory, ModelState* state)
    : config_(config),
      grid_(grid),
      // From the data-parallel group's allocator: the optimizer's programs read and write these
      // buffers in place, and on MPI ranks of one node only memory the peers map goes direct.
      own_state_(state != nullptr
                     ? nullptr
                     : std::make_unique<ModelState>(
                           ShardLayout(config, grid.shape(), grid.coord().tp, grid.coord().pp),
                           ModelState::Options{}, &grid.dp().allocator())),
      state_(state != nullptr ? *state : *own_state_),
      layout_(state_.layout()),
      micro_rows_(micro_rows),
      T_(T),
      micro_batches_(micro_batches),
      memory_(memory) {
  if (micro_rows < 1 || micro_batches < 1)
    user_error("a step needs at least one micro-batch of at least one row (got {} of {} rows)",
               micro_batches, micro_rows);
  if (T < 1 || T > config.max_positions)
    user_error("sequence length {} is outside [1, {}]", T, config.max_positions);
  TANDEM_CHECK(layout_.config() == config && layout_.tp_rank() == grid.coord().tp &&
                   layout_.stage() == grid.coord().pp && layout_.tp() == grid.shape().tp,
               "a model state of another rank's layout");
  const int tp = grid.shape().tp, B = micro_rows;
  if (options.tp_dtype != DType::F32 && options.tp_dtype != DType::BF16)
    user_error("the tensor-parallel exchanges carry f32 or bf16, not {}",
               dtype_name(options.tp_dtype));
  if (options.tp_dtype == DType::BF16 && config.matmul != DType::BF16)
    user_error(
        "bf16 tensor-parallel exchanges carry bf16 matmuls' operands and products: they need bf16 "
        "matmuls (the model's are {})",
        dtype_name(config.matmul));
  if (tp > 1) tp_dtype_ = options.tp_dtype;
  if (options.context_group != nullptr && options.context_group->size() > 1) {
    comm::Communicator& group = *options.context_group;
    const int cp = group.size(), whole = T * cp;
    if (config.attention != nn::AttentionKernel::Fused)
      user_error("context parallelism runs the fused attention kernel, not the unfused one");
    if (config.dropout > 0)
      user_error(
          "context parallelism does not support dropout yet (the model's is {}): its residual "
          "and embedding masks would be drawn by this rank's token index, not the sequence's",
          config.dropout);
    ContextSplit::check(whole, cp);
    if (whole > config.max_positions)
      user_error(
          "sequence length {} ({} tokens on each of {} context-parallel ranks) is outside "
          "[1, {}]",
          whole, T, cp, config.max_positions);
    context_ = std::make_unique<ContextParallelAttention>(
        group, ContextSplit(whole, cp, group.rank()), B, config.n_heads / tp,
        config.n_kv_heads() / tp, config.head_size(), options.context_schedules, options.executor);
    if (config.llama())
      context_rope_ = nn::rope_table(
          nn::rope_inv_freq(config.head_size(), config.rope_theta, config.rope_scaling), whole);
  }
  if (memory_ == nullptr) {
    resident_ = std::make_unique<Resident>(
        config, layout_, tp, B, T,
        in_flight_limit(grid.shape().pp, grid.coord().pp, micro_batches));
    memory_ = resident_.get();
  }
  if (grid.from_prev() != nullptr)
    for (int k = 0; k < micro_batches; ++k)
      grad_send_.push_back(Tensor::empty(DType::F32, Shape{B, T, config.d_model}));

  // The programs, set up once for this micro-batch size. Sessions are collectives over their
  // communicator: every stage sets up its tp sessions, then the link from the previous stage,
  // then the link to the next, so the two ends of each link meet.
  programs_ = std::make_unique<Programs>();
  Programs& pr = *programs_;
  bool any_shard = false;
  for (int l = layout_.first_layer(); l < layout_.end_layer(); ++l) any_shard |= shard_path(l);
  const double p = config.dropout;
  const int variants = p > 0 ? 2 : 1;
  // K: the row-parallel projections' inputs, the attention's C and the MLP's hidden width.
  const int64_t N = static_cast<int64_t>(B) * T, C = config.d_model, F = config.mlp_width();
  const dsl::workloads::Bias bias = epilogue_bias(config);
  const std::vector<std::string> bound = epilogue_bound(config);
  for (int v = 0; v < variants; ++v) {
    const double pv = v == 0 ? p : 0.0;
    if (any_shard)
      pr.megatron[v] =
          program_runner(dsl::workloads::megatron_layer(DType::F32, pv, tp_dtype_, bias),
                         options.epilogue_schedules, options.executor);
    if (grid.to_next() != nullptr)
      pr.pipeline[v] =
          program_runner(dsl::workloads::pipeline_stage(DType::F32, pv, tp_dtype_, bias),
                         options.pipeline_schedules, options.executor);
    if (grid.from_prev() != nullptr)
      pr.pipeline_recv[v] =
          program_runner(dsl::workloads::pipeline_stage(DType::F32, pv, tp_dtype_, bias),
                         options.pipeline_recv_schedules, options.executor);
  }
  for (int v = 0; v < variants; ++v)
    if (pr.megatron[v]) {
      pr.attn_s[v] = pr.megatron[v]->prepare(grid.tp(), {{"B", N}, {"K", C}, {"H", C}}, bound);
      pr.mlp_s[v] = pr.megatron[v]->prepare(grid.tp(), {{"B", N}, {"K", F}, {"H", C}}, bound);
    }
  if (grid.from_prev() != nullptr || grid.to_next() != nullptr)
    pr.handoff = std::make_unique<ProgramRunner>(dsl::workloads::grad_handoff(),
                                                 std::vector<std::string>{}, options.executor);
  if (grid.from_prev() != nullptr) {
    for (int v = 0; v < variants; ++v)
      pr.recv_s[v] =
          pr.pipeline_recv[v]->prepare(*grid.from_prev(), {{"B", N}, {"K", F}, {"H", C}}, {"h"});
    pr.grad_send = pr.handoff->prepare(*grid.from_prev(), {{"N", N * C}}, {"d"});
  }
  if (grid.to_next() != nullptr) {
    for (int v = 0; v < variants; ++v)
      pr.send_s[v] =
          pr.pipeline[v]->prepare(*grid.to_next(), {{"B", N}, {"K", F}, {"H", C}}, bound);
    pr.grad_recv = pr.handoff->prepare(*grid.to_next(), {{"N", N * C}}, {"d_prev"});
  }
  if (any_shard && tp > 1) {
    pr.tp_sum_program = program_runner(dsl::workloads::sum_in_place(tp_dtype_),
                                       options.tp_sum_schedules, options.executor);
    pr.tp_sum = pr.tp_sum_program->prepare(grid.tp(), {{"N", N * C}}, {"g"});
  }
  // After the links, on both ends (the order every stage keeps); an untied head (Llama's
  // lm_head.weight) is the last stage's own.
  if (grid.tied() != nullptr && config.tie_embeddings) {
    pr.tied_sum_program = program_runner(dsl::workloads::sum_in_place(), options.tied_sum_schedules,
                                         options.executor);
    const LocalTensor& wte = tied_embedding();
    pr.tied_sum = pr.tied_sum_program->prepare(*grid.tied(), {{"N", wte.numel()}}, {"g"});
    pr.tied_sum->bind("g", grads().flat_slice(wte.local_offset, wte.numel()));
  }
  for (int v = 0; v < 2; ++v) {
    const int i = v < variants ? v : 0;
    pr.attn[v] = pr.attn_s[i].get();
    pr.mlp[v] = pr.mlp_s[i].get();
    pr.send[v] = pr.send_s[i].get();
    pr.recv[v] = pr.recv_s[i].get();
  }
}

ParallelGPT::~ParallelGPT() {
  // Hand-offs still in flight read grad_send_: let them finish before the buffers go.
  if (programs_ && programs_->grad_send) {
    try {
      programs_->grad_send->wait_sends();
    } catch (...) {
    }
  }
}

std::string ParallelGPT::epilogue_schedule() const {
  return programs_->megatron[0] ? programs_->megatron[0]->schedule_name() : "";
}
std::string ParallelGPT::epilogue_program() const {
  return programs_->megatron[0] ? programs_->megatron[0]->program().name() : "";
}
std::string ParallelGPT::pipeline_program() const {
  const auto& r = programs_->pipeline[0] ? programs_->pipeline[0] : programs_->pipeline_recv[0];
  return r ? r->program().name() : "";
}
std::string ParallelGPT::tp_sum_schedule() const {
  return programs_->tp_sum_program ? programs_->tp_sum_program->schedule_name() : "";
}
std::string ParallelGPT::pipeline_schedule() const {
  if (programs_->pipeline[0]) return programs_->pipeline[0]->schedule_name();
  return programs_->pipeline_recv[0] ? programs_->pipeline_recv[0]->schedule_name() : "";
}
std::string ParallelGPT::executor() const {
  for (const auto* r : {programs_->megatron[0].get(), programs_->pipeline[0].get(),
                        programs_->pipeline_recv[0].get()})
    if (r != nullptr) return r->executor_name();
  return "";
}

bool ParallelGPT::shard_path(int layer) const {
  const bool boundary = layer == layout_.end_layer() - 1 && grid_.to_next() != nullptr;
  return grid_.shape().tp > 1 || boundary || context_ != nullptr;
}

void ParallelGPT::emit(Phase phase, std::string_view name, Clock::time_point begin) {
  const auto end = Clock::now();
  const double total = std::chrono::duration<double>(end - begin).count();
  double self = total;
  if (phase == Phase::Comm) {
    nested_comm_s_ += total;
  } else {
    self = std::max(0.0, total - nested_comm_s_);
    nested_comm_s_ = 0.0;
  }
  if (sink_) sink_(phase, name, begin, end, self);
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
  const int v = training && config_.dropout > 0 ? 0 : 1;
  exec::Runner& s = boundary ? *programs_->send[v]
                    : e.mlp  ? *programs_->mlp[v]
                             : *programs_->attn[v];
  s.bind("x", Tensor::view_of(const_cast<void*>(e.x), e.operands, Shape{e.N * (e.K / tp)}));
  s.bind("w", Tensor::view_of(const_cast<void*>(e.w), e.operands, Shape{(e.K / tp) * e.H}));
  TANDEM_CHECK((e.bias != nullptr) == (epilogue_bias(config_) == dsl::workloads::Bias::With),
               "an epilogue's bias against its program's");
  if (e.bias != nullptr) s.bind("bias", view(e.bias, Shape{e.H}));
  s.bind("residual", view(e.residual, Shape{e.N * e.H}));
  s.bind("out", view(e.out, Shape{e.N * e.H}));
  s.set_scalar("seed", static_cast<double>(e.seed));
  s.run();
  if (boundary)
    emit(Phase::Comm, "pipeline send h." + std::to_string(e.layer), begin);
  else
    emit(Phase::Comm,
         std::string("megatron h.") + std::to_string(e.layer) + (e.mlp ? ".mlp" : ".attn"), begin);
}

void ParallelGPT::receive_activations(const nn::StepRng& rng, bool training, float* into, int B,
                                      int T) {
  const auto begin = Clock::now();
  const int64_t N = static_cast<int64_t>(B) * T, C = config_.d_model;
  const int v = training && config_.dropout > 0 ? 0 : 1;
  exec::Runner& s = *programs_->recv[v];
  // Group 1 binds no inputs, only its output; the scalar is the sender's, for the record.
  s.bind("h", view(into, Shape{N * C}));
  s.set_scalar("seed", static_cast<double>(epilogue_seed(rng, layout_.first_layer() - 1,
                                                         nn::DropoutSite::MlpResidual)));
  s.run();
  emit(Phase::Comm, "pipeline recv", begin);
}

nn::BlockParams ParallelGPT::weights_of(int layer) {
  return layout_.block_at(state_.acquire_block(layer), layer);
}

void ParallelGPT::done_with_weights(int layer) { state_.release_block(layer); }

ParallelGPT::UnitArgs ParallelGPT::unit_args(int k, int u) {
  const int l = layout_.first_layer() + u / nn::kBlockHalves;
  return UnitArgs{l, static_cast<nn::BlockHalf>(u % nn::kBlockHalves), memory_->unit(k, u),
                  memory_->input(k, u), weights_of(l)};
}

void ParallelGPT::unit_forward(int k, int u, const nn::StepRng& rng, bool training) {
  const UnitArgs a = unit_args(k, u);
  nn::Workspace& ws = memory_->workspace();
  if (shard_path(a.layer)) {
    ShardBlock sb{config_,
                  grid_.shape().tp,
                  grid_.coord().tp,
                  {},  // the forward sums nothing
                  tp_dtype_};
    sb.context = context_.get();
    sb.context_rope = &context_rope_;
    // The stage's last MLP at a pipeline boundary hands its output to the next stage.
    const bool boundary = a.half == nn::BlockHalf::Mlp && a.layer == layout_.end_layer() - 1 &&
                          grid_.to_next() != nullptr;
    shard_half_forward(sb, a.layer, a.half, a.w, a.acts, a.x, ws, micro_rows_, T_, rng,
                       [&](const EpilogueArgs& e) { run_epilogue(e, training, boundary); });
  } else if (a.half == nn::BlockHalf::Attention) {
    nn::block_attention_forward(config_, a.layer, a.w, a.acts, a.x, ws, micro_rows_, T_, rng);
  } else {
    nn::block_mlp_forward(config_, a.layer, a.w, a.acts, ws, micro_rows_, T_, rng);
  }
  done_with_weights(a.layer);
}

void ParallelGPT::unit_backward(int k, int u, const nn::StepRng& rng, float* dres) {
  const UnitArgs a = unit_args(k, u);
  const nn::BlockParams dw = layout_.block_at(state_.block_gradients(a.layer), a.layer);
  nn::Workspace& ws = memory_->workspace();
  if (shard_path(a.layer)) {
    ShardBlock sb{config_, grid_.shape().tp, grid_.coord().tp, [&](float* g, int64_t n) {
                    const auto begin = Clock::now();
                    programs_->tp_sum->bind("g", Tensor::view_of(g, DType::F32, Shape{n}));
                    programs_->tp_sum->run();
                    emit(Phase::Comm, "tp sum_in_place " + unit_name(u), begin);
                  }};
    sb.context = context_.get();
    sb.context_rope = &context_rope_;
    shard_half_backward(sb, a.layer, a.half, a.w, dw, a.acts, a.x, dres, ws, micro_rows_, T_, rng);
  } else if (a.half == nn::BlockHalf::Attention) {
    nn::block_attention_backward(config_, a.layer, a.w, dw, a.acts, a.x, dres, ws, micro_rows_, T_,
                                 rng);
  } else {
    nn::block_mlp_backward(config_, a.layer, a.w, dw, a.acts, dres, ws, micro_rows_, T_, rng);
  }
  done_with_weights(a.layer);
}

std::string ParallelGPT::unit_name(int u) const {
  return "h." + std::to_string(layout_.first_layer() + u / nn::kBlockHalves) + "." +
         std::string(nn::half_name(static_cast<nn::BlockHalf>(u % nn::kBlockHalves)));
}

void ParallelGPT::forward_micro(const MicroBatch& mb, int k, const nn::StepRng& rng, bool training,
                                double& loss_sum) {
  const int B = mb.B, T = mb.T, n = units();
  for (int u = 0; u < n; ++u) {
    memory_->begin_forward(k, u);
    if (u == 0) {
      float* x0 = memory_->input(k, 0);
      if (layout_.has_embedding()) {
        const auto begin = Clock::now();
        nn::EmbeddingActivations e;
        e[nn::EmbeddingAct::Out] = view(x0, Shape{B, T, config_.d_model});
        if (context_ != nullptr) {  // this rank's tokens at their positions (dropout refused)
          const nn::EmbeddingParams w = layout_.embedding(params().data_as<float>());
          context_embedding_forward(context_->split(), x0, mb.tokens, w.wte, w.wpe, B,
                                    config_.d_model);
        } else {
          nn::embedding_forward(config_, layout_.embedding(params().data_as<float>()), e, mb.tokens,
                                B, T, rng);
        }
        emit(Phase::Embedding, "forward embedding", begin);
      } else {
        receive_activations(rng, training, x0, B, T);
      }
    }
    // The next blocks' weights read (or gathered) while this one computes.
    if (u % nn::kBlockHalves == 0)
      state_.prefetch_blocks(layout_.first_layer() + u / nn::kBlockHalves, +1);
    const auto begin = Clock::now();
    nested_comm_s_ = 0.0;
    unit_forward(k, u, rng, training);
    emit(Phase::Forward, "forward " + unit_name(u), begin);
    if (u == n - 1 && layout_.has_final()) {
      const auto hb = Clock::now();
      loss_sum += nn::final_forward(config_, layout_.final_stage(params().data_as<float>()),
                                    memory_->head(k), memory_->input(k, n), mb.targets,
                                    memory_->workspace(), B, T);
      emit(Phase::Forward, "forward head", hb);
    }
    memory_->end_forward(k, u);
  }
}

void ParallelGPT::backward_micro(const MicroBatch& mb, int k, const nn::StepRng& rng, float dloss) {
  const int B = mb.B, T = mb.T, n = units();
  const int64_t elems = static_cast<int64_t>(B) * T * config_.d_model;
  float* base = params().data_as<float>();
  float* gbase = grads().data_as<float>();
  nn::Workspace& ws = memory_->workspace();
  float* dres = ws.dresidual();  // (B, T, C) d(loss)/d(residual stream)
  for (int u = n - 1; u >= 0; --u) {
    for (int i : memory_->begin_backward(k, u)) {
      const auto begin = Clock::now();
      nested_comm_s_ = 0.0;
      unit_forward(k, i, rng, true);
      emit(Phase::Backward, "recompute " + unit_name(i), begin);
      memory_->end_recompute(k, i);
    }
    if (u == n - 1) {
      if (layout_.has_final()) {
        const auto begin = Clock::now();
        std::memset(dres, 0, static_cast<size_t>(elems) * sizeof(float));
        nn::final_backward(config_, layout_.final_stage(base), layout_.final_stage(gbase),
                           memory_->head(k), memory_->input(k, n), mb.targets, dloss, dres, ws, B,
                           T);
        emit(Phase::Backward, "backward head", begin);
      } else {
        const auto begin = Clock::now();
        exec::Runner& handoff = *programs_->grad_recv;
        handoff.bind("d_prev", view(dres, Shape{elems}));  // received in place
        handoff.run();
        emit(Phase::Comm, "pipeline grad_handoff (recv)", begin);
      }
    }
    // As a block's backward starts: its moments for the update that follows it (in the step's
    // last backward), and the previous blocks' weights and gradient sum, read while it computes.
    const bool last_backward = k == last_backward_micro_;
    if (u % nn::kBlockHalves == nn::kBlockHalves - 1) {
      const int l = layout_.first_layer() + u / nn::kBlockHalves;
      if (last_backward) state_.prefetch_moments(l);
      state_.prefetch_blocks(l, -1);
      state_.prefetch_gradients(l - 1);
    }
    const auto begin = Clock::now();
    nested_comm_s_ = 0.0;
    unit_backward(k, u, rng, dres);
    emit(Phase::Backward, "backward " + unit_name(u), begin);
    // More backwards of this block follow in the step: its gradient sum may wait in the tier.
    if (!last_backward && u % nn::kBlockHalves == 0)
      state_.park_gradients(layout_.first_layer() + u / nn::kBlockHalves);
    if (gradients_ready_ && last_backward && u % nn::kBlockHalves == 0)
      gradients_ready_(layout_.first_layer() + u / nn::kBlockHalves);
    if (u == 0) {
      if (layout_.has_embedding()) {
        const auto eb = Clock::now();
        if (context_ != nullptr) {
          const nn::EmbeddingParams dw = layout_.embedding(gbase);
          context_embedding_backward(context_->split(), dw.wte, dw.wpe, dres, mb.tokens, B,
                                     config_.d_model);
        } else {
          nn::embedding_backward(config_, layout_.embedding(gbase), dres, mb.tokens, ws, B, T, rng);
        }
        emit(Phase::Embedding, "backward embedding", eb);
      } else {
        // Left in flight, so that this stage goes on to its next forward while the previous stage
        // is still busy: waiting here would deadlock 1F1B (both stages sending at once). The
        // send reads this micro-batch's own copy, as dres is the next backward's workspace.
        const auto hb = Clock::now();
        Tensor& buf = grad_send_[static_cast<size_t>(k)];
        std::memcpy(buf.data(), dres, static_cast<size_t>(elems) * sizeof(float));
        exec::Runner& handoff = *programs_->grad_send;
        handoff.bind("d", buf);
        handoff.run_leaving_sends();
        emit(Phase::Comm, "pipeline grad_handoff (send)", hb);
      }
    }
    memory_->end_backward(k, u);
  }
}

double ParallelGPT::forward_backward(const std::vector<MicroBatch>& micro, uint64_t seed,
                                     uint64_t step) {
  check_micro(micro);
  const int M = micro_batches_;
  const float dloss = 1.0f / static_cast<float>(M);
  double loss_sum = 0.0;
  auto rng_of = [&](int k) {
    return nn::StepRng{seed, step, micro[static_cast<size_t>(k)].sample_offset, true};
  };
  const std::vector<PipeOp> order = one_f_one_b(grid_.shape().pp, grid_.coord().pp, M);
  for (const PipeOp& op : order)
    if (op.kind == PipeOp::Backward) last_backward_micro_ = op.micro;
  for (const PipeOp& op : order) {
    const MicroBatch& mb = micro[static_cast<size_t>(op.micro)];
    if (op.kind == PipeOp::Forward)
      forward_micro(mb, op.micro, rng_of(op.micro), true, loss_sum);
    else
      backward_micro(mb, op.micro, rng_of(op.micro), dloss);
  }
  const auto begin = Clock::now();
  if (programs_->grad_send) {
    programs_->grad_send->wait_sends();
    emit(Phase::Comm, "pipeline grad_handoff (wait)", begin);
  }
  return loss_sum;
}

double ParallelGPT::forward(const std::vector<MicroBatch>& micro) {
  check_micro(micro);
  double loss_sum = 0.0;
  memory_->begin_evaluation();
  for (size_t k = 0; k < micro.size(); ++k)
    forward_micro(micro[k], static_cast<int>(k), nn::StepRng{0, 0, micro[k].sample_offset, false},
                  false, loss_sum);
  memory_->end_evaluation();
  return loss_sum;
}

void ParallelGPT::reduce_tied_gradients() {
  comm::Communicator* tied = grid_.tied();
  if (tied == nullptr || !config_.tie_embeddings) return;
  const auto begin = Clock::now();
  programs_->tied_sum->run();  // sum_in_place, bound to wte's gradient
  emit(Phase::Comm, "tied embedding sum_in_place", begin);
}

const LocalTensor& ParallelGPT::tied_embedding() const {
  // Stage 0 holds wte first; the last stage holds its copy last (shard.h).
  const LocalTensor& wte =
      grid_.first_stage() ? layout_.tensors().front() : layout_.tensors().back();
  TANDEM_CHECK(wte.name == "wte.weight", "tied tensor is '{}'", wte.name);
  return wte;
}

}  // namespace tandem::parallel
