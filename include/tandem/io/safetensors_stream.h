// safetensors written and read tensor by tensor, so that a model larger than memory is saved and
// loaded without a whole-model buffer: the writer takes each tensor's bytes as they are produced
// (gathered from ranks, read from a slow tier), in pieces if need be; the reader validates the
// header once and reads any tensor, or any byte range of one, straight into the caller's memory.
// The format, its checksums and the messages are safetensors.h's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/core/sha256.h"
#include "tandem/io/atomic_file.h"
#include "tandem/io/safetensors.h"

namespace tandem::io {

// Writes one safetensors file from tensors appended one after the other, in order(). The layout
// is fixed at construction from the specs (safetensors_order), so the bytes equal what
// save_safetensors writes for the same tensors and metadata. The header goes first with its
// checksums as placeholders of their final width; each tensor's SHA-256 is computed as its bytes
// stream through; commit() rewrites the header in place with the real ones.
//
//   SafetensorsWriter w(out, specs, {{"format", "pt"}});
//   for (const TensorSpec& t : w.order())
//     for (each piece of t, in order) w.append(piece, piece_bytes);
//   w.commit();
//
// Misuse (more bytes than the tensors declare, a commit before every byte is in, names given
// twice) is an internal error; a write failure is AtomicFile's UserError.
class SafetensorsWriter {
 public:
  // Writes the file at `path` atomically; commit() puts it in place.
  SafetensorsWriter(const std::string& path, const std::vector<TensorSpec>& tensors,
                    const SafetensorsMetadata& metadata = {},
                    Checksums checksums = Checksums::Record);
  // Writes into `out`, from its current end; the caller commits `out` after commit().
  SafetensorsWriter(AtomicFile& out, const std::vector<TensorSpec>& tensors,
                    const SafetensorsMetadata& metadata = {},
                    Checksums checksums = Checksums::Record);
  // Appends the file to `*out`, in memory.
  SafetensorsWriter(std::string* out, const std::vector<TensorSpec>& tensors,
                    const SafetensorsMetadata& metadata = {},
                    Checksums checksums = Checksums::Record);
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The tensors in the order their bytes must be appended.
  const std::vector<TensorSpec>& order() const { return order_; }
  // The index in order() of the tensor the next append() continues, and how many of its bytes are
  // in; order().size() once every byte is.
  size_t next() const { return next_; }
  uint64_t next_offset() const { return done_in_next_; }

  // The next `bytes` bytes of the data: the rest of the current tensor, then the next ones (a
  // piece may end inside a tensor, or span several).
  void append(const void* data, size_t bytes);
  // Appends the data of every tensor from next() on, in order(), each taken by name from
  // `tensors` (which must hold it, with its declared size); next_offset() must be 0.
  void append_tensors(const std::vector<NamedTensor>& tensors);
  // Completes the file: every byte must be in; records the checksums in the header. A writer
  // given a path then puts the file in place.
  void commit();

 private:
  void start(const SafetensorsMetadata& metadata, Checksums checksums,
             const std::vector<TensorSpec>& tensors);
  void finish_complete_tensors();
  void emit(const void* data, size_t bytes);
  void emit_at(size_t offset, const std::string& bytes);

  std::unique_ptr<AtomicFile> owned_;
  AtomicFile* file_ = nullptr;
  std::string* memory_ = nullptr;
  size_t base_ = 0;  // where the file starts in *file_ or *memory_
  std::vector<TensorSpec> order_;
  SafetensorsMetadata metadata_;
  std::vector<std::string> digests_;  // one per tensor in order(); empty without checksums
  size_t header_bytes_ = 0;
  size_t next_ = 0;
  uint64_t done_in_next_ = 0;
  Sha256 hash_;  // of the bytes of the tensor next() names
  bool committed_ = false;
};

// Reads one safetensors file: the constructor reads and validates the header (and its checksum);
// the tensors are read on demand, with pread, into the caller's memory. The read functions are
// const and may run concurrently from several threads.
class SafetensorsReader {
 public:
  // The file at `path`: "safetensors file 'x' does not exist", "corrupt safetensors file 'x':
  // <what is wrong>".
  explicit SafetensorsReader(std::string path);
  // A file held in memory (`bytes` must outlive the reader); `path` names it in errors.
  static SafetensorsReader in_memory(std::string_view bytes, std::string path);
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&& other) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&& other) noexcept;

  const std::string& path() const { return path_; }
  // In data-offset order.
  const std::vector<SafetensorsEntry>& tensors() const { return entries_; }
  // Without the checksum keys.
  const SafetensorsMetadata& metadata() const { return metadata_; }
  bool has_checksums() const { return has_checksums_; }

  // The index in tensors() of tensor `name`, or null / a UserError naming the file: "'x' has no
  // tensor 'wte'"; with `shape`, that shape too: "tensor 'wte' in 'x' has shape [256, 64]; this
  // model needs [256, 128]".
  const SafetensorsEntry* find(std::string_view name) const;
  size_t index_of(std::string_view name) const;
  size_t index_of(std::string_view name, const Shape& shape) const;

  // Tensor `index` whole into `into` (`bytes` must be its size), its checksum verified when the
  // file has checksums: "tensor 'h.3.attn.c_attn.weight' in 'ck/weights.safetensors' does not
  // match its checksum: the file is damaged or was altered".
  void read(size_t index, void* into, size_t bytes) const;
  // The same, into a new tensor.
  Tensor read_tensor(size_t index) const;
  // Bytes [begin, end) of tensor `index` (a rank's rows of it), not verified: a checksum covers
  // the whole tensor.
  void read_range(size_t index, uint64_t begin, uint64_t end, void* into) const;
  // Tensor `index` in order, through `buffer` (`buffer_bytes` at a time), each piece handed to
  // `consume(piece, offset in the tensor, bytes)`; the checksum is verified after the last piece,
  // so a mismatch is raised after `consume` has seen the data.
  void read_in_pieces(
      size_t index, void* buffer, size_t buffer_bytes,
      const std::function<void(const void* piece, uint64_t offset, size_t bytes)>& consume) const;
  // Every tensor, verified.
  SafetensorsFile read_all() const;

 private:
  SafetensorsReader() = default;
  void open_header(uint64_t size);
  void read_at(uint64_t offset, void* into, uint64_t bytes) const;
  void verify(size_t index, Sha256& hash) const;

  std::string path_;
  int fd_ = -1;
  std::string_view bytes_;  // the file, when held in memory
  uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  SafetensorsMetadata metadata_;
  bool has_checksums_ = false;
};

}  // namespace tandem::io
