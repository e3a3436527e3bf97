// The checks a training config passes before any rank starts, each refusal naming its flag, and
// the micro-batch count a step uses.
#include "tandem/train/train_config.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tandem/comm/communicator.h"
#include "tandem/comm/thread.h"
#include "tandem/core/bytes.h"
#include "tandem/core/error.h"
#include "tandem/data/data.h"
#include "tandem/data/token_corpus.h"
#include "tandem/ooc/plan.h"
#include "tandem/parallel/context_parallel.h"
#include "tandem/parallel/shard.h"

namespace tandem::train {
namespace {

constexpr int64_t kMaxActivationValues = int64_t{1} << 40;
constexpr int64_t kMaxRanks = int64_t{1} << 24;
constexpr int kMaxThreads = 1024;

// --cp N: the sequence cut into 2 N equal chunks (parallel::ContextSplit), and what context
// parallelism does not run yet refused, each naming the flags. (The model state's modes compose:
// the cp ranks are replicas, over which it is sliced, sharded or streamed as over dp's.)
void validate_context_parallel(const TrainConfig& c) {
  const nn::GPTConfig& model = c.model;
  const parallel::GridShape& grid = c.grid;
  const int cp = grid.cp;
  if (model.seq_len % (2 * cp) != 0)
    user_error(
        "--cp {} cuts each sequence into {} equal chunks (two a rank, balanced for the causal "
        "mask), which --seq-len {} does not divide into: give a --seq-len that is a multiple of "
        "{}",
        cp, 2 * cp, model.seq_len, 2 * cp);
  parallel::ContextSplit::check(model.seq_len, cp);
  if (model.dropout > 0)
    user_error(
        "--cp {} does not support --dropout yet (got {}): the residual and embedding masks "
        "would be drawn by a rank's token index, not the sequence's; give --dropout 0",
        cp, model.dropout);
  if (model.attention != nn::AttentionKernel::Fused)
    user_error("--cp {} runs the fused attention kernel; leave out --attention unfused", cp);
  if (!c.memory_budget.empty())
    user_error(
        "--cp {} with --memory-budget {}: out-of-core training would recompute attention, whose "
        "context-parallel exchanges are collectives; not supported yet",
        cp, c.memory_budget);
}

}  // namespace

// Automatic: one micro-batch without a pipeline. With pp stages, 2 x pp keeps the 1F1B bubble
// small; a count must divide each data-parallel rank's rows, so it is the largest divisor of the
// rows in [pp, 2 pp], else the smallest one above 2 pp, else (fewer rows than stages) one row
// each.
int TrainConfig::micro_batch_count() const {
  if (micro_batches > 0) return micro_batches;
  // With the streamed model state every further micro-batch moves each block's gradient sum
  // out to the tier and back: one unless asked for.
  if (grid.pp <= 1 || model_state) return 1;
  const int64_t rows = grid.dp > 0 ? batch / grid.dp : 0;
  if (rows < 1) return 2 * grid.pp;
  for (int64_t m = std::min<int64_t>(rows, 2 * grid.pp); m >= grid.pp; --m)
    if (rows % m == 0) return static_cast<int>(m);
  for (int64_t m = 2 * int64_t{grid.pp} + 1; m <= rows; ++m)
    if (rows % m == 0) return static_cast<int>(m);
  return static_cast<int>(rows);
}

int TrainConfig::fewest_stage_blocks() const {
  // As parallel::stage_first_layer splits them: evenly, the fewest hold layers / pp; else the
  // smallest of --stage-layers.
  if (!grid.stage_layers.empty())
    return std::max(1, *std::min_element(grid.stage_layers.begin(), grid.stage_layers.end()));
  return std::max(1, model.n_layers / std::max(1, grid.pp));
}

void TrainConfig::validate() const {
  // The model's sizes by the flags that set them, before nn's own check names its fields.
  if (model.n_layers < 1) user_error("--layers {} must be at least 1", model.n_layers);
  if (model.n_heads < 1) user_error("--heads {} must be at least 1", model.n_heads);
  if (model.d_model < 1) user_error("--d-model {} must be at least 1", model.d_model);
  if (model.d_model % model.n_heads != 0)
    user_error("--d-model {} must be divisible by --heads {}", model.d_model, model.n_heads);
  if (model.seq_len < 1) user_error("--seq-len {} must be at least 1", model.seq_len);
  // Upper bounds first, so that no later count overflows or spins (nn::GPTConfig's limits).
  if (model.n_layers > nn::kMaxLayers)
    user_error("--layers {} must be at most {}", model.n_layers, nn::kMaxLayers);
  if (model.d_model > nn::kMaxWidth)
    user_error("--d-model {} must be at most {}", model.d_model, nn::kMaxWidth);
  if (model.seq_len > nn::kMaxPositions)
    user_error("--seq-len {} must be at most {}", model.seq_len, nn::kMaxPositions);
  // A resumed model keeps the positions it was made with (max_positions; a new run's are
  // --seq-len): GPT-2 has a learned vector for each and none past them.
  if (model.seq_len > model.max_positions)
    user_error(
        "--seq-len {} is more than the model's {} positions (set when it was first trained{}): "
        "at most {}",
        model.seq_len, model.max_positions,
        model.llama() ? "" : "; GPT-2 learns a vector a position", model.max_positions);
  if (!(model.dropout >= 0.0f && model.dropout < 1.0f))
    user_error("--dropout {} must be in [0, 1)", model.dropout);
  if (model.llama()) {
    if (model.kv_heads > 0 && model.n_heads % model.kv_heads != 0)
      user_error("--kv-heads {} must divide --heads {}", model.kv_heads, model.n_heads);
    if (model.head_size() % 2 != 0)
      user_error(
          "--d-model {} / --heads {} is a head of {}: rotary positions rotate pairs, so a Llama "
          "head size must be even",
          model.d_model, model.n_heads, model.head_size());
    if (model.ffn > nn::kMaxWidth)
      user_error("--ffn {} must be at most {}", model.ffn, nn::kMaxWidth);
  }
  model.validate();
  // The data decides the vocabulary: 256 for bytes, the tokenizer's for a shard folder.
  if (const int v = data::data_vocab_size(data); model.vocab_size != v)
    user_error("the model's vocabulary is {}; the data ({}) has {} tokens", model.vocab_size,
               data.empty() ? "the synthetic corpus" : data, v);
  if (batch < 1) user_error("--batch {} must be at least 1", batch);
  // The largest activation of a layer over the global batch: the MLP's (B, T, 4C) or, with the
  // unfused attention kernel, the scores (B, H, T, T) (the fused one saves (B, H, T));
  // within this bound every activation count fits 64 bits.
  const long double mlp =
      static_cast<long double>(batch) * model.seq_len * static_cast<long double>(model.fc_width());
  const long double scores =
      model.attention == nn::AttentionKernel::Unfused
          ? static_cast<long double>(batch) * model.n_heads * model.seq_len * model.seq_len
          : 0.0L;
  if (std::max(mlp, scores) > static_cast<long double>(kMaxActivationValues))
    user_error(
        "--batch {} x --seq-len {}: a layer's largest activation would hold {:.3g} values "
        "(the {}); at most 2^40",
        batch, model.seq_len, static_cast<double>(std::max(mlp, scores)),
        mlp >= scores ? fmt::format("MLP's, {} wide", model.fc_width())
                      : std::string("--attention unfused's scores, --heads x --seq-len x "
                                    "--seq-len; --attention fused saves --heads x --seq-len"));
  if (steps < 0) user_error("--steps {} must be 0 or more", steps);
  // The optimizer programs compute in f32: a rate past its range would be infinite there.
  if (!(lr > 0) || !(lr <= std::numeric_limits<float>::max()))
    user_error("--lr {} must be positive and finite in f32 (at most {:g})", lr,
               std::numeric_limits<float>::max());
  if (warmup < 0) user_error("--warmup {} must be 0 or more", warmup);
  if (!(min_lr_ratio >= 0 && min_lr_ratio <= 1))
    user_error("the minimum learning-rate ratio {} must be in [0, 1]", min_lr_ratio);
  TANDEM_CHECK(optimizer.grad_dtype == DType::F32,
               "the gradients' dtype is TrainConfig::grad_dtype, not optimizer.grad_dtype");
  parallel::OptimizerConfig with_dtype = optimizer;
  with_dtype.grad_dtype = grad_dtype.value_or(DType::F32);
  with_dtype.validate();
  // Given values (a decided auto is one of them already).
  const DType tp = tp_dtype.value_or(DType::F32);
  if (tp != DType::F32 && tp != DType::BF16)
    user_error(
        "--tp-dtype {}: the tensor-parallel dtypes are f32 and bf16 (or auto: the autotuner's "
        "choice)",
        dtype_name(tp));
  if (!tp_dtype.is_auto() && tp == DType::BF16 && model.matmul != DType::BF16)
    user_error(
        "--tp-dtype bf16 carries bf16 matmul operands and products between the tensor-parallel "
        "ranks: it needs --precision bf16 (this run's precision is fp32; --tp-dtype f32 or auto "
        "trains it)");
  auto flag = [](const char* name, const auto& check) {
    try {
      check();
    } catch (const UserError& e) {
      user_error("{}: {}", name, e.what());
    }
  };
  if (!memory_budget.empty()) flag("--memory-budget", [&] { parse_budget(memory_budget, 1); });
  if (plan_only && memory_budget.empty()) user_error("tandem plan needs --memory-budget");
  if (!ooc_plan.empty()) {
    if (memory_budget.empty())
      user_error("--ooc-plan needs --memory-budget (a plan places memory within a budget)");
    flag("--ooc-plan", [&] { ooc::Plan::parse(ooc_plan); });
  }
  if (grid.dp < 1 || grid.tp < 1 || grid.pp < 1)
    user_error("--dp {}, --tp {}, --pp {}: each must be at least 1", grid.dp, grid.tp, grid.pp);
  if (grid.cp < 1) user_error("--cp {} must be at least 1", grid.cp);
  const int64_t ranks = int64_t{grid.dp} * grid.tp * grid.pp * grid.cp;
  // "--dp 2 x --tp 2 x --pp 1", and " x --cp 2" where it is given.
  const std::string product =
      fmt::format("--dp {} x --tp {} x --pp {}{}", grid.dp, grid.tp, grid.pp,
                  grid.cp != 1 ? fmt::format(" x --cp {}", grid.cp) : std::string());
  if (ranks > kMaxRanks) user_error("{} is {} ranks; at most {}", product, ranks, kMaxRanks);
  if (backend == comm::Backend::Thread && ranks > comm::kMaxThreadRanks)
    user_error(
        "{} is {} ranks; the thread backend runs at most {}, each a thread of this process: use "
        "--backend mpi under mpirun for more",
        product, ranks, comm::kMaxThreadRanks);
  if (grid.cp > 1) validate_context_parallel(*this);
  if (micro_batches < 0)
    user_error("--micro-batches {} must be 0 (automatic) or more", micro_batches);
  if (model.n_heads % grid.tp != 0)
    user_error("--tp {} must divide the number of heads ({})", grid.tp, model.n_heads);
  if (model.n_kv_heads() % grid.tp != 0)
    user_error(
        "--tp {} must divide the key/value heads ({}, --kv-heads): each rank keeps whole "
        "key/value heads",
        grid.tp, model.n_kv_heads());
  if (model.mlp_width() % grid.tp != 0)
    user_error("--tp {} must divide the MLP's width ({}, --ffn)", grid.tp, model.mlp_width());
  if (grid.pp > model.n_layers)
    user_error("--pp {} needs at least {} layers; the model has {}", grid.pp, grid.pp,
               model.n_layers);
  if (std::string why = parallel::stage_layers_problem(model.n_layers, grid); !why.empty())
    user_error("{}", why);
  if (batch % grid.dp != 0)
    user_error("--batch {} does not split evenly over --dp {} data-parallel ranks", batch, grid.dp);
  const int M = micro_batch_count();
  if ((batch / grid.dp) % M != 0)
    user_error(
        "each data-parallel rank's {} rows do not split evenly into {} micro-batches "
        "(--batch {}, --dp {}, --micro-batches {})",
        batch / grid.dp, M, batch, grid.dp, M);
  if (!(validation_fraction >= 0 && validation_fraction < 1))
    user_error("the validation fraction {} must be in [0, 1)", validation_fraction);
  if (eval_every < 0) user_error("--eval-every {} must be 0 (never) or more", eval_every);
  if (eval_every > 0 && eval_batches < 1)
    user_error("--eval-batches {} must be at least 1", eval_batches);
  if (eval_every > 0 && validation_fraction <= 0)
    user_error("validation every {} steps needs a validation split (fraction > 0)", eval_every);
  if (save_every < 0) user_error("--save-every {} must be 0 or more", save_every);
  if (save_every > 0 && save_dir.empty()) user_error("--save-every needs --save DIR");
  if (!init_from.empty() && !resume_dir.empty())
    user_error(
        "--init-from '{}' starts a new run from a Hugging Face folder and --resume '{}' continues "
        "a tandem checkpoint: give one of them",
        init_from, resume_dir);
  if (keep_checkpoints < 1)
    user_error("--keep-checkpoints {} must be at least 1 (the newest checkpoint is always kept)",
               keep_checkpoints);
  if (comm_timeout_s && !(std::isfinite(*comm_timeout_s) && *comm_timeout_s >= 0))
    user_error("--comm-timeout {} must be a number of seconds, 0 (wait forever) or more",
               *comm_timeout_s);
  if (comm_timeout_s && *comm_timeout_s > comm::kMaxCommTimeoutS)
    user_error("--comm-timeout {} must be at most {:g} seconds (0: wait forever)", *comm_timeout_s,
               comm::kMaxCommTimeoutS);
  // The environment's settings the run's collectives read, checked now rather than in the
  // thread that first reads them.
  if (!comm_timeout_s) comm::comm_timeout_s();
  comm::chunk_bytes();
  if (blas_threads < 0 || blas_threads > kMaxThreads)
    user_error("--threads {} must be 0 (automatic) to {}", blas_threads, kMaxThreads);
  if (!resident_blocks.is_auto() && resident_blocks.value() < 0)
    user_error("--resident-blocks {}: give a count of blocks (0 or more) or auto",
               resident_blocks.value());
  if (!resident_blocks.is_auto() && !model_state)
    user_error(
        "--resident-blocks {} keeps blocks of a streamed model state in memory: it needs "
        "--model-state host|file:DIR",
        resident_blocks.value());
  if (!gather_ahead.is_auto() && gather_ahead.value() < 1)
    user_error("--gather-ahead {}: give a count of blocks (1 or more) or auto",
               gather_ahead.value());
  if (!gather_ahead.is_auto() && optimizer.sharding != parallel::Sharding::Weights)
    user_error(
        "--gather-ahead {} sets how far ahead --shard weights gathers the blocks' weights: it "
        "needs --shard weights (got --shard {})",
        gather_ahead.value(), parallel::sharding_name(optimizer.sharding));
  if (optimizer.sharding == parallel::Sharding::Weights) {
    // The state is sliced over the dp x cp replicas (the optimizer's group), so context-parallel
    // ranks alone have peers to share it with.
    if (grid.replicas() < 2)
      user_error(
          "--shard weights shards the model state across the data-parallel replicas (dp x cp "
          "ranks): it needs --dp or --cp 2 or more (got --dp {} --cp {})",
          grid.dp, grid.cp);
    if (optimizer.clip_grad_norm)
      user_error(
          "--shard weights updates each block before the whole gradient's norm is known; "
          "--clip-grad-norm cannot be used with it");
    if (!gather_ahead.is_auto() && gather_ahead.value() > most_gather_ahead())
      user_error(
          "--gather-ahead {}: a pipeline stage holds {} blocks here, so at most {} can be gathered "
          "ahead of the one computing",
          gather_ahead.value(), fewest_stage_blocks(), most_gather_ahead());
    if (optimizer.state_tier)
      user_error(
          "--shard weights with --optimizer-state {}: the moments of a sharded model state go to "
          "a slow tier with its weights; give --model-state {} instead",
          optimizer.state_tier->str(), optimizer.state_tier->str());
  }
  if (model_state) {
    if (optimizer.clip_grad_norm)
      user_error(
          "--model-state {} updates each block before the whole gradient's norm is known; "
          "--clip-grad-norm cannot be used with it",
          model_state->str());
    if (optimizer.state_tier)
      user_error(
          "--model-state {} already keeps the optimizer state in its tier; leave out "
          "--optimizer-state",
          model_state->str());
  }
  const double model_mib =
      static_cast<double>(nn::gpt_num_parameters(model)) * sizeof(float) / (1 << 20);
  if (optimizer.bucket_mb && *optimizer.bucket_mb > model_mib)
    user_error("--bucket-mb {}: the model's parameters are {:.2f} MiB; a bucket must be smaller",
               *optimizer.bucket_mb, model_mib);
}

double learning_rate(const TrainConfig& c, int64_t step) {
  if (c.warmup > 0 && step < c.warmup)
    return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup);
  const double min_lr = c.lr * c.min_lr_ratio;
  const int64_t span = c.steps - c.warmup;
  if (span <= 1) return c.lr;
  const double t =
      std::min(1.0, static_cast<double>(step - c.warmup) / static_cast<double>(span - 1));
  return min_lr + 0.5 * (c.lr - min_lr) * (1.0 + std::cos(M_PI * t));
}

}  // namespace tandem::train
