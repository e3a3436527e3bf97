// Token shards written with POSIX writes and read through a read-only mmap, header checked.
#include "tandem/io/token_shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/core/sha256.h"

namespace tandem::io {
namespace {

constexpr size_t kFlushBytes = size_t{4} << 20;

template <typename T>
void put(std::array<uint8_t, kShardHeaderBytes>& h, size_t at, T v) {
  std::memcpy(h.data() + at, &v, sizeof v);  // x86-64 and aarch64 Linux: little-endian
}
template <typename T>
T get(const uint8_t* h, size_t at) {
  T v;
  std::memcpy(&v, h + at, sizeof v);
  return v;
}

std::array<uint8_t, kShardHeaderBytes> header(uint32_t width, uint64_t tokens, uint32_t vocab,
                                              const Sha256Digest& tokenizer) {
  std::array<uint8_t, kShardHeaderBytes> h{};
  std::memcpy(h.data(), kShardMagic, sizeof kShardMagic);
  put(h, 8, kShardVersion);
  put(h, 12, width);
  put(h, 16, tokens);
  put(h, 24, vocab);
  std::memcpy(h.data() + 32, tokenizer.data(), tokenizer.size());
  return h;
}

}  // namespace

Sha256Digest digest_from_hex(const std::string& hex, const std::string& what) {
  Sha256Digest d{};
  auto nibble = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (hex.size() != 64) user_error("{}: '{}' is not a SHA-256 (64 hex digits)", what, hex);
  for (size_t i = 0; i < 32; ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) user_error("{}: '{}' is not a SHA-256 (64 hex digits)", what, hex);
    d[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return d;
}

std::string digest_hex(const Sha256Digest& d) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (uint8_t b : d) {
    s += kHex[b >> 4];
    s += kHex[b & 15];
  }
  return s;
}

ShardWriter::ShardWriter(std::string path, std::string shown_as, int64_t vocab_size,
                         const Sha256Digest& tokenizer)
    : path_(std::move(path)),
      shown_(std::move(shown_as)),
      vocab_(vocab_size),
      width_(token_bytes_for(vocab_size)),
      tokenizer_(tokenizer) {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(errno);
  const auto h =
      header(static_cast<uint32_t>(width_), 0, static_cast<uint32_t>(vocab_), tokenizer_);
  write_at(h.data(), h.size(), 0);
}

ShardWriter::~ShardWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void ShardWriter::fail(int err) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  user_error("cannot write token shard '{}': {}", shown_, std::strerror(err));
}

void ShardWriter::write_at(const void* data, size_t bytes, uint64_t offset) {
  const IoResult r = pwrite_all(fd_, data, bytes, offset);
  if (!r.ok()) fail(r.error);
}

void ShardWriter::append(const int32_t* ids, size_t n) {
  TANDEM_CHECK(fd_ >= 0, "append to finished shard '{}'", shown_);
  for (size_t i = 0; i < n; ++i) {
    TANDEM_CHECK(ids[i] >= 0 && ids[i] < vocab_, "token id {} outside [0, {})", ids[i], vocab_);
    if (width_ == 2) {
      const uint16_t v = static_cast<uint16_t>(ids[i]);
      buffer_.append(reinterpret_cast<const char*>(&v), 2);
    } else {
      const uint32_t v = static_cast<uint32_t>(ids[i]);
      buffer_.append(reinterpret_cast<const char*>(&v), 4);
    }
  }
  tokens_ += n;
  if (buffer_.size() >= kFlushBytes) {
    write_at(buffer_.data(), buffer_.size(),
             kShardHeaderBytes + (tokens_ * static_cast<uint64_t>(width_) - buffer_.size()));
    buffer_.clear();
  }
}

