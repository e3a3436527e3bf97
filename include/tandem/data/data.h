// Training data: byte-level corpora (a text file, or a built-in synthetic corpus a small GPT
// learns in a minute) or folders of token shards (data/token_corpus.h), split into training and
// validation parts, and a batch sampler that is a
// pure function of (seed, step, row): resuming at step k draws exactly the batches an
// uninterrupted run would, and every data-parallel rank draws its own rows of the same global
// batch without talking to the others.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::data {

inline constexpr int kByteVocab = 256;
inline constexpr double kDefaultValidationFraction = 0.1;

// A run of tokens in memory: a byte vector's, or one memory-mapped shard's payload.
struct TokenSpan {
  const void* data = nullptr;
  uint64_t count = 0;
  int width = 1;     // bytes per token: 1 (bytes), 2 or 4 (shards)
  std::string name;  // errors name it: "token shard 'data/train-000001.bin'"
  // A shard's: the first byte of the read-only file mapping that holds `data` (the file's offset
  // 0), whose pages TokenSplit::release drops. Null for memory the process owns (bytes, ids).
  const void* mapping = nullptr;
};

// One part of a corpus: its tokens, the concatenation of its spans in order, and the words errors
// use for it. Byte vectors and mapped shards look the same to the sampler through it.
struct TokenSplit {
  std::string source;          // "data file 'notes.txt'", "the synthetic corpus"
  std::string name;            // "training split (the first 90%)"
  std::string unit = "bytes";  // what a token is called in messages: "bytes" or "tokens"
  int vocab_size = kByteVocab;
  std::vector<TokenSpan> spans;
  std::vector<uint64_t> ends;          // ends[i]: tokens in spans 0..i
  std::shared_ptr<const void> memory;  // keeps the spans' memory alive (a vector, mapped shards)

  // A split over bytes already in memory.
  static TokenSplit of_bytes(std::string source, std::string name,
                             std::shared_ptr<const std::vector<uint8_t>> bytes);
  // A split over `spans`, kept alive by `memory`; ids at or past `vocab_size` are refused when
  // read, naming the span.
  static TokenSplit of_spans(std::string source, std::string name, std::vector<TokenSpan> spans,
                             std::shared_ptr<const void> memory, int vocab_size);

  size_t size() const { return ends.empty() ? 0 : static_cast<size_t>(ends.back()); }
  // Tokens [offset, offset + n) into `out`, across spans.
  void read(uint64_t offset, uint64_t n, int32_t* out) const;
  // Drops from this process's mappings the pages of mapped spans around tokens [offset,
  // offset + n), once they are read: a fault maps a whole page-cache folio (up to 2 MiB), so the
  // 2 MiB-aligned blocks of the file that hold the tokens go. The page cache keeps the data and a
  // later read maps it again, so a run's resident set does not grow with the corpus it reads.
  // Spans in the process's own memory are left alone.
  void release(uint64_t offset, uint64_t n) const;
  // All tokens of a byte split (tests, entropy).
  std::vector<uint8_t> bytes() const;
};

// A corpus: byte-level (token = byte, vocabulary 256; the first (1 - f) of the bytes for
// training, the last f for validation), or token shards written by `tandem tokenize`.
struct Corpus {
  std::string source;  // the file path, the shard folder, or "synthetic"
  int vocab_size = kByteVocab;
  uint64_t fingerprint = 0;  // a resumed run can tell the data changed: FNV-1a of all bytes, or
                             // the first 64 bits of the SHA-256 of a shard folder's shards.json
  TokenSplit train;
  TokenSplit validation;
  // Shard folders: the tokenizer's file (.model or .json) and its SHA-256, and the bytes of text
  // the validation tokens came from (bits per byte). Empty / 0 for byte corpora.
  std::string tokenizer_path;
  std::string tokenizer_sha256;
  uint64_t validation_text_bytes = 0;

  std::string fingerprint_hex() const;  // 16 hex digits
};

// Reads a text file. Missing, unreadable or empty files are UserErrors naming the file;
// `validation_fraction` must lie in [0, 1).
Corpus load_text_corpus(const std::string& path,
                        double validation_fraction = kDefaultValidationFraction);

// Splits bytes already in memory; `source` names them ("synthetic", a path).
Corpus make_corpus(std::string bytes, const std::string& source,
                   double validation_fraction = kDefaultValidationFraction);

inline constexpr uint64_t kSyntheticSeed = 20240601;
inline constexpr size_t kSyntheticBytes = size_t{1} << 20;

// `bytes` bytes of English-like text from a small grammar (subject-verb agreement, adjectives,
// relative clauses, sums of small numbers), drawn from counter-based random numbers under
// `seed`: the same arguments give the same text on every machine. Most of a byte's uncertainty
// goes once a model knows the word it is in, so the loss of a small GPT falls well below the
// unigram entropy within a few hundred steps.
std::string synthetic_text(size_t bytes = kSyntheticBytes, uint64_t seed = kSyntheticSeed);
Corpus synthetic_corpus(size_t bytes = kSyntheticBytes, uint64_t seed = kSyntheticSeed,
                        double validation_fraction = kDefaultValidationFraction);

// The entropy of the byte distribution, in nats: the loss of the best model that ignores
// context, and so the level a model that has learnt anything beats.
double unigram_entropy(const std::vector<uint8_t>& tokens);

// Rows of token windows: inputs[r * seq_len + t] predicts targets[r * seq_len + t], which is the
// token after it in the corpus. Row-major (rows, seq_len).
struct Batch {
  int64_t rows = 0;
  int64_t seq_len = 0;
  std::vector<int32_t> inputs;
  std::vector<int32_t> targets;
};

// Draws global batches of `batch` rows of `seq_len` tokens from a split. Row i of step s starts
// at an offset drawn from Philox under (seed, s, i): independent of the batch size, of the rank
// count and of every earlier draw.
class BatchSampler {
 public:
  // A split shorter than seq_len + 1 tokens is a UserError naming the source and the split.
  BatchSampler(TokenSplit split, int64_t batch, int64_t seq_len, uint64_t seed);

  // Rows [row_begin, row_end) of the global batch of `step`, copied out of the split, whose
  // mapped pages they came from are then released (TokenSplit::release).
  Batch rows(int64_t step, int64_t row_begin, int64_t row_end) const;
  // The whole global batch of `step`.
  Batch global(int64_t step) const { return rows(step, 0, batch_); }
  // Data-parallel rank `rank` of `ranks`: rows [rank * B / ranks, (rank + 1) * B / ranks). The
  // global batch must divide evenly, so every rank's gradient weighs the same.
  Batch rank_share(int64_t step, int rank, int ranks) const;
  // Where row `row` of `step` starts in the split.
  int64_t row_offset(int64_t step, int64_t row) const;

  int64_t batch() const { return batch_; }
  int64_t seq_len() const { return seq_len_; }
  uint64_t seed() const { return seed_; }
  const TokenSplit& split() const { return split_; }

 private:
  TokenSplit split_;
  int64_t batch_, seq_len_;
  uint64_t seed_;
};

// Consecutive, non-overlapping windows over a whole split, for evaluation (`tandem eval`): window
// w holds tokens [w * seq_len, (w + 1) * seq_len] (its targets reach one token further). A batch
// releases the mapped pages it read, as BatchSampler::rows does.
int64_t window_count(const TokenSplit& split, int64_t seq_len);
Batch window_batch(const TokenSplit& split, int64_t seq_len, int64_t first_window, int64_t rows);

}  // namespace tandem::data
