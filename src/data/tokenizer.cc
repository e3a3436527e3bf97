// The tokenizers behind data::Tokenizer: SentencePiece (training through a sentence iterator
// over the corpus's lines, and the processor that encodes and decodes), or a Hugging Face
// tokenizer.json of GPT-2's or Llama 3's byte-level BPE or Llama 2's SentencePiece BPE (hf_bpe.h),
// chosen by the file's name.
#include "tandem/data/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string_view>
#include <unordered_map>

#include "hf_bpe.h"
#include "tandem/core/error.h"
#include "tandem/core/sha256.h"
#include "tandem/io/atomic_file.h"

namespace tandem::data {
namespace {

// SentencePiece skips longer lines when training; longer lines are fed in pieces this long.
constexpr size_t kMaxLineBytes = 8192;

// The lines of the training files in order, each long line cut into pieces at UTF-8 boundaries.
class Lines : public sentencepiece::SentenceIterator {
 public:
  explicit Lines(const std::vector<std::string>& files) : files_(files) { Next(); }
  bool done() const override { return done_; }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return {}; }
  void Next() override {
    for (;;) {
      if (!rest_.empty()) {
        size_t n = std::min(rest_.size(), kMaxLineBytes);
        while (n < rest_.size() && n > 0 && (static_cast<unsigned char>(rest_[n]) & 0xC0) == 0x80)
          --n;  // never split a character
        if (n == 0) n = std::min(rest_.size(), kMaxLineBytes);
        value_ = rest_.substr(0, n);
        rest_.erase(0, n);
        return;
      }
      if (in_.is_open() && std::getline(in_, rest_)) continue;  // cut above (empty: skipped)
      if (in_.is_open()) in_.close();
      if (next_file_ == files_.size()) {
        done_ = true;
        return;
      }
      in_.open(files_[next_file_++], std::ios::binary);
      if (!in_) user_error("cannot read text file '{}'", files_[next_file_ - 1]);
    }
  }

