// `tandem export`: a checkpoint's weights written in another framework's layout; `--format hf` is
// a Hugging Face GPT-2 folder (the work is train/hf_gpt2).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <memory>
#include <string>

#include "commands.h"
#include "tandem/core/error.h"
#include "tandem/train/hf_gpt2.h"

namespace tandem::cli {
namespace {

struct ExportFlags {
  std::string checkpoint;
  std::string format;
  std::string out;
  std::string tokenizer;
};

}  // namespace

void add_export(CLI::App& app) {
  auto f = std::make_shared<ExportFlags>();
  auto* cmd = app.add_subcommand(
      "export",
      "Write a checkpoint's weights as a Hugging Face GPT-2 folder (GPT2LMHeadModel's "
      "model.safetensors, config.json and the tokenizer)");
  cmd->add_option("checkpoint,--checkpoint", f->checkpoint,
                  "Checkpoint folder, or a --save folder (its newest checkpoint)")
      ->required();
  cmd->add_option("--format", f->format, "The layout to write: hf (a Hugging Face GPT-2 folder)")
      ->required();
  cmd->add_option("--out", f->out,
                  "Folder to write (new, or a previous export: replaced whole and atomically)")
      ->required();
  cmd->add_option("--tokenizer", f->tokenizer,
                  "The tokenizer file to copy, when the one the checkpoint recorded has moved "
                  "(checked against its recorded SHA-256)");
  cmd->callback([f] {
    if (f->format != "hf")
      user_error("--format {}: the formats are hf (a Hugging Face GPT-2 folder)", f->format);
    const train::HfExport e = train::export_hf_gpt2(f->checkpoint, f->out, f->tokenizer);
    fmt::print(
        "tandem export: the step-{} weights of {} ({} layers x d_model {}, vocabulary {}) written "
        "to {} as {}\n",
        e.step, e.checkpoint, e.config.n_layers, e.config.d_model, e.config.vocab_size, f->out,
        fmt::join(e.files, ", "));
  });
}

}  // namespace tandem::cli
