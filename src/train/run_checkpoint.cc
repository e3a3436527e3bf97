// The checkpoint a training run saves, and the checkpoint it resumes from read and checked.
#include "run_checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <utility>

#include "corpus_cache.h"
#include "settings.h"
#include "tandem/comm/agree.h"
#include "tandem/comm/communicator.h"
#include "tandem/core/error.h"
#include "tandem/io/checkpoint_series.h"
#include "tandem/io/json_file.h"

namespace tandem::train {

std::shared_ptr<const ResumeState> prepare_resume(const TrainConfig& cfg) {
  if (!cfg.init_from.empty()) return detail::prepare_init(cfg);
  if (cfg.resume_dir.empty()) return nullptr;
  const std::string& dir = cfg.resume_dir;
  auto reader = std::make_shared<const io::CheckpointReader>(dir, true);
  const io::RunMeta& meta = reader->meta();
  io::check_config_compatible(dir, meta.model_config, model_config_to_json(cfg.model),
                              model_compat_keys());
  const std::string_view optimizer = parallel::optimizer_name(cfg.optimizer.kind);
  if (meta.optimizer != optimizer)
    user_error("checkpoint '{}' was trained with optimizer {}, this run asks for {}", dir,
               meta.optimizer, optimizer);
  auto names = [](const io::SafetensorsReader& file) {
    std::vector<std::string> out;
    for (const io::SafetensorsEntry& e : file.tensors()) out.push_back(e.name);
    return out;
  };
  detail::check_tensor_names(names(reader->weights()), cfg.model, {""}, reader->weights().path());
  detail::check_tensor_names(names(reader->optimizer()), cfg.model, {"m.", "v."},
                             reader->optimizer().path());
  auto r = std::make_shared<ResumeState>();
  r->meta = meta;
  r->folder = reader->folder();
  r->reader = reader;

  const std::shared_ptr<const data::Corpus> corpus = detail::corpus_for(cfg);
  if (meta.data_fingerprint != corpus->fingerprint_hex())
    r->warnings.push_back(fmt::format(
        "checkpoint '{}' was trained on {} (fingerprint {}); this run reads {} (fingerprint {}), "
        "so its batches differ from the original run's",
        dir, meta.data_source, meta.data_fingerprint, corpus->source, corpus->fingerprint_hex()));
  const nlohmann::json& x = meta.extra;
  if (x.contains("batch") && x["batch"] != cfg.batch)
    r->warnings.push_back(fmt::format("checkpoint '{}' was trained with batch {}, this run uses {}",
                                      dir, io::json_excerpt(x["batch"]), cfg.batch));
  if (meta.rng_seed != cfg.seed)
    r->warnings.push_back(fmt::format("checkpoint '{}' was trained with seed {}, this run uses {}",
                                      dir, meta.rng_seed, cfg.seed));
  return r;
}

namespace detail {

io::RunMeta run_meta(const TrainConfig& cfg, const data::Corpus& corpus, int64_t step) {
  io::RunMeta meta;
  meta.model_config = meta_json(Meta::ModelConfig, cfg);
  meta.step = step;
  meta.data_source = corpus.source;
  meta.data_fingerprint = corpus.fingerprint_hex();
  meta.data_position = step;  // the sampler is counter-based: the next step to draw
  meta.rng_seed = cfg.seed;
  meta.rng_counter = step;  // dropout keys are (seed, step)
  meta.optimizer = parallel::optimizer_name(cfg.optimizer.kind);
  meta.optimizer_hparams = meta_json(Meta::Hyperparameters, cfg);
  meta.extra = meta_json(Meta::Extra, cfg);
  // Which tokenizer the model's ids belong to: tandem sample and eval decode with it.
  if (!corpus.tokenizer_path.empty()) {
    meta.extra["tokenizer"] = std::filesystem::absolute(corpus.tokenizer_path).string();
    meta.extra["tokenizer_sha256"] = corpus.tokenizer_sha256;
  }
  return meta;
}

namespace {

// The parameter each checkpoint tensor holds, and which part of the state: "m.h.0.ln_1.weight"
// is the first moment of h.0.ln_1.weight.
struct StateTensor {
  parallel::StatePart part;
  const nn::ParamSpec* spec;
};

class StateTensors {
 public:
  explicit StateTensors(const nn::GPTConfig& c) : specs_(nn::gpt_parameter_specs(c)) {
    for (const nn::ParamSpec& s : specs_) largest_ = std::max(largest_, s.numel());
  }
  StateTensor operator()(const std::string& name) const {
    using parallel::StatePart;
    const StatePart part = name.starts_with("m.")   ? StatePart::M
                           : name.starts_with("v.") ? StatePart::V
                                                    : StatePart::Weights;
    const std::string param = part == StatePart::Weights ? name : name.substr(2);
    for (const nn::ParamSpec& s : specs_)
      if (s.name == param) return {part, &s};
    TANDEM_CHECK(false, "no parameter for checkpoint tensor {}", name);
    return {part, nullptr};
  }
  const std::vector<nn::ParamSpec>& specs() const { return specs_; }
  int64_t largest() const { return largest_; }

