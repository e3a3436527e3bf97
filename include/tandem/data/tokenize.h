// `tandem tokenize`: text files (a file, a list, or folders searched recursively) encoded into a
// folder of token shards (data/token_corpus.h) with a SentencePiece BPE tokenizer trained on
// them or loaded from a .model file, or a Hugging Face GPT-2, Llama 3 or Llama 2 tokenizer.json.
// The last `validation_fraction` of the text (cut at a line start) becomes the validation shards.
// Encoding runs on every core, the output the same for any thread count; the folder appears whole
// at the end or not at all.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "tandem/data/data.h"

namespace tandem::data {

inline constexpr int kDefaultTokenizerVocab = 8192;
inline constexpr int64_t kDefaultShardTokens = 100'000'000;

struct TokenizeConfig {
  std::vector<std::string> inputs;  // text files and folders
  std::string output_dir;           // must not exist, or be empty
  std::string tokenizer;            // a SentencePiece .model or tokenizer.json; empty: train
  int vocab_size = kDefaultTokenizerVocab;
  double validation_fraction = kDefaultValidationFraction;
  int64_t shard_tokens = kDefaultShardTokens;
  int threads = 0;              // 0: every hardware thread
  std::ostream* out = nullptr;  // progress and summary (null: stdout)
  bool progress = true;
};

struct TokenizeSummary {
  int vocab_size = 0;
  uint64_t files = 0, text_bytes = 0;
  uint64_t train_tokens = 0, validation_tokens = 0;
  int train_shards = 0, validation_shards = 0;
  int stopped_by = 0;  // the signal (SIGTERM, SIGINT) that stopped it, writing nothing; or 0
};

// The sorted list of text files `inputs` names (folders searched recursively, hidden entries
// skipped). A missing input, an unreadable or binary file, or no text at all is a UserError
// naming it.
std::vector<std::string> corpus_files(const std::vector<std::string>& inputs);

TokenizeSummary tokenize(const TokenizeConfig& config);

}  // namespace tandem::data
