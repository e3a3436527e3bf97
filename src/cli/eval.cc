// `tandem eval`: the mean loss of a checkpoint's model on a text file (or on the synthetic
// corpus's validation split), over consecutive windows of its training sequence length.
#include <fmt/format.h>

#include <cmath>
#include <memory>

#include "commands.h"
#include "tandem/core/error.h"
#include "tandem/train/data.h"
#include "tandem/train/trainer.h"

namespace tandem::cli {
namespace {

struct EvalFlags {
  std::string checkpoint;
  std::string data;
  int batch = 8;
  int seq_len = 0;
  int64_t max_windows = 0;
};

}  // namespace

void add_eval(CLI::App& app) {
  auto f = std::make_shared<EvalFlags>();
  auto* cmd = app.add_subcommand("eval", "Mean loss of a checkpoint on a text file");
  cmd->add_option("--checkpoint", f->checkpoint,
                  "Checkpoint folder (written by tandem train --save)")
      ->required();
  cmd->add_option(
      "--data", f->data,
      "Text file to score, all of it (default: the synthetic corpus's validation split)");
  cmd->add_option("--batch", f->batch, "Windows per forward pass")->capture_default_str();
  auto* seq_len = cmd->add_option("--seq-len", f->seq_len,
                                  "Window length (default: the model's training length)");
  cmd->add_option("--max-windows", f->max_windows, "Score at most this many windows (0: all)")
      ->capture_default_str();
  cmd->callback([f, seq_len] {
    if (seq_len->count() > 0 && f->seq_len < 1)
      user_error("--seq-len {} must be at least 1", f->seq_len);
    if (f->max_windows < 0) user_error("--max-windows {} must be 0 (all) or more", f->max_windows);
    if (f->batch < 1) user_error("--batch {} must be at least 1", f->batch);
    const train::LoadedModel model = train::load_model(f->checkpoint);
    const int T = seq_len->count() > 0 ? f->seq_len : model.config.seq_len;
    std::shared_ptr<const std::vector<uint8_t>> tokens;
    std::string what;
    if (f->data.empty()) {
      const train::Corpus c = train::synthetic_corpus();
      tokens = c.validation.tokens;
      what = "the synthetic corpus's validation split";
    } else {
      // All of the file is scored: a split with no validation part.
      const train::Corpus c = train::load_text_corpus(f->data, 0.0);
      tokens = c.train.tokens;
      what = fmt::format("'{}'", f->data);
    }
    const auto [loss, scored] =
        train::evaluate_windows(model.params, *tokens, T, f->batch, f->max_windows);
    fmt::print(
        "loss {:.4f} (perplexity {:.3f}, {:.3f} bits/byte) over {} tokens of {}, "
        "checkpoint at step {}\n",
        loss, std::exp(loss), loss / std::log(2.0), scored, what, model.meta.step);
  });
}

}  // namespace tandem::cli
