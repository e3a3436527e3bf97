// Shard folders opened as corpora: shards.json parsed and checked, shards mapped.
#include "tandem/data/token_corpus.h"

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "tandem/core/error.h"
#include "tandem/core/sha256.h"
#include "tandem/io/atomic_file.h"
#include "tandem/io/token_shards.h"

namespace tandem::data {
namespace fs = std::filesystem;
namespace {

std::string in_dir(const std::string& dir, std::string_view name) {
  return (fs::path(dir) / name).string();
}

// shards.json, parsed; a file that is not JSON or lacks a field is refused naming it.
nlohmann::json read_index(const std::string& dir, std::string* text = nullptr) {
  const std::string path = in_dir(dir, kShardsJson);
  if (!fs::exists(path))
    user_error("data folder '{}' holds no {}: it is not a folder written by tandem tokenize", dir,
               kShardsJson);
  std::string bytes = io::read_file(path, "shard index");
  nlohmann::json j = nlohmann::json::parse(bytes, nullptr, false);
  if (j.is_discarded() || !j.is_object()) user_error("shard index '{}' is not valid JSON", path);
  if (j.value("version", 0) != kShardsFormatVersion)
    user_error("shard index '{}' has format version {}; this tandem reads version {}", path,
               j.value("version", 0), kShardsFormatVersion);
  for (const char* key : {"vocab_size", "tokenizer_sha256", "train", "validation"})
    if (!j.contains(key)) user_error("shard index '{}' has no '{}'", path, key);
  if (text != nullptr) *text = std::move(bytes);
  return j;
}

struct MappedShards {
  std::vector<std::unique_ptr<io::MappedShard>> shards;
};

TokenSplit open_split(const std::string& dir, const nlohmann::json& split, const std::string& name,
                      int vocab, const io::Sha256Digest& digest, MappedShards& keep,
                      const std::shared_ptr<const void>& memory) {
  const std::string index = in_dir(dir, kShardsJson);
  std::vector<TokenSpan> spans;
  try {
    for (const nlohmann::json& s : split.at("shards")) {
      const std::string path = in_dir(dir, s.at("file").get<std::string>());
      keep.shards.push_back(std::make_unique<io::MappedShard>(path, vocab, digest));
      const io::MappedShard& m = *keep.shards.back();
      const uint64_t want = s.at("tokens").get<uint64_t>();
      if (m.count() != want)
        user_error("token shard '{}' holds {} tokens; {} says {}", path, m.count(), index, want);
      spans.push_back(
          {m.tokens(), m.count(), m.width(), fmt::format("token shard '{}'", path), m.mapping()});
    }
  } catch (const nlohmann::json::exception& e) {
    user_error("shard index '{}': the {} is malformed ({})", index, name, e.what());
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
  if (!j["vocab_size"].is_number_integer() || j["vocab_size"].get<int64_t>() < 1)
    user_error("shard index '{}' has no valid vocab_size", in_dir(data, kShardsJson));
  return j["vocab_size"].get<int>();
}

Corpus load_shard_corpus(const std::string& dir) {
  std::string text;
  const nlohmann::json j = read_index(dir, &text);
  const int vocab = data_vocab_size(dir);
  // The tokenizer's file: tokenizer.model or tokenizer.json, as shards.json names it.
  const std::string name = j.contains("tokenizer") && j["tokenizer"].is_string()
                               ? j["tokenizer"].get<std::string>()
                               : std::string(kTokenizerFile);
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)
    user_error("shard index '{}' names tokenizer '{}', which is not a file in its folder",
               in_dir(dir, kShardsJson), name);
  const std::string tokenizer_path = in_dir(dir, name);
  const std::string want_sha =
      j["tokenizer_sha256"].is_string() ? j["tokenizer_sha256"].get<std::string>() : std::string();
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
  c.validation_text_bytes = j["validation"].value("text_bytes", uint64_t{0});
  auto keep = std::make_shared<MappedShards>();
  const std::shared_ptr<const void> memory = keep;
  c.train = open_split(dir, j["train"], "training split", vocab, digest, *keep, memory);
  c.validation = open_split(dir, j["validation"], "validation split", vocab, digest, *keep, memory);
  return c;
}

}  // namespace tandem::data
