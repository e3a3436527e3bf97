// safetensors: the header built and validated (every field checked before an offset is trusted,
// checksums included), and the whole-file functions as thin uses of the streaming writer and
// reader.
#include "tandem/io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "safetensors_format.h"
#include "tandem/core/error.h"
#include "tandem/core/sha256.h"
#include "tandem/io/safetensors_stream.h"

namespace tandem::io {

// Elements are written and read as they lie in memory; the format is little-endian.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

namespace safetensors_format {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

bool parse_dtype_name(const std::string& s, DType* out) {
  for (DType t : kAllDTypes)
    if (s == safetensors_dtype_name(t)) {
      *out = t;
      return true;
    }
  return false;
}

// A shape as messages show it; one of many dimensions (only a damaged header holds one) by their
// count, so that the message stays a line.
std::string shape_text(const std::vector<int64_t>& dims) {
  return dims.size() <= 8 ? Shape(dims).str() : fmt::format("of {} dimensions", dims.size());
}

// nlohmann's messages start with "[json.exception.parse_error.101] "; users need only the rest.
std::string json_message(const std::exception& e) {
  std::string m = e.what();
  if (!m.empty() && m[0] == '[') {
    const size_t close = m.find("] ");
    if (close != std::string::npos) m = m.substr(close + 2);
  }
  return m;
}

bool is_digest(const std::string& s) {
  return s.size() == kDigestChars && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

std::string le64(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i, n >>= 8) out[static_cast<size_t>(i)] = static_cast<char>(n & 0xff);
  return out;
}

// The SHA-256 a header of `text` must record: of the length and the text, with the recorded
// value's digits read as '0's. Empty when the value is not where the writer puts it.
std::string header_digest(std::string_view text) {
  const std::string key = fmt::format("\"{}\":\"", kHeaderChecksumKey);
  const size_t at = text.find(key);
  if (at == std::string_view::npos || text.size() - at - key.size() < kDigestChars) return {};
  std::string zeroed = le64(text.size()) + std::string(text);
  std::fill_n(zeroed.begin() + 8 + static_cast<std::ptrdiff_t>(at + key.size()), kDigestChars, '0');
  return sha256_hex(zeroed);
}

}  // namespace

void check_specs(const std::vector<TensorSpec>& tensors, const SafetensorsMetadata& metadata) {
  std::set<std::string_view> seen;
  for (const TensorSpec& t : tensors) {
    TANDEM_CHECK(!t.name.empty() && t.name != "__metadata__", "bad tensor name '{}'", t.name);
    TANDEM_CHECK(seen.insert(t.name).second, "tensor '{}' given twice", t.name);
  }
  for (const auto& [k, v] : metadata)
    TANDEM_CHECK(k != kHeaderChecksumKey && !starts_with(k, kTensorChecksumPrefix),
                 "metadata key '{}' is reserved for checksums", k);
}

std::string build_header(const std::vector<TensorSpec>& order, const SafetensorsMetadata& metadata,
                         const std::vector<std::string>& digests) {
  TANDEM_CHECK(digests.empty() || digests.size() == order.size(), "{} checksums for {} tensors",
               digests.size(), order.size());
  auto render = [&](const std::string& own_digest) {
    SafetensorsMetadata all = metadata;
    if (!digests.empty()) {
      for (size_t i = 0; i < order.size(); ++i)
        all[std::string(kTensorChecksumPrefix) + order[i].name] = digests[i];
      all[std::string(kHeaderChecksumKey)] = own_digest;
    }
    ordered_json h = ordered_json::object();
    if (!all.empty()) {
      ordered_json m = ordered_json::object();
      for (const auto& [k, v] : all) m[k] = v;
      h["__metadata__"] = std::move(m);
    }
    uint64_t offset = 0;
    for (const TensorSpec& t : order) {
      ordered_json info = ordered_json::object();
      info["dtype"] = safetensors_dtype_name(t.dtype);
      info["shape"] = t.shape.dims();
      info["data_offsets"] = {offset, offset + t.nbytes()};
      offset += t.nbytes();
      h[t.name] = std::move(info);
    }
    std::string text;
    try {
      text = h.dump();
    } catch (const ordered_json::exception& e) {
      user_error("cannot write safetensors header: {}", json_message(e));  // a non-UTF-8 name
    }
    text.append((8 - text.size() % 8) % 8, ' ');
    return le64(text.size()) + text;
  };
  if (digests.empty()) return render("");
  return render(sha256_hex(render(std::string(kDigestChars, '0'))));
}

uint64_t check_header_length(const char* first8, uint64_t file_size, const std::string& path) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(first8[i]);
  if (n > file_size - 8)
    corrupt(path, "header length {} reaches beyond the end of the file ({} bytes)", n, file_size);
  // The reference implementation's limit; a damaged length never makes a reader allocate more.
  if (n > kMaxHeaderBytes)
    corrupt(path, "header length {} is over {} bytes, the most the format allows", n,
            kMaxHeaderBytes);
  return n;
}