 private:
  std::vector<nn::ParamSpec> specs_;
  int64_t largest_ = 0;
};

std::string describe_non_finite(const std::string& name, float* data, const Shape& shape) {
  return io::non_finite_values({{name, Tensor::view_of(data, DType::F32, shape)}});
}

}  // namespace

SaveResult save_state(const TrainConfig& cfg, const data::Corpus& corpus, int64_t step,
                      const parallel::ParallelGPT& model, parallel::DataParallelOptimizer& opt) {
  const StateTensors tensors(cfg.model);
  const std::vector<io::TensorSpec> weights = checkpoint_specs(cfg.model, {""}),
                                    moments = checkpoint_specs(cfg.model, {"m.", "v."});
  std::vector<float> buf(static_cast<size_t>(tensors.largest()));
  SaveResult result;
  result.folder = (std::filesystem::path(cfg.save_dir) / io::step_folder_name(step)).string();
  // Every rank gathers every tensor in the files' order; world rank 0 appends it. All ranks hold
  // the same gathered values, so all see the same non-finite tensor and stop together.
  auto stream = [&](io::CheckpointWriter* out) {
    parallel::StateStreamer streamer(model, &opt);
    for (const auto& [part, specs] : {std::pair{io::CheckpointPart::Weights, &weights},
                                      std::pair{io::CheckpointPart::Optimizer, &moments}})
      for (const io::TensorSpec& t : io::safetensors_order(*specs)) {
        const StateTensor st = tensors(t.name);
        streamer.gather(st.part, *st.spec, buf.data());
        result.not_finite = describe_non_finite(t.name, buf.data(), t.shape);
        if (!result.not_finite.empty()) return false;
        if (out != nullptr) out->append(part, buf.data(), t.nbytes());
      }
    return true;
  };
  if (model.grid().world().rank() == 0) {
    struct NotFinite {};  // the writer is dropped uncommitted: the series stays as it was
    try {
      result.folder = io::save_in_series(
          cfg.save_dir, run_meta(cfg, corpus, step), weights, moments,
          [&](io::CheckpointWriter& out) {
            if (!stream(&out)) throw NotFinite{};
          },
          cfg.keep_checkpoints);
    } catch (const NotFinite&) {
    }
  } else {
    stream(nullptr);
  }
  return result;
}

void restore_state(const ResumeState& resume, const parallel::ParallelGPT& model,
                   parallel::DataParallelOptimizer& opt) {
  if (resume.init_weights) return restore_hf_weights(resume, model);
  const nn::GPTConfig& c = model.config();
  const StateTensors tensors(c);
  comm::Communicator& world = model.grid().world();
  const bool reads = world.rank() == 0;
  std::optional<CheckpointTensors> weights, moments;
  if (reads) {
    weights.emplace(resume.reader->weights());
    moments.emplace(resume.reader->optimizer());
  }
  std::vector<float> buf(static_cast<size_t>(tensors.largest()));
  parallel::StateStreamer streamer(model, &opt);
  using parallel::StatePart;
  for (const nn::ParamSpec& spec : tensors.specs())
    for (const StatePart part : {StatePart::Weights, StatePart::M, StatePart::V}) {
      std::string error;
      if (reads) {
        const std::string prefix = part == StatePart::M ? "m." : part == StatePart::V ? "v." : "";
        try {
          (part == StatePart::Weights ? *weights : *moments).read(prefix, spec, buf.data());
          // Continuing from a diverged model would only diverge again; a negative second moment
          // is no Adam state at all.
          io::refuse_non_finite(
              {{prefix + spec.name, Tensor::view_of(buf.data(), DType::F32, spec.shape)}},
              resume.folder, part == StatePart::Weights ? "weights" : "optimizer state");
          if (part == StatePart::V) {
            const auto neg = std::find_if(buf.begin(), buf.begin() + spec.numel(),
                                          [](float x) { return x < 0.0f; });
            if (neg != buf.begin() + spec.numel())
              error = fmt::format(
                  "checkpoint '{}' holds a negative second moment ({} at element {} of "
                  "tensor 'v.{}'): no optimizer wrote it; the file was altered",
                  resume.folder, *neg, neg - buf.begin(), spec.name);
          }
        } catch (const UserError& e) {
          error = e.what();
        }
      }
      error = comm::broadcast_string(world, error);
      if (!error.empty()) throw comm::CollectiveError(error);  // every rank, together
      streamer.scatter(part, spec, buf.data());
    }
  streamer.finish();
}

}  // namespace detail
}  // namespace tandem::train
