// The safetensors file format (Hugging Face): how tandem stores weights and optimizer state so
// that PyTorch and every other framework can read them.
//
// Layout: an 8-byte little-endian unsigned header length N; N bytes of UTF-8 JSON, padded with
// spaces to a multiple of 8; the data section. The header maps each tensor name to
// {"dtype": "F32"|"BF16"|"F16", "shape": [...], "data_offsets": [begin, end]} (byte offsets into
// the data section, row-major little-endian elements) and may hold "__metadata__", a map of
// strings to strings. Tensors tile the data section exactly, in offset order, with no gaps.
//
// The writer lays tensors out as the reference implementation does (by element size, largest
// first, then by name; the header lists "__metadata__" first, then the tensors in offset order),
// so the same tensors give the same bytes as Python's safetensors.torch.save_file (with
// Checksums::None).
//
// Checksums. tandem records, in "__metadata__" (plain strings, so every other reader still reads
// the file and simply ignores them):
//   "sha256:<tensor name>"  the SHA-256 of the tensor's data bytes, 64 lowercase hex digits, one
//                           per tensor;
//   "sha256-of-header"      the SHA-256 of the file's first 8 + N bytes as written, with this
//                           value's own 64 digits read as '0's: names, dtypes, shapes, offsets
//                           and the other metadata are covered too.
// A reader verifies the header's checksum when it opens the file and a tensor's when it reads the
// tensor whole; a mismatch is a UserError naming the file (and the tensor). Files without
// checksums (written by PyTorch or by older tandems) load as before; a file with some checksums
// must have all of them. Readers hand out the metadata without these keys: they belong to the
// format, as data_offsets do.
//
// The reader checks everything and refuses a corrupt file with one UserError that names the
// file and what is wrong. The streaming writer and reader (safetensors_stream.h) are the one
// implementation; the whole-file functions below are thin uses of them.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/core/tensor.h"
#include "tandem/io/atomic_file.h"

namespace tandem::io {

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

using SafetensorsMetadata = std::map<std::string, std::string>;

// The contents of a safetensors file: tensors in data-offset order, each owning its storage.
struct SafetensorsFile {
  std::string path;  // where it was read from, for messages
  std::vector<NamedTensor> tensors;
  SafetensorsMetadata metadata;

  // The tensor called `name`, or null.
  const Tensor* find(std::string_view name) const;
  // The tensor called `name`; its absence is a UserError naming the file.
  const Tensor& get(std::string_view name) const;
  // Likewise, and its shape must be `shape`: "tensor 'wte' in 'ckpt/weights.safetensors' has
  // shape [256, 64]; this model needs [256, 128]".
  const Tensor& get(std::string_view name, const Shape& shape) const;
};

// Whether a writer records the checksums (the top of this file). Record unless the bytes must
// equal another writer's.
enum class Checksums { Record, None };

// A tensor as a writer needs to lay out the file: no data.
struct TensorSpec {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;

  size_t nbytes() const { return static_cast<size_t>(shape.numel()) * dtype_size(dtype); }
};

// One tensor as a file's header describes it, once validated.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets in the data section
  std::string sha256;           // the recorded checksum; empty when the file has none

  uint64_t nbytes() const { return end - begin; }
};

// "F32", "BF16", "F16".
std::string_view safetensors_dtype_name(DType t);

// The tensors in the order their data is written: element size descending, then name.
std::vector<TensorSpec> safetensors_order(const std::vector<TensorSpec>& tensors);

// The specs of tensors that hold data.
std::vector<TensorSpec> tensor_specs(const std::vector<NamedTensor>& tensors);

// The first 8 + N bytes serialize_safetensors writes: the length and the padded JSON header.
// Names must be unique, non-empty and not "__metadata__".
std::string safetensors_header(const std::vector<NamedTensor>& tensors,
                               const SafetensorsMetadata& metadata = {},
                               Checksums checksums = Checksums::Record);

// The whole file, in memory.
std::string serialize_safetensors(const std::vector<NamedTensor>& tensors,
                                  const SafetensorsMetadata& metadata = {},
                                  Checksums checksums = Checksums::Record);
// Streams the file into `out` (the caller commits).
void write_safetensors(AtomicFile& out, const std::vector<NamedTensor>& tensors,
                       const SafetensorsMetadata& metadata = {},
                       Checksums checksums = Checksums::Record);
// Writes the file at `path` atomically.
void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const SafetensorsMetadata& metadata = {},
                      Checksums checksums = Checksums::Record);

// Parses a whole file held in memory; `path` names it in errors. Checksums are verified.
SafetensorsFile parse_safetensors(std::string_view bytes, const std::string& path);
// Reads and parses the file at `path`: "corrupt safetensors file 'x': <what is wrong>". Checksums
// are verified.
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace tandem::io