ParsedHeader parse_header(std::string_view text, uint64_t data_size, const std::string& path) {
  // nlohmann keeps the last of two equal keys silently; a per-object key set catches duplicates.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  bool duplicate_is_tensor = false;
  json::parser_callback_t cb = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == json::parse_event_t::key && !open_objects.empty() && duplicate.empty()) {
      const std::string key = parsed.get<std::string>();
      if (!open_objects.back().insert(key).second) {
        duplicate = key;
        duplicate_is_tensor = open_objects.size() == 1;
      }
    }
    return true;
  };
  json h;
  try {
    h = json::parse(text.begin(), text.end(), cb);
  } catch (const json::exception& e) {
    corrupt(path, "header is not valid JSON: {}", json_message(e));
  }
  if (!duplicate.empty()) {
    if (duplicate_is_tensor) corrupt(path, "tensor '{}' appears twice in the header", duplicate);
    corrupt(path, "key '{}' appears twice in one object of the header", duplicate);
  }
  if (!h.is_object()) corrupt(path, "header is not a JSON object");

  ParsedHeader out;
  std::map<std::string, std::string> tensor_digests;  // tensor name -> recorded checksum
  std::string own_digest;
  bool has_own_digest = false;
  for (const auto& [name, info] : h.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) corrupt(path, "'__metadata__' must map strings to strings");
      for (const auto& [k, v] : info.items()) {
        if (!v.is_string())
          corrupt(path, "'__metadata__' must map strings to strings ('{}' does not)", k);
        const bool for_tensor = starts_with(k, kTensorChecksumPrefix);
        if (for_tensor || k == kHeaderChecksumKey) {
          if (!is_digest(v.get<std::string>()))
            corrupt(path, "checksum '{}' is not 64 lowercase hex digits", k);
          if (for_tensor) {
            tensor_digests[k.substr(kTensorChecksumPrefix.size())] = v.get<std::string>();
          } else {
            own_digest = v.get<std::string>();
            has_own_digest = true;
          }
          continue;
        }
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    if (name.empty()) corrupt(path, "a tensor has an empty name");
    if (!info.is_object()) corrupt(path, "tensor '{}': its entry is not a JSON object", name);
    for (const auto& [k, v] : info.items())
      if (k != "dtype" && k != "shape" && k != "data_offsets")
        corrupt(path, "tensor '{}': unexpected field '{}'", name, k);
    for (const char* k : {"dtype", "shape", "data_offsets"})
      if (!info.contains(k)) corrupt(path, "tensor '{}': '{}' is missing", name, k);

    SafetensorsEntry e;
    e.name = name;
    const json& dtype = info["dtype"];
    if (!dtype.is_string()) corrupt(path, "tensor '{}': 'dtype' must be a string", name);
    if (!parse_dtype_name(dtype.get<std::string>(), &e.dtype))
      corrupt(path, "tensor '{}': dtype '{}' is not supported (tandem reads F32, BF16 and F16)",
              name, dtype.get<std::string>());

    const json& shape = info["shape"];
    bool shape_ok = shape.is_array();
    uint64_t numel = 1;
    bool overflow = false;
    std::vector<int64_t> dims;
    if (shape_ok)
      for (const json& d : shape) {
        if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t{INT64_MAX}) {
          shape_ok = false;
          break;
        }
        dims.push_back(d.get<int64_t>());
        overflow |= __builtin_mul_overflow(numel, d.get<uint64_t>(), &numel);
      }
    if (!shape_ok)
      corrupt(path, "tensor '{}': 'shape' must be a list of non-negative integers", name);

    const json& offsets = info["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned() || offsets[0].get<uint64_t>() > offsets[1].get<uint64_t>())
      corrupt(path,
              "tensor '{}': 'data_offsets' must be two non-negative integers [begin, end] with "
              "begin <= end",
              name);
    e.begin = offsets[0].get<uint64_t>();
    e.end = offsets[1].get<uint64_t>();

    uint64_t need = 0;
    overflow |= __builtin_mul_overflow(numel, uint64_t{dtype_size(e.dtype)}, &need);
    if (overflow || need > uint64_t{INT64_MAX})
      corrupt(path, "tensor '{}': shape {} is too large", name, shape_text(dims));
    if (e.end - e.begin != need)
      corrupt(path, "tensor '{}' has {} bytes (data_offsets [{}, {}]) but {} {} needs {}", name,
              e.end - e.begin, e.begin, e.end, dtype.get<std::string>(), shape_text(dims), need);
    e.shape = Shape(std::move(dims));
    out.entries.push_back(std::move(e));
  }

  std::sort(out.entries.begin(), out.entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  // Truncation first: it explains any other symptom a short file shows.
  for (const SafetensorsEntry& e : out.entries)
    if (e.end > data_size)
      corrupt(path,
              "truncated: tensor '{}' ends at byte {} of the data section, which has only {} bytes",
              e.name, e.end, data_size);
  uint64_t covered = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry& e : out.entries) {
    if (e.begin < covered)
      corrupt(path, "tensors '{}' (bytes [{}, {})) and '{}' (bytes [{}, {})) overlap", prev->name,
              prev->begin, prev->end, e.name, e.begin, e.end);
    if (e.begin > covered)
      corrupt(path, "bytes [{}, {}) of the data section belong to no tensor", covered, e.begin);
    covered = e.end;
    prev = &e;
  }
  if (covered < data_size)
    corrupt(path, "the last {} bytes of the file belong to no tensor", data_size - covered);

  // Checksums: all or none. The header's own first, as it covers every other symptom.
  if (!has_own_digest && tensor_digests.empty()) return out;
  if (!has_own_digest)
    corrupt(path, "it records tensor checksums but not the header's ('{}')", kHeaderChecksumKey);
  if (header_digest(text) != own_digest)
    corrupt(path, "the header does not match its checksum: the file is damaged or was altered");
  for (SafetensorsEntry& e : out.entries) {
    auto it = tensor_digests.find(e.name);
    if (it == tensor_digests.end()) corrupt(path, "tensor '{}' has no checksum", e.name);
    e.sha256 = std::move(it->second);
    tensor_digests.erase(it);
  }
  if (!tensor_digests.empty())
    corrupt(path, "a checksum is recorded for tensor '{}', which the file does not hold",
            tensor_digests.begin()->first);
  out.has_checksums = true;
  return out;
}

}  // namespace safetensors_format

