// A subword tokenizer that encodes text to token ids and decodes them back: a SentencePiece BPE
// model, trained on text files or loaded from a .model file, or GPT-2's or Llama 3's byte-level
// BPE or Llama 2's SentencePiece BPE loaded from a Hugging Face tokenizer.json. Trained models use
// byte fallback and no normalisation, and byte-level BPE encodes bytes, so every input encodes and
// decode(encode(text)) == text for UTF-8 text without special tokens written in it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::data {

class Tokenizer {
 public:
  // Loads a Hugging Face tokenizer.json of GPT-2's or Llama 3's byte-level BPE or of Llama 2's
  // SentencePiece BPE (a path ending in .json) or a SentencePiece .model file (any other path). A
  // missing or malformed file, or a tokenizer.json of another kind, is a UserError naming it.
  static Tokenizer load(const std::string& path);
  // Trains a BPE model of `vocab_size` pieces on the lines of `files` (read once; at most
  // kMaxTrainingLines of them sampled) with `threads` threads. A vocabulary the text cannot fill,
  // or one too small for its characters, is a UserError that says which sizes would do.
  static Tokenizer train(const std::vector<std::string>& files, int vocab_size, int threads);

  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  int vocab_size() const;
  int eos_id() const;  // appended after each document; decodes to nothing (-1: the model has none)
  // Put before each document, as a tokenizer.json's post-processor says (Llama 3's
  // <|begin_of_text|>, Llama 2's <s>); decodes to nothing (-1: none, as for SentencePiece models).
  int bos_id() const;
  // Where a text to encode starts: at a document's start, or after a line end inside one
  // (tandem tokenize's chunks after a file's first). Llama 2's tokenizers, a .model with
  // add_dummy_prefix and a tokenizer.json with the Prepend normalizer, put "▁" before a document
  // only, so that a document encoded in pieces cut at line ends gets the ids of the whole.
  enum class Start { kDocument, kAfterLineEnd };
  // Thread-safe: encoders run on every core at once. A tokenizer.json's added tokens written in
  // the text (<|end_of_text|>) are encoded as those tokens, as Hugging Face's tokenizers does; no
  // bos is added (bos_id() says which to put before a document).
  std::vector<int32_t> encode(std::string_view text, Start start = Start::kDocument) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  // Whether encode hands SentencePiece a line at a time (the same ids, faster; see tokenizer.cc).
  bool encodes_by_line() const;

  const std::string& model_bytes() const;  // the serialised .model, or the tokenizer.json's bytes
  const std::string& sha256() const;       // of model_bytes(): the tokenizer's fingerprint
  const std::string& source() const;       // the file it came from, or "trained"
  // The name a copy of model_bytes() takes beside token shards, which load() reads back as the
  // same kind: "tokenizer.model" (SentencePiece) or "tokenizer.json" (Hugging Face).
  std::string_view file_name() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

inline constexpr int64_t kMaxTrainingLines = 2'000'000;

}  // namespace tandem::data
