// `tandem tokenize`: encodes text files into a folder of token shards for `tandem train --data`
// (flags into a TokenizeConfig; the work is data/tokenize).
#include "tandem/data/tokenize.h"

#include <memory>

#include "commands.h"
#include "tandem/core/error.h"

namespace tandem::cli {

void add_tokenize(CLI::App& app) {
  auto c = std::make_shared<data::TokenizeConfig>();
  auto quiet = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand(
      "tokenize",
      "Encode text files into token shards (a BPE tokenizer trained with SentencePiece, or one "
      "given) for tandem train --data DIR");
  cmd->add_option("inputs", c->inputs, "Text files and folders (searched recursively, sorted)")
      ->required();
  cmd->add_option("--out", c->output_dir, "Folder to write the shards to (new or empty)")
      ->required();
  cmd->add_option("--tokenizer", c->tokenizer,
                  "Encode with this tokenizer instead of training one: a SentencePiece .model or "
                  "a Hugging Face GPT-2, Llama 3 or Llama 2 tokenizer.json");
  cmd->add_option("--vocab-size", c->vocab_size, "Tokens in the trained tokenizer's vocabulary")
      ->capture_default_str();
  cmd->add_option("--val-fraction", c->validation_fraction,
                  "Fraction of the text (from its end, cut at a line start) held out for "
                  "validation")
      ->capture_default_str();
  cmd->add_option("--shard-tokens", c->shard_tokens, "Tokens per shard file")
      ->capture_default_str();
  cmd->add_option("--threads", c->threads, "Encoding threads (0: every core)")
      ->capture_default_str();
  cmd->add_flag("--quiet", *quiet, "Only the summary, no progress lines");
  cmd->callback([c, quiet, cmd] {
    if (cmd->get_option("--tokenizer")->count() > 0 && cmd->get_option("--vocab-size")->count() > 0)
      user_error("--vocab-size applies to a trained tokenizer; --tokenizer gives one");
    c->progress = !*quiet;
    if (const int sig = data::tokenize(*c).stopped_by) throw StoppedBySignal{sig};
  });
}

}  // namespace tandem::cli
