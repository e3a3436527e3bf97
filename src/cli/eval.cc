// `tandem eval`: the mean loss of a checkpoint's model on a text file, a shard folder's validation
// split, or the synthetic corpus's validation split, over consecutive windows of its training
// sequence length: loss per token, perplexity and bits per byte (comparable across tokenizers).
#include <fmt/format.h>

#include <cmath>
#include <memory>

#include "choices.h"
#include "commands.h"
#include "tandem/core/error.h"
#include "tandem/data/data.h"
#include "tandem/data/token_corpus.h"
#include "tandem/train/trainer.h"

namespace tandem::cli {
namespace {

struct EvalFlags {
  std::string checkpoint;
  std::string data;
  std::string tokenizer;
  int batch = 8;
  int seq_len = 0;
  int64_t max_windows = 0;
  DType precision = DType::F32;
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
      "Text file to score, all of it, or a folder of token shards (its validation split); "
      "default: the synthetic corpus's validation split");
  cmd->add_option(
      "--tokenizer", f->tokenizer,
      "SentencePiece .model or tokenizer.json (GPT-2's, Llama 3's, Llama 2's) that encodes a "
      "text file for a subword model (default: the one the checkpoint's data "
      "recorded)");
  cmd->add_option("--batch", f->batch, "Windows per forward pass")->capture_default_str();
  auto* seq_len = cmd->add_option("--seq-len", f->seq_len,
                                  "Window length (default: the model's training length)");
  cmd->add_option("--max-windows", f->max_windows, "Score at most this many windows (0: all)")
      ->capture_default_str();
  add_precision_flag(cmd, f->precision);
  cmd->callback([f, seq_len] {
    if (seq_len->count() > 0 && f->seq_len < 1)
      user_error("--seq-len {} must be at least 1", f->seq_len);
    if (f->max_windows < 0) user_error("--max-windows {} must be 0 (all) or more", f->max_windows);
    if (f->batch < 1) user_error("--batch {} must be at least 1", f->batch);
    const train::LoadedModel model = train::load_model(f->checkpoint, f->precision);
    const int T = seq_len->count() > 0 ? f->seq_len : model.config.seq_len;
    data::TokenSplit split;
    std::string what;
    double text_bytes = 0;  // the bytes of text the scored tokens came from
    if (f->data.empty()) {
      split = data::synthetic_corpus().validation;
      what = "the synthetic corpus's validation split";
      text_bytes = static_cast<double>(split.size());
    } else if (data::is_shard_folder(f->data)) {
      const data::Corpus c = data::load_shard_corpus(f->data);
      split = c.validation;
      what = fmt::format("the validation split of '{}'", f->data);
      text_bytes = static_cast<double>(c.validation_text_bytes);
    } else {
      // All of the file is scored: a split with no validation part.
      const data::Corpus c = data::load_text_corpus(f->data, 0.0);
      split = c.train;
      what = fmt::format("'{}'", f->data);
      text_bytes = static_cast<double>(split.size());
      if (const auto tok = train::model_tokenizer(model, f->tokenizer, f->checkpoint)) {
        const std::vector<uint8_t> bytes = split.bytes();
        auto ids = std::make_shared<std::vector<int32_t>>(tok->encode(
            std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size())));
        split = data::TokenSplit::of_spans(what, "all of it", {{ids->data(), ids->size(), 4, what}},
                                           ids, tok->vocab_size());
      }
    }
    const auto [loss, scored] =
        train::evaluate_windows(model.params, split, T, f->batch, f->max_windows);
    // Bits per byte: the scored tokens' bits over the bytes of text they stand for (the split's
    // mean bytes per token when only some windows are scored).
    const double bytes_per_token =
        split.size() > 0 ? text_bytes / static_cast<double>(split.size()) : 1.0;
    fmt::print(
        "loss {:.6f} per token (perplexity {:.3f}, {:.3f} bits/byte) over {} tokens of {}, "
        "checkpoint at step {}, {} matmuls\n",
        loss, std::exp(loss), train::bits_per_byte(loss, bytes_per_token), scored, what,
        model.meta.step, f->precision == DType::BF16 ? "bf16" : "fp32");
  });
}

}  // namespace tandem::cli
