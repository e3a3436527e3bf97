// The safetensors header, built and validated: the one implementation behind the streaming writer
// and reader (safetensors_stream.h) and the whole-file functions (safetensors.h).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/io/safetensors.h"

namespace tandem::io::safetensors_format {

// The checksum keys of "__metadata__" (safetensors.h says what they cover).
inline constexpr std::string_view kTensorChecksumPrefix = "sha256:";
inline constexpr std::string_view kHeaderChecksumKey = "sha256-of-header";
inline constexpr size_t kDigestChars = 64;
// The longest header a file may have (the reference implementation's limit).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

template <typename... Args>
[[noreturn]] void corrupt(const std::string& path, fmt::format_string<Args...> f, Args&&... args) {
  user_error("corrupt safetensors file '{}': {}", path,
             fmt::format(f, std::forward<Args>(args)...));
}

// Checks what a writer is given: names unique, non-empty and not "__metadata__", and no metadata
// key the checksums use. A violation is the caller's bug (an internal error).
void check_specs(const std::vector<TensorSpec>& tensors, const SafetensorsMetadata& metadata);

// The first 8 + N bytes of the file for tensors `order` (in safetensors_order) and their
// checksums `digests`, one per tensor (empty: no checksums); with checksums, the header's own is
// computed here. Digests of a fixed width give a header of a fixed length.
std::string build_header(const std::vector<TensorSpec>& order, const SafetensorsMetadata& metadata,
                         const std::vector<std::string>& digests);

struct ParsedHeader {
  std::vector<SafetensorsEntry> entries;  // in data-offset order
  SafetensorsMetadata metadata;           // without the checksum keys
  bool has_checksums = false;
};

// The header length the first 8 bytes give, checked against the file size and kMaxHeaderBytes.
uint64_t check_header_length(const char* first8, uint64_t file_size, const std::string& path);

// Validates the JSON header `text` (N bytes) against a data section of `data_size` bytes, and its
// checksum when it has one.
ParsedHeader parse_header(std::string_view text, uint64_t data_size, const std::string& path);

}  // namespace tandem::io::safetensors_format
