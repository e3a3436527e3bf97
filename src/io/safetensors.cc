// safetensors: header building and writing, and a reader that validates every field before it
// trusts an offset.
#include "tandem/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "tandem/core/error.h"

namespace tandem::io {

// Elements are written and read as they lie in memory; the format is little-endian.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// One tensor as the header describes it, once validated.
struct Entry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};

struct Header {
  std::vector<Entry> entries;  // in data-offset order
  SafetensorsMetadata metadata;
};

template <typename... Args>
[[noreturn]] void corrupt(const std::string& path, fmt::format_string<Args...> f, Args&&... args) {
  user_error("corrupt safetensors file '{}': {}", path,
             fmt::format(f, std::forward<Args>(args)...));
}

bool parse_dtype_name(const std::string& s, DType* out) {
  for (DType t : kAllDTypes)
    if (s == safetensors_dtype_name(t)) {
      *out = t;
      return true;
    }
  return false;
}

std::string shape_text(const std::vector<int64_t>& dims) { return Shape(dims).str(); }

// nlohmann's messages start with "[json.exception.parse_error.101] "; users need only the rest.
std::string json_message(const std::exception& e) {
  std::string m = e.what();
  if (!m.empty() && m[0] == '[') {
    const size_t close = m.find("] ");
    if (close != std::string::npos) m = m.substr(close + 2);
  }
  return m;
}

// Validates the JSON header against a data section of `data_size` bytes.
Header parse_header(std::string_view text, uint64_t data_size, const std::string& path) {
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

  Header out;
  for (const auto& [name, info] : h.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) corrupt(path, "'__metadata__' must map strings to strings");
      for (const auto& [k, v] : info.items()) {
        if (!v.is_string())
          corrupt(path, "'__metadata__' must map strings to strings ('{}' does not)", k);
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

    Entry e;
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
    if (shape_ok)
      for (const json& d : shape) {
        if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t{INT64_MAX}) {
          shape_ok = false;
          break;
        }
        e.shape.push_back(d.get<int64_t>());
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
      corrupt(path, "tensor '{}': shape {} is too large", name, shape_text(e.shape));
    if (e.end - e.begin != need)
      corrupt(path, "tensor '{}' has {} bytes (data_offsets [{}, {}]) but {} {} needs {}", name,
              e.end - e.begin, e.begin, e.end, dtype.get<std::string>(), shape_text(e.shape), need);
    out.entries.push_back(std::move(e));
  }

  std::sort(out.entries.begin(), out.entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // Truncation first: it explains any other symptom a short file shows.
  for (const Entry& e : out.entries)
    if (e.end > data_size)
      corrupt(path,
              "truncated: tensor '{}' ends at byte {} of the data section, which has only {} bytes",
              e.name, e.end, data_size);
  uint64_t covered = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : out.entries) {
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
  return out;
}

uint64_t read_le64(const char* p) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(p[i]);
  return n;
}

// Checks the 8-byte length against the file size; returns the header length.
uint64_t check_header_length(const char* first8, uint64_t file_size, const std::string& path) {
  const uint64_t n = read_le64(first8);
  if (n > file_size - 8)
    corrupt(path, "header length {} reaches beyond the end of the file ({} bytes)", n, file_size);
  return n;
}

}  // namespace

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

std::vector<NamedTensor> safetensors_order(const std::vector<NamedTensor>& tensors) {
  std::vector<NamedTensor> sorted = tensors;
  // Largest elements first keeps every tensor aligned to its element size (the header is padded
  // to 8), as the reference writer does; names break ties, so the layout is reproducible.
  std::stable_sort(sorted.begin(), sorted.end(), [](const NamedTensor& a, const NamedTensor& b) {
    const size_t sa = dtype_size(a.tensor.dtype()), sb = dtype_size(b.tensor.dtype());
    if (sa != sb) return sa > sb;
    if (a.tensor.dtype() != b.tensor.dtype())  // BF16 before F16, as in the reference
      return a.tensor.dtype() == DType::BF16;
    return a.name < b.name;
  });
  return sorted;
}

