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
// so the same tensors give the same bytes as Python's safetensors.torch.save_file.
// The reader checks everything and refuses a corrupt file with one UserError that names the
// file and what is wrong.
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

// "F32", "BF16", "F16".
std::string_view safetensors_dtype_name(DType t);

// The first 8 + N bytes of the file: the length and the padded JSON header, for tensors in the
// order safetensors_order() gives. Names must be unique, non-empty and not "__metadata__".
std::string safetensors_header(const std::vector<NamedTensor>& tensors,
                               const SafetensorsMetadata& metadata = {});
// The tensors in the order their data is written: element size descending, then name.
std::vector<NamedTensor> safetensors_order(const std::vector<NamedTensor>& tensors);

// The whole file, in memory.
std::string serialize_safetensors(const std::vector<NamedTensor>& tensors,
                                  const SafetensorsMetadata& metadata = {});
// Streams the file into `out` (the caller commits).
void write_safetensors(AtomicFile& out, const std::vector<NamedTensor>& tensors,
                       const SafetensorsMetadata& metadata = {});
// Writes the file at `path` atomically.
void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const SafetensorsMetadata& metadata = {});

// Parses a whole file held in memory; `path` names it in errors.
SafetensorsFile parse_safetensors(std::string_view bytes, const std::string& path);
// Reads and parses the file at `path`: "corrupt safetensors file 'x': <what is wrong>".
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace tandem::io
