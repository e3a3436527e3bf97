// A folder of token shards written by `tandem tokenize`, read as a Corpus whose splits are the
// shards mapped read-only: training never holds the corpus in memory whole.
//
// The folder holds shards.json (the vocabulary, the element type, each split's shards with their
// token counts and SHA-256s, the bytes of text each split came from, and the tokenizer's file
// name), the tokenizer the shards were encoded with (tokenizer.model, a SentencePiece model, or
// tokenizer.json, a Hugging Face GPT-2 tokenizer) and the shards: train-NNNNNN.bin and
// val-NNNNNN.bin (io/token_shards.h).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "tandem/data/data.h"

namespace tandem::data {

inline constexpr std::string_view kShardsJson = "shards.json";
// The tokenizer's file where shards.json names none.
inline constexpr std::string_view kTokenizerFile = "tokenizer.model";
inline constexpr int kShardsFormatVersion = 1;

// Whether `data` (what --data names) is a folder, and so a shard folder rather than a text file.
bool is_shard_folder(const std::string& data);
// The vocabulary of `data`: a shard folder's (from its shards.json), else 256 (bytes).
int data_vocab_size(const std::string& data);
// Opens a shard folder: shards.json read, the tokenizer's SHA-256 checked against it, every shard
// mapped and its header checked (io::MappedShard) and its count checked against shards.json. The
// fingerprint is the first 64 bits of the SHA-256 of shards.json, which names every shard's
// SHA-256. Every mismatch is a UserError naming the file.
Corpus load_shard_corpus(const std::string& dir);

// The corpus `data` names (a shard folder, a text file split by `validation_fraction`, or, when
// empty, the synthetic corpus of `synthetic_bytes`, 0 for the default), built once a process:
// the same object for every call with the same three arguments while it stays cached (the
// synthetic corpus takes a moment to generate; a file is read once), so that in-process ranks
// share one copy.
std::shared_ptr<const Corpus> shared_corpus(const std::string& data, size_t synthetic_bytes,
                                            double validation_fraction);

}  // namespace tandem::data
