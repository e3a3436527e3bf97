// `tandem train`: trains a GPT-2 model on a byte corpus across in-process or MPI ranks (flags
// into a TrainConfig; the loop is train/trainer).
#include <fmt/format.h>

#include <memory>

#include "commands.h"
#include "tandem/core/error.h"
#include "tandem/train/trainer.h"

namespace tandem::cli {
namespace {

struct ModelPreset {
  int layers, heads, d_model, seq_len;
  int64_t batch;
};

// tiny: seconds on one core (tests, smoke runs). small: the default run, a minute on 2 cores.
ModelPreset preset(const std::string& name) {
  if (name == "tiny") return {2, 2, 64, 64, 8};
  if (name == "small") return {4, 4, 128, 64, 16};
  user_error("--model {}: the presets are tiny and small", name);
}

struct TrainFlags {
  std::string model = "small";
  int layers = 0, heads = 0, d_model = 0, seq_len = 0;
  int64_t batch = 0;
  float dropout = 0.0f;
  train::TrainConfig cfg;
  bool quiet = false;
};

}  // namespace

void add_train(CLI::App& app) {
  auto flags = std::make_shared<TrainFlags>();
  train::TrainConfig& c = flags->cfg;
  // The default run: 4 in-process ranks, 2-way data- and 2-way tensor-parallel.
  c.grid = {2, 2, 1};
  c.steps = 300;
  c.lr = 3e-3;
  c.warmup = 30;
  c.eval_every = 50;

  auto* cmd = app.add_subcommand("train", "Train a GPT-2 model, data-, tensor- and pipeline-parallel");
  cmd->add_option("--model", flags->model, "Model preset: tiny or small")->capture_default_str();
  auto* o_layers = cmd->add_option("--layers", flags->layers, "Transformer blocks (overrides the preset)");
  auto* o_heads = cmd->add_option("--heads", flags->heads, "Attention heads");
  auto* o_dmodel = cmd->add_option("--d-model", flags->d_model, "Model width");
  auto* o_seq = cmd->add_option("--seq-len", flags->seq_len, "Tokens per sequence");
  auto* o_batch = cmd->add_option("--batch", flags->batch, "Sequences per step (the global batch)");
  auto* o_dropout = cmd->add_option("--dropout", flags->dropout, "Dropout probability (GPT-2's three sites)");
  cmd->add_option("--steps", c.steps, "Train until this many optimizer steps")->capture_default_str();
  cmd->add_option("--lr", c.lr, "Peak learning rate")->capture_default_str();
  cmd->add_option("--warmup", c.warmup, "Linear warm-up steps, then cosine decay")->capture_default_str();
  cmd->add_option("--min-lr-ratio", c.min_lr_ratio, "Final learning rate as a fraction of --lr")->capture_default_str();
  cmd->add_option("--seed", c.seed, "Seed of initialisation, batches and dropout")->capture_default_str();
  cmd->add_option("--optimizer", c.optimizer.name, "adamw or lamb")->capture_default_str();
  cmd->add_option("--beta1", c.optimizer.beta1, "Adam's beta1")->capture_default_str();
  cmd->add_option("--beta2", c.optimizer.beta2, "Adam's beta2")->capture_default_str();
  cmd->add_option("--eps", c.optimizer.eps, "Adam's epsilon")->capture_default_str();
  cmd->add_option("--weight-decay", c.optimizer.weight_decay, "Decoupled weight decay")->capture_default_str();
  cmd->add_option("--grad-dtype", c.optimizer.grad_dtype,
                  "Gradients in the optimizer program: f32, or bf16 (half the bytes reduced; f32 master weights)")
      ->capture_default_str();
  cmd->add_option("--dp", c.grid.dp, "Data-parallel ranks")->capture_default_str();
  cmd->add_option("--tp", c.grid.tp, "Tensor-parallel ranks (must divide --heads)")->capture_default_str();
  cmd->add_option("--pp", c.grid.pp, "Pipeline stages (at most --layers)")->capture_default_str();
  cmd->add_option("--micro-batches", c.micro_batches, "Micro-batches per step and data-parallel rank (0: 1, or 2 x pp)")
      ->capture_default_str();
  cmd->add_option("--backend", c.backend, "thread (ranks in this process) or mpi (under mpirun)")->capture_default_str();
  cmd->add_option("--executor", c.executor, "How the DSL programs run: compiled (JIT), plan or reference")
      ->capture_default_str();
  cmd->add_flag("--tune", c.tune, "Autotune every program's schedule for this run first (cached)");
  cmd->add_option("--data", c.data, "Train on this text file (bytes as tokens); default: the built-in synthetic corpus");
  cmd->add_option("--val-fraction", c.validation_fraction, "Fraction of the data held out for validation")
      ->capture_default_str();
  cmd->add_option("--eval-every", c.eval_every, "Validation loss every N steps (0: never)")->capture_default_str();
  cmd->add_option("--eval-batches", c.eval_batches, "Batches per validation")->capture_default_str();
  cmd->add_option("--save", c.save_dir, "Write a checkpoint to DIR at the end");
  cmd->add_option("--save-every", c.save_every, "Also every N steps");
  cmd->add_option("--resume", c.resume_dir, "Continue from the checkpoint in DIR (its model unless flags say otherwise)");
  cmd->add_option("--metrics", c.metrics_path, "Write one JSON line per step to FILE");
  cmd->add_option("--trace", c.trace_path, "Write a Chrome trace (Perfetto) to FILE");
  cmd->add_option("--threads", c.blas_threads, "BLAS threads (0: hardware threads / in-process ranks)")->capture_default_str();
  cmd->add_flag("--quiet", flags->quiet, "Only the summary, no progress lines");

  cmd->callback([flags, o_layers, o_heads, o_dmodel, o_seq, o_batch, o_dropout] {
    train::TrainConfig cfg = flags->cfg;
    ModelPreset p = preset(flags->model);
    nn::GPTConfig& m = cfg.model;
    // A resumed run takes the checkpoint's model and batch unless flags say otherwise (and then
    // the trainer refuses a model that does not match).
    bool from_checkpoint = false;
    if (!cfg.resume_dir.empty()) {
      const train::Checkpoint ck = train::load_checkpoint(cfg.resume_dir, false);
      const nn::GPTConfig saved =
          train::model_config_from_json(ck.meta.model_config, "checkpoint '" + cfg.resume_dir + "'");
      p = {saved.n_layers, saved.n_heads, saved.d_model, saved.seq_len, p.batch};
      if (ck.meta.extra.contains("batch") && ck.meta.extra["batch"].is_number_integer())
        p.batch = ck.meta.extra["batch"].get<int64_t>();
      m.max_positions = saved.max_positions;
      if (o_dropout->count() == 0) flags->dropout = saved.dropout;
      from_checkpoint = true;
    }
    m.n_layers = o_layers->count() ? flags->layers : p.layers;
    m.n_heads = o_heads->count() ? flags->heads : p.heads;
    m.d_model = o_dmodel->count() ? flags->d_model : p.d_model;
    m.seq_len = o_seq->count() ? flags->seq_len : p.seq_len;
    if (!from_checkpoint) m.max_positions = m.seq_len;
    m.dropout = flags->dropout;
    cfg.batch = o_batch->count() ? flags->batch : p.batch;
    cfg.progress = !flags->quiet;
    train::train(cfg);
  });
}

}  // namespace tandem::cli
