// Corrupt safetensors files: each defect is refused with one message that names the file and
// what is wrong.
#include <gtest/gtest.h>

#include <filesystem>

#include "support/files.h"
#include "support/scratch.h"
#include "tandem/core/sha256.h"
#include "tandem/io/safetensors.h"

namespace tandem::io {
namespace {

using testing::ScratchDir;
using testing::user_error_of;

// A file with the given header text (padded to 8 with spaces) and data section.
std::string file_with(const std::string& header, const std::string& data) {
  std::string h = header;
  h.append((8 - h.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i, n >>= 8) out[static_cast<size_t>(i)] = static_cast<char>(n & 0xff);
  return out + h + data;
}

std::string parse_error(const std::string& header, const std::string& data) {
  return user_error_of([&] { parse_safetensors(file_with(header, data), "m.safetensors"); });
}

const std::string kPrefix = "corrupt safetensors file 'm.safetensors': ";

TEST(SafetensorsErrors, TooShortForTheLength) {
  EXPECT_EQ(
      user_error_of([] { parse_safetensors("abcde", "m.safetensors"); }),
      kPrefix + "truncated to 5 bytes (a safetensors file starts with an 8-byte header length)");
}

TEST(SafetensorsErrors, HeaderLengthBeyondTheFile) {
  std::string f = file_with(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "1234");
  f[1] = 1;  // length += 256
  EXPECT_EQ(user_error_of([&] { parse_safetensors(f, "m.safetensors"); }),
            kPrefix + "header length 312 reaches beyond the end of the file (68 bytes)");
  std::string huge(16, '\xff');  // 2^64 - 1: must not wrap around
  EXPECT_EQ(
      user_error_of([&] { parse_safetensors(huge, "m.safetensors"); }),
      kPrefix + "header length 18446744073709551615 reaches beyond the end of the file (16 bytes)");
}

TEST(SafetensorsErrors, HeaderIsNotJson) {
  const std::string m = parse_error(R"({"a": {"dtype": "F32",)", "");
  EXPECT_EQ(m.rfind(kPrefix + "header is not valid JSON: parse error at line 1, column ", 0), 0u)
      << m;
  EXPECT_EQ(parse_error(R"([1, 2])", ""), kPrefix + "header is not a JSON object");
  // Not UTF-8: the JSON parser refuses it.
  const std::string bad = parse_error("{\"\xff\":1}", "");
  EXPECT_EQ(bad.rfind(kPrefix + "header is not valid JSON: ", 0), 0u) << bad;
}

TEST(SafetensorsErrors, DuplicateNames) {
  EXPECT_EQ(parse_error(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                        R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                        std::string(8, '\0')),
            kPrefix + "tensor 'w' appears twice in the header");
  EXPECT_EQ(parse_error(R"({"w":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}})",
                        std::string(4, '\0')),
            kPrefix + "key 'dtype' appears twice in one object of the header");
}

TEST(SafetensorsErrors, UnknownDType) {
  EXPECT_EQ(parse_error(R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})",
                        std::string(8, '\0')),
            kPrefix + "tensor 'w': dtype 'F64' is not supported (tandem reads F32, BF16 and F16)");
  EXPECT_EQ(
      parse_error(R"({"w":{"dtype":"float32","shape":[1],"data_offsets":[0,4]}})",
                  std::string(4, '\0')),
      kPrefix + "tensor 'w': dtype 'float32' is not supported (tandem reads F32, BF16 and F16)");
  EXPECT_EQ(
      parse_error(R"({"w":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0')),
      kPrefix + "tensor 'w': 'dtype' must be a string");
}

TEST(SafetensorsErrors, SizeDisagreesWithDTypeAndShape) {
  EXPECT_EQ(parse_error(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,32]}})",
                        std::string(32, '\0')),
            kPrefix + "tensor 'w' has 32 bytes (data_offsets [0, 32]) but F32 [2, 3] needs 24");
  EXPECT_EQ(
      parse_error(R"({"w":{"dtype":"F16","shape":[4294967296,4294967296],"data_offsets":[0,0]}})",
                  ""),
      kPrefix + "tensor 'w': shape [4294967296, 4294967296] is too large");
}

