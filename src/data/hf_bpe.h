// A Hugging Face tokenizer.json of byte-level BPE as GPT-2 and Llama 3 use it, or of
// SentencePiece's BPE with byte fallback as Llama 2, Mistral and TinyLlama write it: the file's
// vocabulary, merges and added tokens, GPT-2's or Llama 3's pre-tokenization pattern and
// byte-to-character mapping or Llama 2's normalizer and byte pieces, merges applied by rank, the
// document-start token of a TemplateProcessing post-processor, and decoding. Internal to data/:
// data::Tokenizer dispatches to it for .json files.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
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
  // the file and what is unsupported. A BPE that sets byte_fallback is taken for Llama 2's kind.
  HfBpe(const std::string& json, const std::string& path);

  int vocab_size() const { return static_cast<int>(bytes_of_id_.size()); }
  // <|endoftext|>'s or <|end_of_text|>'s id (Llama 2's kind: </s>'s), or -1.
  int eos_id() const { return eos_id_; }
  // The token the post-processor's template puts before a text (<|begin_of_text|>, <s>), or -1.
  int bos_id() const { return bos_id_; }
  // Thread-safe: the word cache is guarded by a lock per shard. Added tokens written in the text
  // are matched first, as Hugging Face's tokenizers matches them (AddedTokens below);
  // the text between them is cut into words and merged. `document_start`: whether the text
  // starts a document; Llama 2's kind puts "▁" before each text between added tokens but one
  // that continues a document after a line end (tandem tokenize's chunks after a file's first).
  std::vector<int32_t> encode(std::string_view text, bool document_start = true) const;
  // Ids must be in [0, vocab_size()); special tokens (<|endoftext|>, <s>) decode to nothing. Bytes
  // that are not UTF-8 (a character whose ids are not all there yet) become U+FFFD, as in Hugging
  // Face (Llama 2's kind: one for each byte piece of a run that is not UTF-8).
  std::string decode(const std::vector<int32_t>& ids) const;

  // The kinds tandem implements: byte-level BPE with GPT-2's or Llama 3's pre-tokenization
  // pattern, and SentencePiece's BPE with byte fallback as Llama 2's tokenizer.json writes it
  // (normalizer Prepend "▁" and Replace " " with "▁", no pre-tokenizer, pieces <0x00> to <0xFF>
  // for bytes outside the vocabulary, decoder Replace, ByteFallback, Fuse and Strip).
  enum class Kind { kGpt2, kLlama3, kLlama2 };

 private:
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  // Encodes the text between two added tokens not normalized: normalized (`prepend`: Llama 2's
  // "▁" first), then the normalized added tokens matched in it, then the rest in words.
  void encode_segment(std::string_view text, bool prepend, std::vector<int32_t>& out) const;
  std::string decode_llama2(const std::vector<int32_t>& ids) const;
  // The constructor's reading of each kind's vocabulary: byte_id_, bytes_of_id_ and the maps.
  void read_byte_level_vocab(const nlohmann::json& model,
                             const std::vector<const std::string*>& token_of,
                             const std::vector<bool>& special,
                             const std::unordered_map<std::string, int32_t>& id_of,
                             const std::string& path);
  void read_llama2_vocab(const nlohmann::json& vocab,
                         const std::vector<const std::string*>& token_of,
                         const std::vector<bool>& special,
                         const std::unordered_map<std::string, int32_t>& id_of,
                         const std::string& path);

  struct Merge {
    int32_t rank, id;
  };
  Kind kind_ = Kind::kGpt2;
  std::vector<std::string> bytes_of_id_;  // each id's text (empty: a special token)
  // The id each byte is encoded as alone: its one-character token (byte-level), or its piece
  // <0xXX> (Llama 2's kind, for characters outside the vocabulary).
  std::array<int32_t, 256> byte_id_{};
  std::unordered_map<char32_t, int32_t> char_id_;  // Llama 2's kind: one-character tokens
  std::vector<int16_t> piece_byte_;  // Llama 2's kind: the byte of each piece <0xXX>, else -1
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
    // Calls text(piece, offset) for each piece of `text` between the tokens (empty ones too) and
    // appends the tokens' ids to `out` in between.
    template <typename Fn>
    void split(std::string_view text, std::vector<int32_t>& out, Fn&& text_fn) const;

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
