// The checkpoint a training run saves, and the checkpoint it resumes from read and checked.
#include "run_checkpoint.h"

#include <fmt/format.h>

#include <filesystem>
#include <memory>

#include "corpus_cache.h"
#include "tandem/core/error.h"

namespace tandem::train {

std::shared_ptr<const ResumeState> prepare_resume(const TrainConfig& cfg) {
  if (cfg.resume_dir.empty()) return nullptr;
  const std::string& dir = cfg.resume_dir;
  const io::Checkpoint ck = io::load_checkpoint(dir, true);
  const io::RunMeta& meta = ck.meta;
  // Continuing from a diverged model would only diverge again.
  io::refuse_non_finite(ck.weights, ck.folder, "weights");
  io::refuse_non_finite(ck.optimizer, ck.folder, "optimizer state");
  io::check_config_compatible(dir, meta.model_config, model_config_to_json(cfg.model),
                              model_compat_keys());
  const std::string_view optimizer = parallel::optimizer_name(cfg.optimizer.kind);
  if (meta.optimizer != optimizer)
    user_error("checkpoint '{}' was trained with optimizer {}, this run asks for {}", dir,
               meta.optimizer, optimizer);
  auto r = std::make_shared<ResumeState>();
  r->meta = meta;
  r->folder = ck.folder;
  const std::string weights_file = ck.folder + "/" + std::string(io::kWeightsFile);
  const std::string opt_file = ck.folder + "/" + std::string(io::kOptimizerFile);
  detail::check_tensor_names(ck.weights, cfg.model, {""}, weights_file);
  detail::check_tensor_names(ck.optimizer, cfg.model, {"m.", "v."}, opt_file);
  r->state.weights = detail::whole_from_tensors(ck.weights, cfg.model, "", weights_file);
  r->state.m = detail::whole_from_tensors(ck.optimizer, cfg.model, "m.", opt_file);
  r->state.v = detail::whole_from_tensors(ck.optimizer, cfg.model, "v.", opt_file);

  const std::shared_ptr<const Corpus> corpus = detail::corpus_for(cfg);
  if (meta.data_fingerprint != corpus->fingerprint_hex())
    r->warnings.push_back(fmt::format(
        "checkpoint '{}' was trained on {} (fingerprint {}); this run reads {} (fingerprint {}), "
        "so its batches differ from the original run's",
        dir, meta.data_source, meta.data_fingerprint, corpus->source, corpus->fingerprint_hex()));
  const nlohmann::json& x = meta.extra;
  if (x.contains("batch") && x["batch"] != cfg.batch)
    r->warnings.push_back(fmt::format("checkpoint '{}' was trained with batch {}, this run uses {}",
                                      dir, x["batch"].dump(), cfg.batch));
  if (meta.rng_seed != cfg.seed)
    r->warnings.push_back(fmt::format("checkpoint '{}' was trained with seed {}, this run uses {}",
                                      dir, meta.rng_seed, cfg.seed));
  return r;
}

namespace detail {

io::Checkpoint run_checkpoint(const TrainConfig& cfg, const Corpus& corpus, int64_t step,
                              parallel::WholeModelState& state) {
  io::Checkpoint ck;
  ck.meta.model_config = model_config_to_json(cfg.model);
  ck.meta.step = step;
  ck.meta.data_source = corpus.source;
  ck.meta.data_fingerprint = corpus.fingerprint_hex();
  ck.meta.data_position = step;  // the sampler is counter-based: the next step to draw
  ck.meta.rng_seed = cfg.seed;
  ck.meta.rng_counter = step;  // dropout keys are (seed, step)
  ck.meta.optimizer = parallel::optimizer_name(cfg.optimizer.kind);
  nlohmann::json h = cfg.optimizer.to_json();
  h["lr"] = cfg.lr;
  h["warmup"] = cfg.warmup;
  h["min_lr_ratio"] = cfg.min_lr_ratio;
  ck.meta.optimizer_hparams = h;
  ck.meta.extra = {{"batch", cfg.batch},
                   {"steps", cfg.steps},
                   {"micro_batches", cfg.micro_batch_count()},
                   {"grid", {{"dp", cfg.grid.dp}, {"tp", cfg.grid.tp}, {"pp", cfg.grid.pp}}},
                   {"validation_fraction", cfg.validation_fraction}};
  // Which tokenizer the model's ids belong to: tandem sample and eval decode with it.
  if (!corpus.tokenizer_path.empty()) {
    ck.meta.extra["tokenizer"] = std::filesystem::absolute(corpus.tokenizer_path).string();
    ck.meta.extra["tokenizer_sha256"] = corpus.tokenizer_sha256;
  }
  ck.weights = tensor_views(state.weights, cfg.model, "");
  ck.optimizer = tensor_views(state.m, cfg.model, "m.");
  for (io::NamedTensor& t : tensor_views(state.v, cfg.model, "v."))
    ck.optimizer.push_back(std::move(t));
  return ck;
}

}  // namespace detail
}  // namespace tandem::train
