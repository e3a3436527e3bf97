// Helpers of the token-shard tests: a small corpus the tests write themselves (the synthetic
// grammar's text plus a line of non-ASCII characters, over three files) and its shard folder.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "support/files.h"
#include "support/scratch.h"
#include "tandem/data/tokenize.h"

namespace tandem::train::testing {

using tandem::testing::ScratchDir;
using tandem::testing::write_bytes;

// Three text files under dir/corpus (one in a subfolder); returns their text in the order
// tokenize reads them (sorted paths).
inline std::string write_corpus(const ScratchDir& dir) {
  const std::string text = data::synthetic_text(24000, 11);
  const std::vector<std::string> parts = {
      text.substr(0, 9000) + "Ünïcödé: 日本語, naïve café — €5.\n", text.substr(9000, 8000),
      text.substr(17000)};
  std::filesystem::create_directories(dir.path("corpus/sub"));
  write_bytes(dir.path("corpus/a.txt"), parts[0]);
  write_bytes(dir.path("corpus/b.txt"), parts[1]);
  write_bytes(dir.path("corpus/sub/c.txt"), parts[2]);
  return parts[0] + parts[1] + parts[2];
}

// A tokenize run on dir/corpus with a tiny vocabulary, printing nothing.
inline data::TokenizeConfig tiny_tokenize(const ScratchDir& dir, const std::string& out,
                                          int64_t shard_tokens = 2000, int threads = 2) {
  data::TokenizeConfig c;
  c.inputs = {dir.path("corpus")};
  c.output_dir = dir.path(out);
  c.vocab_size = 320;
  c.shard_tokens = shard_tokens;
  c.threads = threads;
  c.progress = false;
  static std::ostringstream sink;
  c.out = &sink;
  return c;
}

}  // namespace tandem::train::testing