std::string ShardWriter::finish() {
  TANDEM_CHECK(fd_ >= 0, "shard '{}' finished twice", shown_);
  write_at(buffer_.data(), buffer_.size(),
           kShardHeaderBytes + (tokens_ * static_cast<uint64_t>(width_) - buffer_.size()));
  buffer_.clear();
  const auto h =
      header(static_cast<uint32_t>(width_), tokens_, static_cast<uint32_t>(vocab_), tokenizer_);
  write_at(h.data(), h.size(), 0);
  if (::fsync(fd_) != 0) fail(errno);
  // The digest of the whole file, read back: what a reader would see.
  Sha256 sha;
  std::string buf(size_t{1} << 20, '\0');
  for (uint64_t at = 0;;) {
    const IoResult r = pread_full(fd_, buf.data(), buf.size(), at);
    if (!r.ok()) fail(r.error);
    sha.update(buf.data(), r.done);
    at += r.done;
    if (r.done < buf.size()) break;
  }
  ::close(fd_);
  fd_ = -1;
  return sha.hex();
}

MappedShard::MappedShard(const std::string& path, int64_t vocab_size, const Sha256Digest& tokenizer)
    : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) user_error("token shard '{}' does not exist", path);
    user_error("cannot read token shard '{}': {}", path, std::strerror(err));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    user_error("token shard '{}' is not a regular file", path);
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < kShardHeaderBytes) {
    ::close(fd);
    user_error("token shard '{}' has {} bytes, fewer than its {}-byte header", path, size,
               kShardHeaderBytes);
  }
  // The header is read, not mapped: opening maps none of the shard's pages into the process.
  std::array<uint8_t, kShardHeaderBytes> header;
  const ssize_t got = ::pread(fd, header.data(), header.size(), 0);
  if (got != static_cast<ssize_t>(header.size())) {
    const int err = got < 0 ? errno : EIO;
    ::close(fd);
    user_error("cannot read token shard '{}': {}", path, std::strerror(err));
  }
  map_bytes_ = static_cast<size_t>(size);
  map_ = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    user_error("cannot map token shard '{}': {}", path, std::strerror(err));
  }
  // Windows are drawn at random offsets: read-ahead would only fetch pages nobody reads.
  ::madvise(map_, map_bytes_, MADV_RANDOM);
  auto refuse = [&](const std::string& why) {
    ::munmap(map_, map_bytes_);
    map_ = nullptr;
    user_error("token shard '{}' {}", path, why);
  };
  const uint8_t* h = header.data();
  if (std::memcmp(h, kShardMagic, sizeof kShardMagic) != 0)
    refuse("is not a tandem token shard (its magic number is wrong)");
  const uint32_t version = get<uint32_t>(h, 8);
  if (version != kShardVersion)
    refuse(
        fmt::format("has format version {}; this tandem reads version {}", version, kShardVersion));
  width_ = static_cast<int>(get<uint32_t>(h, 12));
  if (width_ != 2 && width_ != 4)
    refuse(fmt::format("has {}-byte tokens; shards hold 2- or 4-byte tokens", width_));
  count_ = get<uint64_t>(h, 16);
  const uint64_t want = kShardHeaderBytes + count_ * static_cast<uint64_t>(width_);
  if (count_ > (size - kShardHeaderBytes) / static_cast<uint64_t>(width_) || want != size)
    refuse(fmt::format("has {} bytes, but its header announces {} tokens of {} bytes ({} bytes{})",
                       size, count_, width_, want,
                       size < want ? ": it is truncated" : ": it has bytes past its tokens"));
  const uint32_t vocab = get<uint32_t>(h, 24);
  if (static_cast<int64_t>(vocab) != vocab_size)
    refuse(fmt::format("was written for a vocabulary of {} tokens; its folder's tokenizer has {}",
                       vocab, vocab_size));
  Sha256Digest d;
  std::memcpy(d.data(), h + 32, d.size());
  if (d != tokenizer)
    refuse(
        fmt::format("was written with another tokenizer (SHA-256 {}); its folder's tokenizer is {}",
                    digest_hex(d), digest_hex(tokenizer)));
  tokens_ = static_cast<const uint8_t*>(map_) + kShardHeaderBytes;
}

MappedShard::~MappedShard() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

}  // namespace tandem::io