 private:
  const std::vector<std::string>& files_;
  size_t next_file_ = 0;
  std::ifstream in_;
  std::string rest_, value_;
  bool done_ = false;
};

// Protobuf's wire format, as much as reading a model's NormalizerSpec needs: a varint at p
// (advancing p), false past the end.
bool varint(const char*& p, const char* end, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64 && p < end; shift += 7) {
    const auto b = static_cast<uint8_t>(*p++);
    v |= uint64_t{b & 0x7fu} << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

// Calls fn(field, wire type, varint value, length-delimited bytes) for each field of a message;
// false when it is malformed.
template <typename Fn>
bool for_each_field(std::string_view message, Fn&& fn) {
  const char *p = message.data(), *end = p + message.size();
  while (p < end) {
    uint64_t key = 0, v = 0;
    if (!varint(p, end, key)) return false;
    std::string_view bytes;
    switch (key & 7) {
      case 0:
        if (!varint(p, end, v)) return false;
        break;
      case 1:
        if (end - p < 8) return false;
        p += 8;
        break;
      case 2:
        if (!varint(p, end, v) || v > static_cast<uint64_t>(end - p)) return false;
        bytes = {p, static_cast<size_t>(v)};
        p += v;
        break;
      case 5:
        if (end - p < 4) return false;
        p += 4;
        break;
      default:
        return false;
    }
    fn(static_cast<int>(key >> 3), static_cast<int>(key & 7), v, bytes);
  }
  return true;
}

// What a model's NormalizerSpec (ModelProto field 3; its name is field 1, add_dummy_prefix 3 and
// remove_extra_whitespaces 4, both true unless set) says; all false when it cannot be read.
struct Normalizer {
  bool read = false, identity = false, dummy_prefix = false, fold_whitespace = false;
};

Normalizer normalizer_of(std::string_view model) {
  std::string_view spec;
  bool found = false;
  if (!for_each_field(model, [&](int field, int wire, uint64_t, std::string_view bytes) {
        if (field == 3 && wire == 2) spec = bytes, found = true;
      }))
    return {};
  std::string_view name;
  bool dummy_prefix = true, fold_whitespace = true;
  if (!found || !for_each_field(spec, [&](int field, int wire, uint64_t v, std::string_view b) {
        if (field == 1 && wire == 2) name = b;
        if (field == 3 && wire == 0) dummy_prefix = v != 0;
        if (field == 4 && wire == 0) fold_whitespace = v != 0;
      }))
    return {};
  return {true, name == "identity", dummy_prefix, fold_whitespace};
}

// The model with add_dummy_prefix false, for text that continues a document: a second
// NormalizerSpec field appended, holding add_dummy_prefix = 0, which protobuf's parser merges into
// the first (a later scalar wins): tag 3 length-delimited (0x1A), 2 bytes, tag 3 varint (0x18), 0.
std::string without_dummy_prefix(const std::string& model) {
  return model + std::string("\x1A\x02\x18\x00", 4);
}

// Whether each line of a text encodes on its own (the first as given, the others without the
// dummy prefix) to the ids the whole text gets: true when no piece holds a newline (so no merge
// crosses one) and the normalizer leaves the text as it is but for the dummy prefix (identity, no
// folding of whitespace), as in the models tandem trains and in Llama 2's.
bool lines_encode_alone(const Normalizer& n, const sentencepiece::SentencePieceProcessor& sp) {
  if (!n.read || !n.identity || n.fold_whitespace) return false;
  for (int i = 0; i < sp.GetPieceSize(); ++i)
    if (sp.IdToPiece(i).find('\n') != std::string::npos) return false;
  return true;
}

// The digits that follow `prefix` in `text` from `from` on ("" when there are none).
std::string number_after(const std::string& text, std::string_view prefix, size_t from = 0) {
  const size_t at = text.find(prefix, from);
  if (at == std::string::npos) return "";
  const size_t begin = at + prefix.size();
  const size_t end = text.find_first_not_of("0123456789", begin);
  return text.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

// SentencePiece's trainer refuses more threads (a machine with more cores trains on this many).
constexpr int kMostTrainingThreads = 128;

// SentencePiece's refusals of a vocabulary size, in tandem's words.
[[noreturn]] void vocab_refused(const std::string& message, int vocab_size) {
  if (const std::string most = number_after(message, "Please set it to a value <= "); !most.empty())
    user_error(
        "--vocab-size {} is too large for this corpus: its text yields at most {} pieces; use "
        "a smaller vocabulary or more text",
        vocab_size, most);
  if (const size_t at = message.find("Vocabulary size is smaller than required_chars. ");
      at != std::string::npos)
    if (const std::string least = number_after(message, " vs ", at); !least.empty())
      user_error(
          "--vocab-size {} is too small for this corpus: its characters, the 256 byte tokens and "
          "the control tokens need at least {}",
          vocab_size, least);
  user_error("training the tokenizer failed: {}", message);
}

}  // namespace

struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
  // A model with add_dummy_prefix again without it, for text after a document's first line (null:
  // sp has none).
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_later;
  std::unique_ptr<detail::HfBpe> hf;  // set for a tokenizer.json; sp is used otherwise
  std::string bytes, sha, source;
  // SentencePiece's BPE slows down on long inputs (its merges are searched over the whole input):
  // where the ids are the same (lines_encode_alone), text is handed to it a line at a time.
  bool by_line = false;

  // Reads what encoding needs from the model in sp and bytes.
  void prepare() {
    const Normalizer n = normalizer_of(bytes);
    by_line = lines_encode_alone(n, sp);
    if (!n.dummy_prefix) return;
    sp_later = std::make_unique<sentencepiece::SentencePieceProcessor>();
    const auto st = sp_later->LoadFromSerializedProto(without_dummy_prefix(bytes));
    TANDEM_CHECK(st.ok(), "SentencePiece cannot load its model without the dummy prefix: {}",
                 st.message());
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::load(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->bytes = io::read_file(path, "tokenizer");
  if (path.ends_with(".json")) {
    impl->hf = std::make_unique<detail::HfBpe>(impl->bytes, path);
  } else if (const auto st = impl->sp.LoadFromSerializedProto(impl->bytes); !st.ok()) {
    user_error(
        "tokenizer '{}' is not a SentencePiece .model file ({}); a Hugging Face tokenizer's name "
        "ends in .json",
        path, st.message());
  } else {
    impl->prepare();
  }
  impl->sha = sha256_hex(impl->bytes);
  impl->source = path;
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::train(const std::vector<std::string>& files, int vocab_size, int threads) {
  // Checked here, not left to SentencePiece's own check lines: the 256 byte tokens and the
  // unknown, start and end tokens come first.
  constexpr int kLeastVocab = 256 + 3 + 1;
  if (vocab_size < kLeastVocab)
    user_error(
        "--vocab-size {} is too small: the 256 byte tokens and 3 control tokens come first, so a "
        "vocabulary holds at least {}",
        vocab_size, kLeastVocab);
  Lines lines(files);
  if (lines.done()) user_error("the corpus has no text to train a tokenizer on");
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"byte_fallback", "true"},                // every byte encodes: no unknown token
      {"normalization_rule_name", "identity"},  // text is kept as it is ...
      {"remove_extra_whitespaces", "false"},    // ... spaces included ...
      {"add_dummy_prefix", "false"},            // ... so decode(encode(t)) == t
      {"split_digits", "true"},
      {"character_coverage", "0.9995"},
      {"max_sentence_length", std::to_string(kMaxLineBytes)},
      {"input_sentence_size", std::to_string(kMaxTrainingLines)},
      {"shuffle_input_sentence", "true"},
      {"num_threads", std::to_string(std::clamp(threads, 1, kMostTrainingThreads))},
      {"minloglevel", "2"},
  };
  auto impl = std::make_unique<Impl>();
  const auto st = sentencepiece::SentencePieceTrainer::Train(args, &lines, &impl->bytes);
  if (!st.ok()) vocab_refused(std::string(st.message()), vocab_size);
  const auto loaded = impl->sp.LoadFromSerializedProto(impl->bytes);
  TANDEM_CHECK(loaded.ok(), "SentencePiece cannot load the model it trained: {}", loaded.message());
  impl->prepare();
  impl->sha = sha256_hex(impl->bytes);
  impl->source = "trained";
  return Tokenizer(std::move(impl));
}

int Tokenizer::vocab_size() const {
  return impl_->hf ? impl_->hf->vocab_size() : impl_->sp.GetPieceSize();
}
int Tokenizer::eos_id() const { return impl_->hf ? impl_->hf->eos_id() : impl_->sp.eos_id(); }
int Tokenizer::bos_id() const { return impl_->hf ? impl_->hf->bos_id() : -1; }

std::vector<int32_t> Tokenizer::encode(std::string_view text, Start start) const {
  if (impl_->hf) return impl_->hf->encode(text, start == Start::kDocument);
  std::vector<int32_t> out;
  std::vector<int> ids;
  // The dummy prefix goes before a document's start only.
  auto add = [&](std::string_view part, bool document_start) {
    const sentencepiece::SentencePieceProcessor& sp =
        document_start || !impl_->sp_later ? impl_->sp : *impl_->sp_later;
    const auto st = sp.Encode(std::string(part), &ids);
    TANDEM_CHECK(st.ok(), "SentencePiece cannot encode: {}", st.message());
    out.insert(out.end(), ids.begin(), ids.end());
  };
  if (!impl_->by_line) {
    add(text, start == Start::kDocument);
    return out;
  }
  for (size_t begin = 0; begin < text.size();) {
    const size_t nl = text.find('\n', begin);
    const size_t end = nl == std::string_view::npos ? text.size() : nl + 1;
    add(text.substr(begin, end - begin), begin == 0 && start == Start::kDocument);
    begin = end;
  }
  return out;
}

bool Tokenizer::encodes_by_line() const { return impl_ != nullptr && impl_->by_line; }

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  const int n = vocab_size();
  for (int32_t id : ids)
    if (id < 0 || id >= n)
      user_error("token id {} is outside the tokenizer's vocabulary of {} tokens", id, n);
  if (impl_->hf) return impl_->hf->decode(ids);
  const std::vector<int> v(ids.begin(), ids.end());
  std::string text;
  const auto st = impl_->sp.Decode(v, &text);
  TANDEM_CHECK(st.ok(), "SentencePiece cannot decode: {}", st.message());
  return text;
}

const std::string& Tokenizer::model_bytes() const { return impl_->bytes; }
const std::string& Tokenizer::sha256() const { return impl_->sha; }
const std::string& Tokenizer::source() const { return impl_->source; }
std::string_view Tokenizer::file_name() const {
  return impl_->hf ? "tokenizer.json" : "tokenizer.model";
}

}  // namespace tandem::data
