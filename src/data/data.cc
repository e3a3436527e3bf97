// Byte-level corpora, the synthetic grammar, and the counter-based batch sampler.
#include "tandem/data/data.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>

#include "tandem/core/error.h"
#include "tandem/core/mapped_read.h"
#include "tandem/core/rng.h"
#include "tandem/io/atomic_file.h"

namespace tandem::data {
namespace {

// Keys the sampler's Philox draws apart from every other user of the same seed (dropout draws
// under the seed itself), so a run's data order and its dropout masks are unrelated.
constexpr uint64_t kSamplerKey = 0x64617461'73616d70ull;  // "datasamp"
constexpr uint32_t kSyntheticStream = 0x67726d72u;        // "grmr"

// What TokenSplit::release drops around the tokens read, in the file's offsets: a read fault maps
// the whole page-cache folio it hits (up to the PMD size, 2 MiB on x86-64 and 4 kB-page arm64),
// and its fault-around neighbours (64 kB), all inside the naturally aligned 2 MiB holding it.
constexpr uint64_t kReleaseBlock = uint64_t{2} << 20;

uint64_t fnv1a(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string percent(double f) { return fmt::format("{:.3g}%", f * 100.0); }

// A stream of random choices for the grammar: draw i is Philox element i under the seed.
class Chooser {
 public:
  explicit Chooser(uint64_t seed) : seed_(seed) {}
  uint32_t below(uint32_t n) { return random_bits(seed_, next_++, kSyntheticStream) % n; }
  bool chance(uint32_t percent) { return below(100) < percent; }
  template <size_t N>
  const char* pick(const std::array<const char*, N>& words) {
    return words[below(static_cast<uint32_t>(N))];
  }

 private:
  uint64_t seed_;
  uint64_t next_ = 0;
};

struct Noun {
  const char* one;
  const char* many;
};
constexpr std::array<Noun, 8> kNouns = {{{"cat", "cats"},
                                         {"dog", "dogs"},
                                         {"bird", "birds"},
                                         {"fox", "foxes"},
                                         {"child", "children"},
                                         {"teacher", "teachers"},
                                         {"robot", "robots"},
                                         {"owl", "owls"}}};
struct Verb {
  const char* one;   // agrees with a singular subject
  const char* many;  // agrees with a plural one
};
constexpr std::array<Verb, 8> kVerbs = {{{"sees", "see"},
                                         {"chases", "chase"},
                                         {"follows", "follow"},
                                         {"likes", "like"},
                                         {"helps", "help"},
                                         {"watches", "watch"},
                                         {"finds", "find"},
                                         {"knows", "know"}}};
constexpr std::array<const char*, 8> kAdjectives = {"small", "old",   "red",    "quick",
                                                    "happy", "quiet", "clever", "brown"};
constexpr std::array<const char*, 6> kAdverbs = {"today",         "again",         "at night",
                                                 "in the garden", "every morning", "slowly"};
constexpr std::array<const char*, 4> kPluralDeterminers = {"the", "two", "some", "many"};

bool starts_with_vowel(const char* w) {
  return w[0] == 'a' || w[0] == 'e' || w[0] == 'i' || w[0] == 'o' || w[0] == 'u';
}

// A noun phrase: determiner, maybe an adjective, the noun ("an old owl", "two red foxes"), and
// sometimes a relative clause whose verb agrees with this noun.
void noun_phrase(Chooser& c, std::string& out, bool plural, int depth) {
  const Noun& noun = kNouns[c.below(kNouns.size())];
  const char* adjective = c.chance(40) ? c.pick(kAdjectives) : nullptr;
  const char* first = adjective ? adjective : noun.one;
  if (plural) {
    out += c.pick(kPluralDeterminers);
  } else {
    out += c.chance(50) ? "the" : (starts_with_vowel(first) ? "an" : "a");
  }
  out += ' ';
  if (adjective) {
    out += adjective;
    out += ' ';
  }
  out += plural ? noun.many : noun.one;
  if (depth == 0 && c.chance(15)) {
    const Verb& v = kVerbs[c.below(kVerbs.size())];
    out += " that ";
    out += plural ? v.many : v.one;
    out += ' ';
    noun_phrase(c, out, c.chance(30), depth + 1);
  }
}

void capitalise_from(std::string& out, size_t at) {
  if (at < out.size() && out[at] >= 'a' && out[at] <= 'z')
    out[at] = static_cast<char>(out[at] - 32);
}

// One sentence: a statement, a question, or a sum.
void sentence(Chooser& c, std::string& out) {
  const size_t start = out.size();
  const uint32_t kind = c.below(100);
  if (kind < 20) {
    const uint32_t a = c.below(10), b = c.below(10);
    out += fmt::format("{} plus {} is {}.", a, b, a + b);
    return;
  }
  const bool plural = c.chance(35);
  const Verb& v = kVerbs[c.below(kVerbs.size())];
  if (kind < 32) {
    out += plural ? "do " : "does ";
    noun_phrase(c, out, plural, 0);
    out += ' ';
    out += v.many;  // after do/does the verb takes its bare form
    out += ' ';
    noun_phrase(c, out, c.chance(30), 1);
    out += '?';
  } else {
    noun_phrase(c, out, plural, 0);
    out += ' ';
    out += plural ? v.many : v.one;
    out += ' ';
    noun_phrase(c, out, c.chance(30), 1);
    if (c.chance(30)) {
      out += ' ';
      out += c.pick(kAdverbs);
    }
    out += '.';
  }
  capitalise_from(out, start);
}

// Calls fn(span, at, take) for each part of tokens [offset, offset + n) of `s`, in order: `take`
// tokens from token `at` of `span`.
template <typename Fn>
void for_each_part(const TokenSplit& s, uint64_t offset, uint64_t n, Fn&& fn) {
  TANDEM_CHECK(offset + n <= s.size(), "tokens [{}, {}) of {}", offset, offset + n, s.size());
  // The span holding `offset`: the first whose end lies past it.
  size_t i =
      static_cast<size_t>(std::upper_bound(s.ends.begin(), s.ends.end(), offset) - s.ends.begin());
  while (n > 0) {
    const TokenSpan& span = s.spans[i];
    const uint64_t begin = i == 0 ? 0 : s.ends[i - 1];
    const uint64_t at = offset - begin, take = std::min(n, span.count - at);
    fn(span, at, take);
    offset += take;
    n -= take;
    ++i;
  }
}

}  // namespace

TokenSplit TokenSplit::of_bytes(std::string source, std::string name,
                                std::shared_ptr<const std::vector<uint8_t>> bytes) {
  std::vector<TokenSpan> spans{{bytes->data(), bytes->size(), 1, source}};
  return of_spans(std::move(source), std::move(name), std::move(spans), std::move(bytes),
                  kByteVocab);
}

TokenSplit TokenSplit::of_spans(std::string source, std::string name, std::vector<TokenSpan> spans,
                                std::shared_ptr<const void> memory, int vocab_size) {
  TokenSplit s;
  s.source = std::move(source);
  s.name = std::move(name);
  s.vocab_size = vocab_size;
  uint64_t total = 0;
  for (TokenSpan& span : spans) {
    TANDEM_CHECK(span.width == 1 || span.width == 2 || span.width == 4, "width {}", span.width);
    if (span.width != 1) s.unit = "tokens";
    if (span.count == 0) continue;  // an empty shard: nothing to find there
    total += span.count;
    s.ends.push_back(total);
    s.spans.push_back(std::move(span));
  }
  s.memory = std::move(memory);
  return s;
}

namespace {

// Tokens [at, at + take) of a span copied to out as int32; bad: one is at or past vocab.
struct TokenCopy {
  const TokenSpan* span;
  uint64_t at, take;
  int32_t* out;
  int vocab;
  bool bad = false;
};

void copy_tokens(void* context) {
  TokenCopy& c = *static_cast<TokenCopy*>(context);
  if (c.span->width == 1) {
    const auto* p = static_cast<const uint8_t*>(c.span->data) + c.at;
    for (uint64_t k = 0; k < c.take; ++k) c.out[k] = p[k];
  } else if (c.span->width == 2) {
    const auto* p = static_cast<const uint16_t*>(c.span->data) + c.at;
    for (uint64_t k = 0; k < c.take; ++k) {
      c.out[k] = p[k];
      c.bad |= c.out[k] >= c.vocab;
    }
  } else {
    const auto* p = static_cast<const uint32_t*>(c.span->data) + c.at;
    for (uint64_t k = 0; k < c.take; ++k) {
      c.bad |= p[k] >= static_cast<uint32_t>(c.vocab);
      c.out[k] = static_cast<int32_t>(p[k]);
    }
  }
}

}  // namespace

void TokenSplit::read(uint64_t offset, uint64_t n, int32_t* out) const {
  for_each_part(*this, offset, n, [&](const TokenSpan& span, uint64_t at, uint64_t take) {
    TokenCopy copy{&span, at, take, out, vocab_size};
    const uint64_t w = static_cast<uint64_t>(span.width);
    // A shard's mapping: a file truncated since it was opened raises SIGBUS where its pages
    // went, which ends the read with one error naming it instead of killing the run.
    if (span.mapping == nullptr)
      copy_tokens(&copy);
    else if (!guarded_mapped_read(static_cast<const char*>(span.data) + at * w, take * w,
                                  copy_tokens, &copy))
      user_error(
          "{} changed while this run read it: tokens {} to {} of its {} are no longer in the "
          "file (was it truncated or rewritten?)",
          span.name, at, at + take - 1, span.count);
    const bool bad = copy.bad;
    if (bad)
      for (uint64_t k = 0; k < take; ++k)
        if (out[k] < 0 || out[k] >= vocab_size)
          user_error("{} holds token id {} at token {}, at or past the vocabulary of {} tokens",
                     span.name, static_cast<uint32_t>(out[k]), at + k, vocab_size);
    out += take;
  });
}

void TokenSplit::release(uint64_t offset, uint64_t n) const {
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  for_each_part(*this, offset, n, [&](const TokenSpan& span, uint64_t at, uint64_t take) {
    if (span.mapping == nullptr) return;  // the process's own memory: DONTNEED would zero it
    const auto* base = static_cast<const char*>(span.mapping);
    const auto first = static_cast<uint64_t>(static_cast<const char*>(span.data) - base);
    const uint64_t w = static_cast<uint64_t>(span.width);
    // File offsets: the blocks holding the tokens, within the mapping's pages (whatever lies
    // past them is another mapping or the process's memory).
    const uint64_t lo = (first + at * w) / kReleaseBlock * kReleaseBlock;
    const uint64_t end = (first + span.count * w + page - 1) / page * page;
    const uint64_t hi = std::min(
        end, (first + (at + take) * w + kReleaseBlock - 1) / kReleaseBlock * kReleaseBlock);
    // EINVAL (a locked mapping) only keeps the pages mapped; ENOMEM would be a range outside it.
    const int rc = ::madvise(const_cast<char*>(base + lo), hi - lo, MADV_DONTNEED);
    TANDEM_CHECK(rc == 0 || errno != ENOMEM, "releasing bytes [{}, {}) of {}", lo, hi, span.name);
  });
}

std::vector<uint8_t> TokenSplit::bytes() const {
  std::vector<uint8_t> out;
  out.reserve(size());
  for (const TokenSpan& span : spans) {
    TANDEM_CHECK(span.width == 1, "{} holds {}-byte tokens, not bytes", span.name, span.width);
    const auto* p = static_cast<const uint8_t*>(span.data);
    out.insert(out.end(), p, p + span.count);
  }
  return out;
}

std::string Corpus::fingerprint_hex() const { return fmt::format("{:016x}", fingerprint); }

Corpus make_corpus(std::string bytes, const std::string& source, double validation_fraction) {
  if (!(validation_fraction >= 0.0 && validation_fraction < 1.0))
    user_error("validation fraction {} is outside [0, 1)", validation_fraction);
  Corpus c;
  c.source = source;
  c.fingerprint = fnv1a(bytes);
  const size_t n = bytes.size();
  const size_t n_val =
      static_cast<size_t>(std::floor(static_cast<double>(n) * validation_fraction));
  const std::string described = source == "synthetic" ? std::string("the synthetic corpus")
                                                      : fmt::format("data file '{}'", source);
  c.train = TokenSplit::of_bytes(
      described, fmt::format("training split (the first {})", percent(1.0 - validation_fraction)),
      std::make_shared<const std::vector<uint8_t>>(
          bytes.begin(), bytes.end() - static_cast<std::ptrdiff_t>(n_val)));
  c.validation = TokenSplit::of_bytes(
      described, fmt::format("validation split (the last {})", percent(validation_fraction)),
      std::make_shared<const std::vector<uint8_t>>(bytes.end() - static_cast<std::ptrdiff_t>(n_val),
                                                   bytes.end()));
  return c;
}

Corpus load_text_corpus(const std::string& path, double validation_fraction) {
  std::string bytes = io::read_file(path, "data file");
  if (bytes.empty()) user_error("data file '{}' is empty", path);
  return make_corpus(std::move(bytes), path, validation_fraction);
}

std::string synthetic_text(size_t bytes, uint64_t seed) {
  Chooser c(seed);
  std::string out;
  out.reserve(bytes + 256);
  while (out.size() < bytes) {
    // Paragraphs of 3 to 6 sentences, one per line.
    const uint32_t sentences = 3 + c.below(4);
    for (uint32_t i = 0; i < sentences; ++i) {
      if (i > 0) out += ' ';
      sentence(c, out);
    }
    out += '\n';
  }
  out.resize(bytes);
  return out;
}

Corpus synthetic_corpus(size_t bytes, uint64_t seed, double validation_fraction) {
  return make_corpus(synthetic_text(bytes, seed), "synthetic", validation_fraction);
}

double unigram_entropy(const std::vector<uint8_t>& tokens) {
  if (tokens.empty()) return 0.0;
  std::array<uint64_t, 256> counts{};
  for (uint8_t t : tokens) ++counts[t];
  double h = 0.0;
  const double n = static_cast<double>(tokens.size());
  for (uint64_t k : counts)
    if (k > 0) h -= (static_cast<double>(k) / n) * std::log(static_cast<double>(k) / n);
  return h;
}

BatchSampler::BatchSampler(TokenSplit split, int64_t batch, int64_t seq_len, uint64_t seed)
    : split_(std::move(split)), batch_(batch), seq_len_(seq_len), seed_(seed) {
  if (batch < 1) user_error("batch size must be at least 1 (got {})", batch);
  if (seq_len < 1) user_error("sequence length must be at least 1 (got {})", seq_len);
  if (split_.size() < static_cast<size_t>(seq_len) + 1)
    user_error(
        "{} is too short for sequence length {}: its {} has {} {}, and one sequence "
        "needs {}",
        split_.source, seq_len, split_.name, split_.size(), split_.unit, seq_len + 1);
}

int64_t BatchSampler::row_offset(int64_t step, int64_t row) const {
  TANDEM_CHECK(step >= 0 && row >= 0, "step {} row {}", step, row);
  const uint64_t s = static_cast<uint64_t>(step), r = static_cast<uint64_t>(row);
  const auto bits =
      philox4x32(seed_ ^ kSamplerKey, {static_cast<uint32_t>(s), static_cast<uint32_t>(s >> 32),
                                       static_cast<uint32_t>(r), static_cast<uint32_t>(r >> 32)});
  const uint64_t x = (uint64_t{bits[1]} << 32) | bits[0];
  // Window starts 0 .. n - seq_len - 1: the target of the last input is still inside the split.
  // With 64 random bits the modulo's bias is below 2^-40 for any corpus that fits in memory.
  const uint64_t starts = split_.size() - static_cast<uint64_t>(seq_len_);
  return static_cast<int64_t>(x % starts);
}

Batch BatchSampler::rows(int64_t step, int64_t row_begin, int64_t row_end) const {
  TANDEM_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= batch_,
               "rows [{}, {}) of a batch of {}", row_begin, row_end, batch_);
  Batch b;
  b.rows = row_end - row_begin;
  b.seq_len = seq_len_;
  b.inputs.resize(static_cast<size_t>(b.rows * seq_len_));
  b.targets.resize(b.inputs.size());
  std::vector<int32_t> window(static_cast<size_t>(seq_len_) + 1);
  std::vector<uint64_t> offsets(static_cast<size_t>(b.rows));
  for (int64_t r = 0; r < b.rows; ++r) {
    offsets[static_cast<size_t>(r)] = static_cast<uint64_t>(row_offset(step, row_begin + r));
    split_.read(offsets[static_cast<size_t>(r)], window.size(), window.data());
    int32_t* in = b.inputs.data() + r * seq_len_;
    int32_t* tg = b.targets.data() + r * seq_len_;
    for (int64_t t = 0; t < seq_len_; ++t) {
      in[t] = window[static_cast<size_t>(t)];
      tg[t] = window[static_cast<size_t>(t) + 1];
    }
  }
  for (uint64_t offset : offsets) split_.release(offset, window.size());
  return b;
}

Batch BatchSampler::rank_share(int64_t step, int rank, int ranks) const {
  TANDEM_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "rank {} of {}", rank, ranks);
  if (batch_ % ranks != 0)
    user_error(
        "a global batch of {} rows does not split evenly over {} data-parallel ranks; "
        "choose a batch size divisible by {}",
        batch_, ranks, ranks);
  const int64_t share = batch_ / ranks;
  return rows(step, rank * share, (rank + 1) * share);
}

