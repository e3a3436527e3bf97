// safetensors: byte-exact output (a hand-built golden file and the reference implementation's own
// test vectors), round trips through memory and disk, and readers of other writers' layouts.
#include "tandem/io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>

#include "support/files.h"
#include "support/scratch.h"

namespace tandem::io {
namespace {

using testing::ScratchDir;

Tensor f32_tensor(Shape shape, std::initializer_list<float> values) {
  Tensor t = Tensor::empty(DType::F32, std::move(shape));
  int64_t i = 0;
  for (float v : values) t.set(i++, v);
  return t;
}

std::string bytes_of(std::initializer_list<int> bytes) {
  std::string s;
  for (int b : bytes) s.push_back(static_cast<char>(b));
  return s;
}

TEST(Safetensors, GoldenFileBuiltByHand) {
  Tensor a = Tensor::empty(DType::BF16, Shape{1, 2});
  a.set(0, 1.0f);
  a.set(1, 0.5f);
  Tensor c = Tensor::empty(DType::F16, Shape{});
  c.set(0, 1.0f);
  const std::vector<NamedTensor> tensors = {
      {"a", a}, {"b", f32_tensor(Shape{2}, {1.0f, -2.0f})}, {"c", c}};
  // F32 first, then BF16, then F16 (element size descending); "__metadata__" leads the header.
  const std::string json = R"({"__metadata__":{"format":"pt"},)"
                           R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("a":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]},)"
                           R"("c":{"dtype":"F16","shape":[],"data_offsets":[12,14]}})";
  ASSERT_EQ(json.size(), 196u);
  const std::string golden = bytes_of({200, 0, 0, 0, 0, 0, 0, 0}) + json +
                             "    " +  // 196 + 4 = 200
                             bytes_of({0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0}) +  // 1, -2
                             bytes_of({0x80, 0x3f, 0x00, 0x3f}) +  // bf16 1, 0.5
                             bytes_of({0x00, 0x3c});               // f16 1
  EXPECT_EQ(serialize_safetensors(tensors, {{"format", "pt"}}, Checksums::None), golden);

  const SafetensorsFile back = parse_safetensors(golden, "golden");
  ASSERT_EQ(back.tensors.size(), 3u);
  EXPECT_EQ(back.tensors[0].name, "b");
  EXPECT_EQ(back.tensors[1].name, "a");
  EXPECT_EQ(back.tensors[2].name, "c");
  EXPECT_EQ(back.get("b").get(1), -2.0f);
  EXPECT_EQ(back.get("a").dtype(), DType::BF16);
  EXPECT_EQ(back.get("a").get(1), 0.5f);
  EXPECT_EQ(back.get("c").shape(), Shape{});
  EXPECT_EQ(back.get("c").get(0), 1.0f);
  EXPECT_EQ(back.metadata, (SafetensorsMetadata{{"format", "pt"}}));
}

// The byte arrays the reference (Rust) implementation's own tests expect from its serializer
// (which records no checksums).
TEST(Safetensors, MatchesTheReferenceImplementationsTestVectors) {
  Tensor t = f32_tensor(Shape{1, 2, 3}, {0, 1, 2, 3, 4, 5});
  EXPECT_EQ(serialize_safetensors({{"attn.0", t}}, {}, Checksums::None),
            bytes_of({64, 0, 0, 0, 0, 0, 0, 0}) +
                R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})" +
                bytes_of({0, 0, 0,  0,  0, 0, 128, 63, 0, 0, 0,   64,
                          0, 0, 64, 64, 0, 0, 128, 64, 0, 0, 160, 64}));
  EXPECT_EQ(serialize_safetensors({{"attn0", t.reshape(Shape{1, 1, 2, 3})}}, {}, Checksums::None),
            bytes_of({72, 0, 0, 0, 0, 0, 0, 0}) +
                R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}})" + "       " +
                bytes_of({0, 0, 0,  0,  0, 0, 128, 63, 0, 0, 0,   64,
                          0, 0, 64, 64, 0, 0, 128, 64, 0, 0, 160, 64}));
  EXPECT_EQ(serialize_safetensors({}, {}, Checksums::None),
            bytes_of({8, 0, 0, 0, 0, 0, 0, 0}) + "{}      ");
  EXPECT_EQ(
      serialize_safetensors({}, {{"framework", "pt"}}, Checksums::None),
      bytes_of({40, 0, 0, 0, 0, 0, 0, 0}) + R"({"__metadata__":{"framework":"pt"}})" + "     ");
}

