// Token shards: files of token ids (uint16 while the vocabulary fits, else uint32) behind a small
// header, written by `tandem tokenize` and read memory-mapped by training, never whole.
//
// Layout (little-endian), 64 bytes of header then `tokens` ids:
//   0  magic "TNDMTOK\0"      8  format version (u32)     12 bytes per token, 2 or 4 (u32)
//   16 token count (u64)      24 vocabulary size (u32)    28 zero (u32)
//   32 SHA-256 of the tokenizer's .model file (32 bytes): shards of another tokenizer are refused
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace tandem::io {

inline constexpr char kShardMagic[8] = {'T', 'N', 'D', 'M', 'T', 'O', 'K', '\0'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderBytes = 64;

using Sha256Digest = std::array<uint8_t, 32>;
// 64 hex digits to the 32 bytes they spell; anything else is a UserError naming `what`.
Sha256Digest digest_from_hex(const std::string& hex, const std::string& what);
std::string digest_hex(const Sha256Digest& d);

// The token width a vocabulary needs: 2 bytes up to 65536 ids, else 4.
inline int token_bytes_for(int64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

// One shard being written: header first (its count filled in by finish()), then tokens appended.
// Every failure is a UserError naming `shown_as` (the name the file will have for the user).
class ShardWriter {
 public:
  ShardWriter(std::string path, std::string shown_as, int64_t vocab_size,
              const Sha256Digest& tokenizer);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Appends ids (each in [0, vocab_size): an internal invariant of the encoder).
  void append(const int32_t* ids, size_t n);
  // Writes the header's count, fsyncs and closes; returns the SHA-256 (hex) of the whole file.
  std::string finish();
  uint64_t tokens() const { return tokens_; }

 private:
  [[noreturn]] void fail(int err);
  void write_at(const void* data, size_t bytes, uint64_t offset);

  std::string path_, shown_;
  int64_t vocab_;
  int width_;
  Sha256Digest tokenizer_;
  int fd_ = -1;
  uint64_t tokens_ = 0;
  std::string buffer_;  // the encoded tokens not yet written
};

// A shard mapped read-only. Opening validates the header against the file (magic, version, width,
// a size that holds exactly the tokens announced, the vocabulary, the tokenizer's digest):
// each mismatch is a UserError naming the shard.
class MappedShard {
 public:
  MappedShard(const std::string& path, int64_t vocab_size, const Sha256Digest& tokenizer);
  ~MappedShard();
  MappedShard(const MappedShard&) = delete;
  MappedShard& operator=(const MappedShard&) = delete;

  const void* tokens() const { return tokens_; }
  const void* mapping() const { return map_; }  // the file's first byte, the header's
  uint64_t count() const { return count_; }
  int width() const { return width_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const void* tokens_ = nullptr;
  uint64_t count_ = 0;
  int width_ = 2;
};

}  // namespace tandem::io
