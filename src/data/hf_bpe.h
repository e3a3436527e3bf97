// A Hugging Face tokenizer.json of byte-level BPE as GPT-2 and Llama 3 use it: the file's
// vocabulary, merges and added tokens, GPT-2's or Llama 3's pre-tokenization pattern, the
// byte-to-character mapping, merges applied by rank, the document-start token of a
// TemplateProcessing post-processor, and decoding. Internal to data/: data::Tokenizer dispatches
// to it for .json files.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tandem::data::detail {

class HfBpe {
 public:
  // Reads a tokenizer.json's text; `path` names it in errors. JSON that does not parse, and any
  // other kind of tokenizer (another model, pre-tokenizer, split pattern, normalizer,
  // post-processor or decoder, or a BPE without a vocabulary or merges), is one UserError naming
  // the file and what is unsupported.
  HfBpe(const std::string& json, const std::string& path);

  int vocab_size() const { return static_cast<int>(bytes_of_id_.size()); }
  int eos_id() const { return eos_id_; }  // <|endoftext|>'s or <|end_of_text|>'s id, or -1
  // The token the post-processor's template puts before a text (<|begin_of_text|>), or -1.
  int bos_id() const { return bos_id_; }
  // Thread-safe: the word cache is guarded by a lock per shard. Added tokens written in the text
  // are matched first, as Hugging Face's tokenizers matches them (AddedTokens below);
  // the text between them is cut into words and merged.
  std::vector<int32_t> encode(std::string_view text) const;
  // Ids must be in [0, vocab_size()); special tokens (<|endoftext|>) decode to nothing. Bytes that
  // are not UTF-8 (a character whose ids are not all there yet) become U+FFFD, as in Hugging Face.
  std::string decode(const std::vector<int32_t>& ids) const;

  // The pre-tokenization patterns tandem implements.
  enum class Pattern { kGpt2, kLlama3 };

 private:
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  // Encodes `text` with the added tokens of pass `pass` and later matched in it first.
  void encode_pass(std::string_view text, size_t pass, std::vector<int32_t>& out) const;

  struct Merge {
    int32_t rank, id;
  };
  Pattern pattern_ = Pattern::kGpt2;
  std::vector<std::string> bytes_of_id_;        // each id's text (empty: a special token)
  std::array<int32_t, 256> byte_id_{};          // the id of each byte's one-character token
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> rank, result
  std::unordered_map<std::string, int32_t> id_of_bytes_;  // for ignore_merges: a whole word's id
  bool ignore_merges_ = false;
  int eos_id_ = -1;
  int bos_id_ = -1;

  // Added tokens as byte tries: Hugging Face matches those that are not normalized first, then
  // the normalized ones in the text left between them; in each pass the longest token at the
  // leftmost place where one starts.
  class AddedTokens {
   public:
    AddedTokens() : nodes_(1) {}
    void add(std::string_view content, int32_t id);
    // The added token that starts at text[at]: its length in bytes and id ({0, -1}: none).
    std::pair<size_t, int32_t> longest_at(std::string_view text, size_t at) const;
    bool may_start(char c) const { return starts_[static_cast<unsigned char>(c)]; }

   private:
    struct Node {
      std::vector<std::pair<unsigned char, int32_t>> next;  // byte -> child node
      int32_t id = -1;                                      // the token that ends here
    };
    int32_t child(int32_t node, unsigned char byte) const;
    std::vector<Node> nodes_;         // nodes_[0] is the root
    std::array<bool, 256> starts_{};  // whether some token starts with the byte
  };
  std::array<AddedTokens, 2> added_;  // not normalized, normalized

  // Words already encoded (words recur: most text is a few thousand words).
  struct CacheShard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<int32_t>> words;
  };
  static constexpr size_t kCacheShards = 64;
  std::unique_ptr<std::array<CacheShard, kCacheShards>> cache_;
};

}  // namespace tandem::data::detail
