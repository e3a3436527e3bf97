// The streaming safetensors writer (placeholder checksums first, rewritten at commit) and reader
// (header validated up front, tensors read with pread and verified).
#include "tandem/io/safetensors_stream.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <utility>

#include "safetensors_format.h"
#include "tandem/core/error.h"
#include "tandem/core/file_io.h"

namespace tandem::io {

using safetensors_format::corrupt;

SafetensorsWriter::SafetensorsWriter(const std::string& path,
                                     const std::vector<TensorSpec>& tensors,
                                     const SafetensorsMetadata& metadata, Checksums checksums)
    : owned_(std::make_unique<AtomicFile>(path)), file_(owned_.get()) {
  start(metadata, checksums, tensors);
}

SafetensorsWriter::SafetensorsWriter(AtomicFile& out, const std::vector<TensorSpec>& tensors,
                                     const SafetensorsMetadata& metadata, Checksums checksums)
    : file_(&out), base_(out.bytes_written()) {
  start(metadata, checksums, tensors);
}

SafetensorsWriter::SafetensorsWriter(std::string* out, const std::vector<TensorSpec>& tensors,
                                     const SafetensorsMetadata& metadata, Checksums checksums)
    : memory_(out), base_(out->size()) {
  start(metadata, checksums, tensors);
}

SafetensorsWriter::~SafetensorsWriter() = default;

void SafetensorsWriter::start(const SafetensorsMetadata& metadata, Checksums checksums,
                              const std::vector<TensorSpec>& tensors) {
  safetensors_format::check_specs(tensors, metadata);
  order_ = safetensors_order(tensors);
  metadata_ = metadata;
  if (checksums == Checksums::Record)
    digests_.assign(order_.size(), std::string(safetensors_format::kDigestChars, '0'));
  const std::string header = safetensors_format::build_header(order_, metadata_, digests_);
  header_bytes_ = header.size();
  emit(header.data(), header.size());
  finish_complete_tensors();  // leading empty tensors
}

void SafetensorsWriter::finish_complete_tensors() {
  while (next_ < order_.size() && done_in_next_ == order_[next_].nbytes()) {
    if (!digests_.empty()) {
      digests_[next_] = hash_.hex();
      hash_ = Sha256();
    }
    ++next_;
    done_in_next_ = 0;
  }
}

void SafetensorsWriter::append(const void* data, size_t bytes) {
  TANDEM_CHECK(!committed_, "append after commit");
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    TANDEM_CHECK(next_ < order_.size(), "{} bytes appended beyond the declared tensors", bytes);
    const size_t take =
        static_cast<size_t>(std::min<uint64_t>(bytes, order_[next_].nbytes() - done_in_next_));
    if (!digests_.empty()) hash_.update(p, take);
    emit(p, take);
    p += take;
    bytes -= take;
    done_in_next_ += take;
    finish_complete_tensors();
  }
}

void SafetensorsWriter::append_tensors(const std::vector<NamedTensor>& tensors) {
  TANDEM_CHECK(done_in_next_ == 0, "append_tensors inside tensor '{}'", order_[next_].name);
  std::map<std::string_view, const Tensor*> by_name;
  for (const NamedTensor& t : tensors) by_name[t.name] = &t.tensor;
  while (next_ < order_.size()) {
    const TensorSpec& spec = order_[next_];
    auto it = by_name.find(spec.name);
    TANDEM_CHECK(it != by_name.end(), "tensor '{}' is not given", spec.name);
    const Tensor& t = *it->second;
    TANDEM_CHECK(t.dtype() == spec.dtype && t.shape() == spec.shape,
                 "tensor '{}' is {} {}, declared {} {}", spec.name, dtype_name(t.dtype()),
                 t.shape().str(), dtype_name(spec.dtype), spec.shape.str());
    append(t.data(), t.nbytes());  // completes it: empty tensors are skipped as they come
  }
}

void SafetensorsWriter::commit() {
  TANDEM_CHECK(!committed_, "committed twice");
  TANDEM_CHECK(next_ == order_.size(), "commit before tensor '{}' is whole ({} of {} bytes in)",
               order_[next_].name, done_in_next_, order_[next_].nbytes());
  if (!digests_.empty()) {
    const std::string header = safetensors_format::build_header(order_, metadata_, digests_);
    TANDEM_CHECK(header.size() == header_bytes_, "header grew from {} to {} bytes", header_bytes_,
                 header.size());
    emit_at(0, header);
  }
  committed_ = true;
  if (owned_) owned_->commit();
}

void SafetensorsWriter::emit(const void* data, size_t bytes) {
  if (memory_ != nullptr) {
    memory_->append(static_cast<const char*>(data), bytes);
  } else {
    file_->write(data, bytes);
  }
}

void SafetensorsWriter::emit_at(size_t offset, const std::string& bytes) {
  if (memory_ != nullptr) {
    memory_->replace(base_ + offset, bytes.size(), bytes);
  } else {
    file_->write_at(base_ + offset, bytes.data(), bytes.size());
  }
}