std::string_view safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
  }
  return "?";
}

std::vector<TensorSpec> safetensors_order(const std::vector<TensorSpec>& tensors) {
  std::vector<TensorSpec> sorted = tensors;
  // Largest elements first keeps every tensor aligned to its element size (the header is padded
  // to 8), as the reference writer does; names break ties, so the layout is reproducible.
  std::stable_sort(sorted.begin(), sorted.end(), [](const TensorSpec& a, const TensorSpec& b) {
    const size_t sa = dtype_size(a.dtype), sb = dtype_size(b.dtype);
    if (sa != sb) return sa > sb;
    if (a.dtype != b.dtype) return a.dtype == DType::BF16;  // BF16 before F16, as the reference
    return a.name < b.name;
  });
  return sorted;
}

std::vector<TensorSpec> tensor_specs(const std::vector<NamedTensor>& tensors) {
  std::vector<TensorSpec> out;
  out.reserve(tensors.size());
  for (const NamedTensor& t : tensors) {
    TANDEM_CHECK(t.tensor.defined(), "tensor '{}' has no storage", t.name);
    out.push_back({t.name, t.tensor.dtype(), t.tensor.shape()});
  }
  return out;
}

std::string safetensors_header(const std::vector<NamedTensor>& tensors,
                               const SafetensorsMetadata& metadata, Checksums checksums) {
  const std::string file = serialize_safetensors(tensors, metadata, checksums);
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  return file.substr(0, 8 + n);
}

std::string serialize_safetensors(const std::vector<NamedTensor>& tensors,
                                  const SafetensorsMetadata& metadata, Checksums checksums) {
  std::string out;
  SafetensorsWriter writer(&out, tensor_specs(tensors), metadata, checksums);
  writer.append_tensors(tensors);
  writer.commit();
  return out;
}

void write_safetensors(AtomicFile& out, const std::vector<NamedTensor>& tensors,
                       const SafetensorsMetadata& metadata, Checksums checksums) {
  SafetensorsWriter writer(out, tensor_specs(tensors), metadata, checksums);
  writer.append_tensors(tensors);
  writer.commit();
}

void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const SafetensorsMetadata& metadata, Checksums checksums) {
  SafetensorsWriter writer(path, tensor_specs(tensors), metadata, checksums);
  writer.append_tensors(tensors);
  writer.commit();
}

SafetensorsFile parse_safetensors(std::string_view bytes, const std::string& path) {
  return SafetensorsReader::in_memory(bytes, path).read_all();
}

SafetensorsFile load_safetensors(const std::string& path) {
  // Each tensor is read straight into its storage: a large file is never held twice in memory.
  return SafetensorsReader(path).read_all();
}

const Tensor* SafetensorsFile::find(std::string_view name) const {
  for (const NamedTensor& t : tensors)
    if (t.name == name) return &t.tensor;
  return nullptr;
}

const Tensor& SafetensorsFile::get(std::string_view name) const {
  const Tensor* t = find(name);
  if (t == nullptr) user_error("'{}' has no tensor '{}'", path, name);
  return *t;
}

const Tensor& SafetensorsFile::get(std::string_view name, const Shape& shape) const {
  const Tensor& t = get(name);
  if (t.shape() != shape)
    user_error("tensor '{}' in '{}' has shape {}; this model needs {}", name, path, t.shape().str(),
               shape.str());
  return t;
}

}  // namespace tandem::io
