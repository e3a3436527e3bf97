// `tandem export`: a checkpoint's weights written in another framework's layout; `--format hf` is
// a Hugging Face folder, GPT-2's or Llama's by the checkpoint's model (the work is
// train/hf_folder).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <memory>
#include <string>

#include "commands.h"
#include "tandem/core/error.h"
#include "tandem/train/hf_folder.h"

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
      "Write a checkpoint's weights as a Hugging Face folder (model.safetensors, config.json and "
      "the tokenizer): GPT2LMHeadModel's for a GPT-2 model, LlamaForCausalLM's for a Llama one "
      "(Qwen2ForCausalLM's with --qkv-bias)");
  cmd->add_option("checkpoint,--checkpoint", f->checkpoint,
                  "Checkpoint folder, or a --save folder (its newest checkpoint)")
      ->required();
  cmd->add_option("--format", f->format, "The layout to write: hf (a Hugging Face folder)")
      ->required();
  cmd->add_option("--out", f->out,
                  "Folder to write (new, or a previous export: replaced whole and atomically)")
      ->required();
  cmd->add_option("--tokenizer", f->tokenizer,
                  "The tokenizer file to copy, when the one the checkpoint recorded has moved "
                  "(checked against its recorded SHA-256)");
  cmd->callback([f] {
    if (f->format != "hf")
      user_error("--format {}: the formats are hf (a Hugging Face folder)", f->format);
    const train::HfExport e = train::export_hf(f->checkpoint, f->out, f->tokenizer);
    fmt::print(
        "tandem export: the step-{} weights of {} ({} layers x d_model {}, vocabulary {}) written "
        "to {} as {}\n",
        e.step, e.checkpoint, e.config.n_layers, e.config.d_model, e.config.vocab_size, f->out,
        fmt::join(e.files, ", "));
  });
}

}  // namespace tandem::cli