TEST(SafetensorsErrors, OffsetsOutOfRange) {
  // The data section ends before the tensor does: the file was cut short.
  EXPECT_EQ(
      parse_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                  std::string(12, '\0')),
      kPrefix +
          "truncated: tensor 'b' ends at byte 16 of the data section, which has only 12 bytes");
  EXPECT_EQ(parse_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})",
                        std::string(8, '\0')),
            kPrefix +
                "tensor 'a': 'data_offsets' must be two non-negative integers [begin, end] with "
                "begin <= end");
  EXPECT_EQ(parse_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", ""),
            kPrefix +
                "tensor 'a': 'data_offsets' must be two non-negative integers [begin, end] with "
                "begin <= end");
  EXPECT_EQ(parse_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", ""),
            kPrefix +
                "tensor 'a': 'data_offsets' must be two non-negative integers [begin, end] with "
                "begin <= end");
}

TEST(SafetensorsErrors, OverlapsGapsAndTrailingBytes) {
  EXPECT_EQ(parse_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                        std::string(12, '\0')),
            kPrefix + "tensors 'a' (bytes [0, 8)) and 'b' (bytes [4, 12)) overlap");
  EXPECT_EQ(parse_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                        R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                        std::string(12, '\0')),
            kPrefix + "bytes [4, 8) of the data section belong to no tensor");
  EXPECT_EQ(parse_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                        std::string(8, '\0')),
            kPrefix + "bytes [0, 4) of the data section belong to no tensor");
  EXPECT_EQ(parse_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                        std::string(7, '\0')),
            kPrefix + "the last 3 bytes of the file belong to no tensor");
}

TEST(SafetensorsErrors, MalformedEntries) {
  EXPECT_EQ(parse_error(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", std::string(4, '\0')),
            kPrefix + "tensor 'a': 'shape' is missing");
  EXPECT_EQ(parse_error(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
                        std::string(4, '\0')),
            kPrefix + "tensor 'a': 'shape' must be a list of non-negative integers");
  EXPECT_EQ(parse_error(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})",
                        std::string(4, '\0')),
            kPrefix + "tensor 'a': 'shape' must be a list of non-negative integers");
  EXPECT_EQ(parse_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})",
                        std::string(4, '\0')),
            kPrefix + "tensor 'a': unexpected field 'x'");
  EXPECT_EQ(parse_error(R"({"a":[1]})", ""),
            kPrefix + "tensor 'a': its entry is not a JSON object");
  EXPECT_EQ(
      parse_error(R"({"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0')),
      kPrefix + "a tensor has an empty name");
  EXPECT_EQ(parse_error(R"({"__metadata__":{"step":3}})", ""),
            kPrefix + "'__metadata__' must map strings to strings ('step' does not)");
  EXPECT_EQ(parse_error(R"({"__metadata__":"pt"})", ""),
            kPrefix + "'__metadata__' must map strings to strings");
}

TEST(SafetensorsErrors, FilesOnDisk) {
  ScratchDir dir;
  const std::string path = dir.path("w.safetensors");
  EXPECT_EQ(user_error_of([&] { load_safetensors(path); }),
            "safetensors file '" + path + "' does not exist");
  EXPECT_EQ(user_error_of([&] { load_safetensors(dir.path()); }),
            "safetensors file '" + dir.path() + "' is not a regular file");

  // A good file cut short at every length: each is refused, none crashes.
  Tensor w = Tensor::zeros(DType::F32, Shape{4, 4});
  const std::string good =
      serialize_safetensors({{"w", w}, {"b", Tensor::zeros(DType::BF16, Shape{3})}});
  for (size_t len = 0; len < good.size(); ++len) {
    testing::write_bytes(path, good.substr(0, len));
    const std::string m = user_error_of([&] { load_safetensors(path); });
    EXPECT_EQ(m.rfind("corrupt safetensors file '" + path + "': ", 0), 0u) << len << ": " << m;
  }
  testing::write_bytes(path, good.substr(0, good.size() - 2));
  EXPECT_EQ(
      user_error_of([&] { load_safetensors(path); }),
      "corrupt safetensors file '" + path +
          "': truncated: tensor 'b' ends at byte 70 of the data section, which has only 68 bytes");
  testing::write_bytes(path, good);
  EXPECT_EQ(load_safetensors(path).tensors.size(), 2u);
}