SafetensorsReader::SafetensorsReader(std::string path) : path_(std::move(path)) {
  // O_NONBLOCK: opening a pipe with no writer would otherwise wait forever, before the check.
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0) {
    const int err = errno;
    if (err == ENOENT) user_error("safetensors file '{}' does not exist", path_);
    user_error("cannot read safetensors file '{}': {}", path_, std::strerror(err));
  }
  struct stat st;
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    user_error("safetensors file '{}' is not a regular file", path_);
  }
  try {
    open_header(static_cast<uint64_t>(st.st_size));
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

SafetensorsReader SafetensorsReader::in_memory(std::string_view bytes, std::string path) {
  SafetensorsReader r;
  r.path_ = std::move(path);
  r.bytes_ = bytes;
  r.open_header(bytes.size());
  return r;
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

SafetensorsReader::SafetensorsReader(SafetensorsReader&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      bytes_(other.bytes_),
      data_start_(other.data_start_),
      entries_(std::move(other.entries_)),
      metadata_(std::move(other.metadata_)),
      has_checksums_(other.has_checksums_) {}

SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    bytes_ = other.bytes_;
    data_start_ = other.data_start_;
    entries_ = std::move(other.entries_);
    metadata_ = std::move(other.metadata_);
    has_checksums_ = other.has_checksums_;
  }
  return *this;
}

void SafetensorsReader::open_header(uint64_t size) {
  if (size < 8)
    corrupt(path_, "truncated to {} bytes (a safetensors file starts with an 8-byte header length)",
            size);
  char first8[8];
  read_at(0, first8, 8);
  const uint64_t n = safetensors_format::check_header_length(first8, size, path_);
  std::string text(n, '\0');
  read_at(8, text.data(), n);
  safetensors_format::ParsedHeader header =
      safetensors_format::parse_header(text, size - 8 - n, path_);
  data_start_ = 8 + n;
  entries_ = std::move(header.entries);
  metadata_ = std::move(header.metadata);
  has_checksums_ = header.has_checksums;
}

void SafetensorsReader::read_at(uint64_t offset, void* into, uint64_t bytes) const {
  if (bytes == 0) return;
  if (fd_ < 0) {
    TANDEM_CHECK(offset <= bytes_.size() && bytes <= bytes_.size() - offset,
                 "read of [{}, {}) beyond '{}'", offset, offset + bytes, path_);
    std::memcpy(into, bytes_.data() + offset, bytes);
    return;
  }
  const IoResult r = pread_full(fd_, into, bytes, offset);
  if (!r.ok()) user_error("cannot read safetensors file '{}': {}", path_, std::strerror(r.error));
  if (r.done < bytes) corrupt(path_, "truncated while it was being read");  // shrank under us
}

const SafetensorsEntry* SafetensorsReader::find(std::string_view name) const {
  for (const SafetensorsEntry& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

size_t SafetensorsReader::index_of(std::string_view name) const {
  const SafetensorsEntry* e = find(name);
  if (e == nullptr) user_error("'{}' has no tensor '{}'", path_, name);
  return static_cast<size_t>(e - entries_.data());
}

size_t SafetensorsReader::index_of(std::string_view name, const Shape& shape) const {
  const size_t i = index_of(name);
  if (entries_[i].shape != shape)
    user_error("tensor '{}' in '{}' has shape {}; this model needs {}", name, path_,
               entries_[i].shape.str(), shape.str());
  return i;
}

void SafetensorsReader::verify(size_t index, Sha256& hash) const {
  const SafetensorsEntry& e = entries_[index];
  if (has_checksums_ && hash.hex() != e.sha256)
    user_error(
        "tensor '{}' in '{}' does not match its checksum: the file is damaged or was altered",
        e.name, path_);
}

void SafetensorsReader::read(size_t index, void* into, size_t bytes) const {
  TANDEM_CHECK(index < entries_.size(), "tensor {} of {}", index, entries_.size());
  const SafetensorsEntry& e = entries_[index];
  TANDEM_CHECK(bytes == e.nbytes(), "tensor '{}' has {} bytes, not {}", e.name, e.nbytes(), bytes);
  read_at(data_start_ + e.begin, into, bytes);
  Sha256 hash;
  if (has_checksums_ && bytes > 0) hash.update(into, bytes);
  verify(index, hash);
}

Tensor SafetensorsReader::read_tensor(size_t index) const {
  TANDEM_CHECK(index < entries_.size(), "tensor {} of {}", index, entries_.size());
  Tensor t = Tensor::empty(entries_[index].dtype, entries_[index].shape);
  read(index, t.data(), t.nbytes());
  return t;
}

void SafetensorsReader::read_range(size_t index, uint64_t begin, uint64_t end, void* into) const {
  TANDEM_CHECK(index < entries_.size(), "tensor {} of {}", index, entries_.size());
  const SafetensorsEntry& e = entries_[index];
  TANDEM_CHECK(begin <= end && end <= e.nbytes(), "bytes [{}, {}) of tensor '{}' ({} bytes)", begin,
               end, e.name, e.nbytes());
  read_at(data_start_ + e.begin + begin, into, end - begin);
}

void SafetensorsReader::read_in_pieces(
    size_t index, void* buffer, size_t buffer_bytes,
    const std::function<void(const void*, uint64_t, size_t)>& consume) const {
  TANDEM_CHECK(index < entries_.size(), "tensor {} of {}", index, entries_.size());
  TANDEM_CHECK(buffer_bytes > 0, "an empty buffer");
  const SafetensorsEntry& e = entries_[index];
  Sha256 hash;
  for (uint64_t at = 0; at < e.nbytes();) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buffer_bytes, e.nbytes() - at));
    read_at(data_start_ + e.begin + at, buffer, n);
    if (has_checksums_) hash.update(buffer, n);
    consume(buffer, at, n);
    at += n;
  }
  verify(index, hash);
}

SafetensorsFile SafetensorsReader::read_all() const {
  SafetensorsFile file;
  file.path = path_;
  file.metadata = metadata_;
  for (size_t i = 0; i < entries_.size(); ++i)
    file.tensors.push_back({entries_[i].name, read_tensor(i)});
  return file;
}

}  // namespace tandem::io
