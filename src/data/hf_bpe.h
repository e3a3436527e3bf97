// A Hugging Face tokenizer.json of GPT-2's byte-level BPE: the file's vocabulary and merges,
// GPT-2's pre-tokenization pattern, its byte-to-character mapping, merges applied by rank, and
// decoding. Internal to data/: data::Tokenizer dispatches to it for .json files.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tandem::data::detail {

class HfBpe {
 public:
  // Reads a tokenizer.json's text; `path` names it in errors. JSON that does not parse, and any
  // other kind of tokenizer (another model, pre-tokenizer, normalizer or decoder, or a BPE without
  // a vocabulary or merges), is one UserError naming the file and what is unsupported.
  HfBpe(const std::string& json, const std::string& path);

  int vocab_size() const { return static_cast<int>(bytes_of_id_.size()); }
  int eos_id() const { return eos_id_; }  // <|endoftext|>'s id, or -1
  // Thread-safe: the word cache is guarded by a lock per shard.
  std::vector<int32_t> encode(std::string_view text) const;
  // Ids must be in [0, vocab_size()); special tokens (<|endoftext|>) decode to nothing. Bytes that
  // are not UTF-8 (a character whose ids are not all there yet) become U+FFFD, as in Hugging Face.
  std::string decode(const std::vector<int32_t>& ids) const;

 private:
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;

  struct Merge {
    int32_t rank, id;
  };
  std::vector<std::string> bytes_of_id_;        // each id's text (empty: a special token)
  std::array<int32_t, 256> byte_id_{};          // the id of each byte's one-character token
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> rank, result
  std::unordered_map<std::string, int32_t> id_of_bytes_;  // for ignore_merges: a whole word's id
  bool ignore_merges_ = false;
  int eos_id_ = -1;

  // Words already encoded (words recur: most text is a few thousand words).
  struct CacheShard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<int32_t>> words;
  };
  static constexpr size_t kCacheShards = 64;
  std::unique_ptr<std::array<CacheShard, kCacheShards>> cache_;
};

}  // namespace tandem::data::detail