TEST(Safetensors, HeaderIsPaddedWithSpacesToEightBytes) {
  for (size_t len = 1; len <= 9; ++len) {
    const std::string name(len, 'w');
    const std::string header = safetensors_header({{name, Tensor::zeros(DType::F32, Shape{1})}});
    EXPECT_EQ(header.size() % 8, 0u) << name;
    uint64_t n = 0;
    std::memcpy(&n, header.data(), 8);
    EXPECT_EQ(n + 8, header.size());
    const size_t close = header.rfind('}');
    EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos);
    EXPECT_LT(header.size() - 1 - close, 8u);
  }
}

TEST(Safetensors, RoundTripsEveryDTypeThroughAFile) {
  ScratchDir dir;
  std::vector<NamedTensor> tensors;
  int k = 0;
  for (DType t : kAllDTypes)
    for (const Shape& shape : {Shape{}, Shape{0}, Shape{7}, Shape{3, 5}, Shape{2, 0, 4}}) {
      Tensor x = Tensor::empty(t, shape);
      for (int64_t i = 0; i < x.numel(); ++i) x.set(i, static_cast<float>(i * 3 - 7) * 0.25f);
      tensors.push_back({fmt::format("h.{}.{}", k++, dtype_name(t)), x});
    }
  const SafetensorsMetadata meta = {{"format", "pt"}, {"note", "ünïcödé \"quoted\"\n"}};
  const std::string path = dir.path("t.safetensors");
  save_safetensors(path, tensors, meta);
  EXPECT_EQ(testing::read_bytes(path), serialize_safetensors(tensors, meta));

  for (const SafetensorsFile& back :
       {load_safetensors(path), parse_safetensors(testing::read_bytes(path), path)}) {
    EXPECT_EQ(back.path, path);
    EXPECT_EQ(back.metadata, meta);
    ASSERT_EQ(back.tensors.size(), tensors.size());
    for (const NamedTensor& want : tensors) {
      const Tensor& got = back.get(want.name, want.tensor.shape());
      EXPECT_EQ(got.dtype(), want.tensor.dtype()) << want.name;
      ASSERT_EQ(got.nbytes(), want.tensor.nbytes()) << want.name;
      EXPECT_EQ(std::memcmp(got.data(), want.tensor.data(), got.nbytes()), 0) << want.name;
      EXPECT_TRUE(got.owning());
    }
  }
}

TEST(Safetensors, ReadsTensorsListedInAnyOrder) {
  // Other writers list tensors by name, not by offset; the reader must not care.
  const std::string json = R"({"z":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                           R"("a":{"shape":[2],"data_offsets":[4,8],"dtype":"F16"}})";
  std::string file = bytes_of({static_cast<int>(json.size()), 0, 0, 0, 0, 0, 0, 0}) + json;
  file += bytes_of({0, 0, 0x40, 0x40, 0x00, 0x3c, 0x00, 0xc0});  // 3.0f; f16 1, -2
  const SafetensorsFile f = parse_safetensors(file, "other-writer");
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors[0].name, "z");  // offset order
  EXPECT_EQ(f.get("z").get(0), 3.0f);
  EXPECT_EQ(f.get("a").get(1), -2.0f);
  EXPECT_TRUE(f.metadata.empty());
  EXPECT_EQ(f.find("missing"), nullptr);
}

TEST(Safetensors, WritesViewsOfForeignMemory) {
  float data[4] = {1, 2, 3, 4};
  Tensor v = Tensor::view_of(data, DType::F32, Shape{2, 2});
  const SafetensorsFile f = parse_safetensors(serialize_safetensors({{"w", v}}), "view");
  EXPECT_EQ(f.get("w").get(3), 4.0f);
}

}  // namespace
}  // namespace tandem::io