std::string safetensors_header(const std::vector<NamedTensor>& tensors,
                               const SafetensorsMetadata& metadata) {
  ordered_json h = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json m = ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = std::move(m);
  }
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const NamedTensor& t : safetensors_order(tensors)) {
    TANDEM_CHECK(!t.name.empty() && t.name != "__metadata__", "bad tensor name '{}'", t.name);
    TANDEM_CHECK(seen.insert(t.name).second, "tensor '{}' given twice", t.name);
    TANDEM_CHECK(t.tensor.defined(), "tensor '{}' has no storage", t.name);
    ordered_json info = ordered_json::object();
    info["dtype"] = safetensors_dtype_name(t.tensor.dtype());
    info["shape"] = t.tensor.shape().dims();
    info["data_offsets"] = {offset, offset + t.tensor.nbytes()};
    offset += t.tensor.nbytes();
    h[t.name] = std::move(info);
  }
  std::string text;
  try {
    text = h.dump();
  } catch (const ordered_json::exception& e) {
    user_error("cannot write safetensors header: {}", json_message(e));  // e.g. a non-UTF-8 name
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i, n >>= 8) out[static_cast<size_t>(i)] = static_cast<char>(n & 0xff);
  return out + text;
}

std::string serialize_safetensors(const std::vector<NamedTensor>& tensors,
                                  const SafetensorsMetadata& metadata) {
  std::string out = safetensors_header(tensors, metadata);
  for (const NamedTensor& t : safetensors_order(tensors))
    out.append(static_cast<const char*>(t.tensor.data()), t.tensor.nbytes());
  return out;
}

void write_safetensors(AtomicFile& out, const std::vector<NamedTensor>& tensors,
                       const SafetensorsMetadata& metadata) {
  out.write(safetensors_header(tensors, metadata));
  for (const NamedTensor& t : safetensors_order(tensors))
    if (t.tensor.nbytes() > 0) out.write(t.tensor.data(), t.tensor.nbytes());
}

void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const SafetensorsMetadata& metadata) {
  AtomicFile out(path);
  write_safetensors(out, tensors, metadata);
  out.commit();
}

SafetensorsFile parse_safetensors(std::string_view bytes, const std::string& path) {
  if (bytes.size() < 8)
    corrupt(path, "truncated to {} bytes (a safetensors file starts with an 8-byte header length)",
            bytes.size());
  const uint64_t n = check_header_length(bytes.data(), bytes.size(), path);
  const Header header = parse_header(bytes.substr(8, n), bytes.size() - 8 - n, path);
  SafetensorsFile file;
  file.path = path;
  file.metadata = header.metadata;
  const char* data = bytes.data() + 8 + n;
  for (const Entry& e : header.entries) {
    Tensor t = Tensor::empty(e.dtype, Shape(e.shape));
    if (t.nbytes() > 0) std::memcpy(t.data(), data + e.begin, t.nbytes());
    file.tensors.push_back({e.name, std::move(t)});
  }
  return file;
}

SafetensorsFile load_safetensors(const std::string& path) {
  // Read the header, validate it, then read each tensor straight into its storage: a large file
  // is never held twice in memory.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) user_error("safetensors file '{}' does not exist", path);
    user_error("cannot read safetensors file '{}': {}", path, std::strerror(err));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    user_error("safetensors file '{}' is not a regular file", path);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  auto read_at = [&](uint64_t offset, void* dst, uint64_t count) {
    char* p = static_cast<char*>(dst);
    while (count > 0) {
      const ssize_t got = ::pread(fd, p, count, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) user_error("cannot read safetensors file '{}': {}", path, std::strerror(errno));
      if (got == 0) corrupt(path, "truncated while it was being read");  // shrank under us
      p += got;
      offset += static_cast<uint64_t>(got);
      count -= static_cast<uint64_t>(got);
    }
  };
  if (size < 8)
    corrupt(path, "truncated to {} bytes (a safetensors file starts with an 8-byte header length)",
            size);
  char first8[8];
  read_at(0, first8, 8);
  const uint64_t n = check_header_length(first8, size, path);
  std::string text(n, '\0');
  read_at(8, text.data(), n);
  const Header header = parse_header(text, size - 8 - n, path);
  SafetensorsFile file;
  file.path = path;
  file.metadata = header.metadata;
  for (const Entry& e : header.entries) {
    Tensor t = Tensor::empty(e.dtype, Shape(e.shape));
    read_at(8 + n + e.begin, t.data(), t.nbytes());
    file.tensors.push_back({e.name, std::move(t)});
  }
  return file;
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