TEST(SafetensorsErrors, HeaderLongerThanTheFormatAllows) {
  ScratchDir dir;
  const std::string path = dir.path("big.safetensors");
  const uint64_t n = 150'000'000;  // within the (sparse) file, over the 100 MB limit
  std::string first8(8, '\0');
  for (int i = 0; i < 8; ++i) first8[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
  testing::write_bytes(path, first8);
  std::filesystem::resize_file(path, 200'000'000);
  EXPECT_EQ(user_error_of([&] { load_safetensors(path); }),
            "corrupt safetensors file '" + path +
                "': header length 150000000 is over 100000000 bytes, the most the format allows");
}

// A header with checksums: `digests` (metadata JSON members, without the header's own), then the
// header's own computed over the result as the writer does, unless `own` is given.
std::string with_checksums(const std::string& digests, const std::string& tensors,
                           const std::string& data, const std::string& own = "") {
  const std::string zeros(64, '0');
  auto header = [&](const std::string& d) {
    return R"({"__metadata__":{)" + digests + R"("sha256-of-header":")" + d + R"("},)" + tensors +
           "}";
  };
  const std::string draft = file_with(header(zeros), "");
  return file_with(header(own.empty() ? sha256_hex(draft) : own), data);
}

TEST(SafetensorsErrors, ChecksumsIncompleteMalformedOrWrong) {
  const std::string a = R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  const std::string b = R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]})";
  const std::string data(8, '\0');
  const std::string zero4 = sha256_hex(std::string(4, '\0'));
  auto parse = [](const std::string& file) {
    return user_error_of([&] { parse_safetensors(file, "m.safetensors"); });
  };
  // Sound: both tensors have theirs.
  const std::string both = R"("sha256:a":")" + zero4 + R"(","sha256:b":")" + zero4 + R"(",)";
  EXPECT_EQ(parse_safetensors(with_checksums(both, a + "," + b, data), "m").tensors.size(), 2u);
  EXPECT_EQ(parse(with_checksums(R"("sha256:a":")" + zero4 + R"(",)", a + "," + b, data)),
            kPrefix + "tensor 'b' has no checksum");
  EXPECT_EQ(parse(with_checksums(both + R"("sha256:c":")" + zero4 + R"(",)", a + "," + b, data)),
            kPrefix + "a checksum is recorded for tensor 'c', which the file does not hold");
  EXPECT_EQ(parse(file_with(R"({"__metadata__":{"sha256:a":")" + zero4 + R"("},)" + a + "}",
                            data.substr(4))),
            kPrefix + "it records tensor checksums but not the header's ('sha256-of-header')");
  EXPECT_EQ(parse(with_checksums(R"("sha256:a":"ABC",)", a, data.substr(4))),
            kPrefix + "checksum 'sha256:a' is not 64 lowercase hex digits");
  EXPECT_EQ(parse(with_checksums(both, a + "," + b, data, std::string(64, 'f'))),
            kPrefix + "the header does not match its checksum: the file is damaged or was altered");
}

TEST(SafetensorsErrors, MissingTensorOrWrongShape) {
  const SafetensorsFile f =
      parse_safetensors(serialize_safetensors({{"wte", Tensor::zeros(DType::F32, Shape{256, 64})}}),
                        "ckpt/weights.safetensors");
  EXPECT_EQ(user_error_of([&] { f.get("wpe"); }), "'ckpt/weights.safetensors' has no tensor 'wpe'");
  EXPECT_EQ(user_error_of([&] {
              f.get("wte", Shape{256, 128});
            }),
            "tensor 'wte' in 'ckpt/weights.safetensors' has shape [256, 64]; this model needs "
            "[256, 128]");
}

}  // namespace
}  // namespace tandem::io
