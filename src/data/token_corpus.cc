// Shard folders opened as corpora: shards.json parsed and checked, shards mapped.
#include "tandem/data/token_corpus.h"

#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>

#include "tandem/core/error.h"
#include "tandem/core/sha256.h"
#include "tandem/io/atomic_file.h"
#include "tandem/io/json_file.h"
#include "tandem/io/token_shards.h"

namespace tandem::data {
namespace fs = std::filesystem;
namespace {

std::string in_dir(const std::string& dir, std::string_view name) {
  return (fs::path(dir) / name).string();
}

// How messages name a folder's shards.json.
std::string index_name(const std::string& dir) {
  return fmt::format("shard index '{}'", in_dir(dir, kShardsJson));
}

// shards.json, parsed (nesting limited, io/json_file.h); a file that is not JSON, lacks a field or
// has one of the wrong type is refused naming it.
nlohmann::json read_index(const std::string& dir, std::string* text = nullptr) {
  const std::string path = in_dir(dir, kShardsJson);
  if (!fs::exists(path))
    user_error("data folder '{}' holds no {}: it is not a folder written by tandem tokenize", dir,
               kShardsJson);
  std::string bytes = io::read_file(path, "shard index");
  const std::string file = index_name(dir);
  nlohmann::json j = io::parse_json(bytes, file);
  const int64_t version = io::json_int(io::json_member(j, "version", file, "version"), file,
                                       "version", std::numeric_limits<int64_t>::min());
  if (version != kShardsFormatVersion)
    user_error("shard index '{}' has format version {}; this tandem reads version {}", path,
               version, kShardsFormatVersion);
  for (const char* key : {"vocab_size", "tokenizer_sha256", "train", "validation"})
    if (!j.contains(key)) user_error("shard index '{}' has no '{}'", path, key);
  for (const char* key : {"train", "validation"}) io::json_object(j[key], file, key);
  if (text != nullptr) *text = std::move(bytes);
  return j;
}

struct MappedShards {
  std::vector<std::unique_ptr<io::MappedShard>> shards;
};

TokenSplit open_split(const std::string& dir, const nlohmann::json& split, const std::string& name,
                      const char* key, int vocab, const io::Sha256Digest& digest,
                      MappedShards& keep, const std::shared_ptr<const void>& memory) {
  const std::string index = in_dir(dir, kShardsJson);
  const std::string file = index_name(dir);
  std::vector<TokenSpan> spans;
  const std::string list = fmt::format("{}.shards", key);
  const nlohmann::json& shards =
      io::json_array(io::json_member(split, "shards", file, list), file, list);
  for (size_t i = 0; i < shards.size(); ++i) {
    const nlohmann::json& s = shards[i];
    const std::string at = fmt::format("{}[{}]", list, i);
    const std::string entry = io::json_field(at, "file");
    // A plain name in the folder: an entry with '/' or '..' would read a file elsewhere.
    const std::string path = io::file_in_folder(
        dir, io::json_string(io::json_member(s, "file", file, entry), file, entry), file, entry);
    keep.shards.push_back(std::make_unique<io::MappedShard>(path, vocab, digest));
    const io::MappedShard& m = *keep.shards.back();
    const std::string count = io::json_field(at, "tokens");
    const uint64_t want = io::json_u64(io::json_member(s, "tokens", file, count), file, count);
    if (m.count() != want)
      user_error("token shard '{}' holds {} tokens; {} says {}", path, m.count(), index, want);
    spans.push_back(
        {m.tokens(), m.count(), m.width(), fmt::format("token shard '{}'", path), m.mapping()});
  }
  TokenSplit out = TokenSplit::of_spans(fmt::format("data folder '{}'", dir), name,
                                        std::move(spans), memory, vocab);
  out.unit = "tokens";
  return out;
}

}  // namespace

bool is_shard_folder(const std::string& data) {
  std::error_code ec;
  return !data.empty() && fs::is_directory(data, ec);
}

int data_vocab_size(const std::string& data) {
  if (!is_shard_folder(data)) return kByteVocab;
  const nlohmann::json j = read_index(data);
  // Read wide and bounded: a value past 32 bits is refused, not wrapped.
  return static_cast<int>(io::json_int(j["vocab_size"], index_name(data), "vocab_size", 1,
                                       std::numeric_limits<int32_t>::max()));
}

Corpus load_shard_corpus(const std::string& dir) {
  std::string text;
  const nlohmann::json j = read_index(dir, &text);
  const int vocab = data_vocab_size(dir);
  // The tokenizer's file: tokenizer.model or tokenizer.json, as shards.json names it.
  const std::string file = index_name(dir);
  const std::string name = j.contains("tokenizer")
                               ? io::json_string(j["tokenizer"], file, "tokenizer")
                               : std::string(kTokenizerFile);
  const std::string tokenizer_path = io::file_in_folder(dir, name, file, "tokenizer");
  const std::string want_sha = io::json_string(j["tokenizer_sha256"], file, "tokenizer_sha256");
  const io::Sha256Digest digest =
      io::digest_from_hex(want_sha, fmt::format("shard index '{}'", in_dir(dir, kShardsJson)));
  const std::string have_sha = sha256_hex(io::read_file(tokenizer_path, "tokenizer"));
  if (have_sha != want_sha)
    user_error("tokenizer '{}' (SHA-256 {}) is not the one the shards were written with ({})",
               tokenizer_path, have_sha, want_sha);

  Corpus c;
  c.source = dir;
  c.vocab_size = vocab;
  const std::string h = sha256_hex(text);
  c.fingerprint = std::stoull(h.substr(0, 16), nullptr, 16);
  c.tokenizer_path = tokenizer_path;
  c.tokenizer_sha256 = want_sha;
  c.validation_text_bytes =
      j["validation"].contains("text_bytes")
          ? io::json_u64(j["validation"]["text_bytes"], file, "validation.text_bytes")
          : 0;
  auto keep = std::make_shared<MappedShards>();
  const std::shared_ptr<const void> memory = keep;
  c.train = open_split(dir, j["train"], "training split", "train", vocab, digest, *keep, memory);
  c.validation = open_split(dir, j["validation"], "validation split", "validation", vocab, digest,
                            *keep, memory);
  // Bits per byte divide by it: tokens stand for some text (tokenize refuses a validation split
  // of no text).
  if (c.validation.size() > 0 && c.validation_text_bytes == 0)
    user_error(
        "{}: 'validation.text_bytes' is {} but the validation split holds {} tokens: they "
        "came from some text",
        file, j["validation"].contains("text_bytes") ? "0" : "missing", c.validation.size());
  return c;
}

}  // namespace tandem::data