int64_t window_count(const TokenSplit& split, int64_t seq_len) {
  TANDEM_CHECK(seq_len >= 1, "seq_len {}", seq_len);
  return split.size() == 0
             ? 0
             : static_cast<int64_t>((split.size() - 1) / static_cast<size_t>(seq_len));
}

Batch window_batch(const TokenSplit& split, int64_t seq_len, int64_t first_window, int64_t rows) {
  const int64_t count = window_count(split, seq_len);
  if (count == 0)
    user_error(
        "{} is too short for sequence length {}: its {} has {} {}, and one sequence "
        "needs {}",
        split.source, seq_len, split.name, split.size(), split.unit, seq_len + 1);
  TANDEM_CHECK(first_window >= 0 && rows >= 0 && first_window + rows <= count,
               "windows [{}, {}) of {}", first_window, first_window + rows, count);
  Batch b;
  b.rows = rows;
  b.seq_len = seq_len;
  b.inputs.resize(static_cast<size_t>(rows * seq_len));
  b.targets.resize(b.inputs.size());
  std::vector<int32_t> window(static_cast<size_t>(seq_len) + 1);
  for (int64_t r = 0; r < rows; ++r) {
    split.read(static_cast<uint64_t>((first_window + r) * seq_len), window.size(), window.data());
    for (int64_t t = 0; t < seq_len; ++t) {
      b.inputs[static_cast<size_t>(r * seq_len + t)] = window[static_cast<size_t>(t)];
      b.targets[static_cast<size_t>(r * seq_len + t)] = window[static_cast<size_t>(t) + 1];
    }
  }
  if (rows > 0)
    split.release(static_cast<uint64_t>(first_window * seq_len),
                  static_cast<uint64_t>(rows * seq_len) + 1);
  return b;
}

}  // namespace tandem::data
