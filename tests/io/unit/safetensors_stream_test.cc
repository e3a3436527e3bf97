// safetensors streamed: the writer's bytes equal the whole-file writer's, appended in pieces; the
// checksums are recorded (checked against digests computed independently) and verified, so a
// damaged or altered file is refused naming the tensor; files without checksums still load; the
// reader reads whole tensors, byte ranges and pieces; misuse is an internal error.
#include "tandem/io/safetensors_stream.h"

#include <gtest/gtest.h>

#include <cstring>

#include "support/files.h"
#include "support/scratch.h"
#include "tandem/core/error.h"
#include "tandem/core/sha256.h"

namespace tandem::io {
namespace {

using testing::ScratchDir;
using testing::user_error_of;

Tensor filled_ramp(DType t, Shape shape, float base) {
  Tensor x = Tensor::empty(t, std::move(shape));
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, base + static_cast<float>(i) * 0.25f);
  return x;
}

// Mixed dtypes, names out of order, an empty tensor and a scalar.
std::vector<NamedTensor> mixed_tensors() {
  return {{"h.1.w", filled_ramp(DType::F32, Shape{3, 5}, 1.0f)},
          {"h.0.w", filled_ramp(DType::F32, Shape{3, 5}, -1.0f)},
          {"b16", filled_ramp(DType::BF16, Shape{7}, 2.0f)},
          {"f16", filled_ramp(DType::F16, Shape{2, 2}, 0.5f)},
          {"empty", filled_ramp(DType::F32, Shape{0, 4}, 0.0f)},
          {"scalar", filled_ramp(DType::F32, Shape{}, 9.0f)}};
}

const Tensor& tensor_by_name(const std::vector<NamedTensor>& tensors, const std::string& name) {
  for (const NamedTensor& t : tensors)
    if (t.name == name) return t.tensor;
  throw std::runtime_error("no tensor " + name);
}

// The file streamed with pieces of at most `piece` bytes (each tensor split separately, or the
// whole data section as one stream when `across` is set).
std::string streamed(const std::vector<NamedTensor>& tensors, const SafetensorsMetadata& meta,
                     Checksums checksums, size_t piece, bool across) {
  std::string out;
  SafetensorsWriter w(&out, tensor_specs(tensors), meta, checksums);
  std::string data;
  for (const TensorSpec& spec : w.order()) {
    const Tensor& t = tensor_by_name(tensors, spec.name);
    data.append(static_cast<const char*>(t.data()), t.nbytes());
    if (!across) {
      for (size_t at = 0; at < data.size(); at += piece)
        w.append(data.data() + at, std::min(piece, data.size() - at));
      data.clear();
    }
  }
  for (size_t at = 0; at < data.size(); at += piece)
    w.append(data.data() + at, std::min(piece, data.size() - at));
  EXPECT_EQ(w.next(), w.order().size());
  w.commit();
  return out;
}

TEST(SafetensorsStream, BytesEqualTheWholeFileWriterInAnyPieces) {
  const auto tensors = mixed_tensors();
  const SafetensorsMetadata meta = {{"format", "pt"}};
  for (Checksums c : {Checksums::Record, Checksums::None}) {
    const std::string whole = serialize_safetensors(tensors, meta, c);
    for (size_t piece : {1, 3, 8, 1000})
      for (bool across : {false, true})
        EXPECT_EQ(streamed(tensors, meta, c, piece, across), whole) << piece << " " << across;
  }
  // The order: element size descending, then name; empty tensors in their place.
  std::string out;
  SafetensorsWriter w(&out, tensor_specs(tensors), meta);
  std::vector<std::string> names;
  for (const TensorSpec& s : w.order()) names.push_back(s.name);
  EXPECT_EQ(names, (std::vector<std::string>{"empty", "h.0.w", "h.1.w", "scalar", "b16", "f16"}));
}

TEST(SafetensorsStream, WritesIntoAFileAndAnAtomicFile) {
  ScratchDir dir;
  const auto tensors = mixed_tensors();
  const std::string want = serialize_safetensors(tensors, {{"k", "v"}});
  {
    SafetensorsWriter w(dir.path("a.safetensors"), tensor_specs(tensors), {{"k", "v"}});
    for (const TensorSpec& s : w.order()) {
      const Tensor& t = tensor_by_name(tensors, s.name);
      w.append(t.data(), t.nbytes());
    }
    ASSERT_EQ(dir.list().size(), 1u);  // only the temporary, until commit
    EXPECT_EQ(dir.list()[0].rfind(".a.safetensors.tmp-", 0), 0u);
    w.commit();
  }
  EXPECT_EQ(testing::read_bytes(dir.path("a.safetensors")), want);
  {
    AtomicFile f(dir.path("b.safetensors"));
    write_safetensors(f, tensors, {{"k", "v"}});
    f.commit();
  }
  EXPECT_EQ(testing::read_bytes(dir.path("b.safetensors")), want);
  save_safetensors(dir.path("c.safetensors"), tensors, {{"k", "v"}});
  EXPECT_EQ(testing::read_bytes(dir.path("c.safetensors")), want);
}

// The golden file of safetensors_test.cc with checksums; the digests were computed apart from
// tandem (Python's hashlib over the data bytes, and over the header with its own digit zeroed).
TEST(SafetensorsStream, RecordsChecksumsComputedIndependently) {
  Tensor a = Tensor::empty(DType::BF16, Shape{1, 2});
  a.set(0, 1.0f);
  a.set(1, 0.5f);
  Tensor c = Tensor::empty(DType::F16, Shape{});
  c.set(0, 1.0f);
  Tensor b = Tensor::empty(DType::F32, Shape{2});
  b.set(0, 1.0f);
  b.set(1, -2.0f);
  const std::string file =
      serialize_safetensors({{"a", a}, {"b", b}, {"c", c}}, {{"format", "pt"}});
  const std::string json =
      R"({"__metadata__":{"format":"pt",)"
      R"("sha256-of-header":"7f586900f88dcf2b848a6fa07c5ad94402c53435c607b97c1498f65944e2628a",)"
      R"("sha256:a":"79dadf3efff644cef71c594dbc423e42613e08fbcc9e67a9e32a4fd9cc8c5af5",)"
      R"("sha256:b":"ee4ac73c2bd27756ab82780f27c73a7bc4d3f0bb6acb37e008bc27eccd7e588b",)"
      R"("sha256:c":"505114fe537172ea35e17ca1a7516edac516a89b31f983f7c6387d5d2bb462aa"},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("a":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]},)"
      R"("c":{"dtype":"F16","shape":[],"data_offsets":[12,14]}})";
  ASSERT_EQ(json.size(), 516u);
  EXPECT_EQ(file.substr(0, 8), std::string("\x08\x02\0\0\0\0\0\0", 8));  // 520
  EXPECT_EQ(file.substr(8, 520), json + "    ");
  EXPECT_EQ(file.size(), 8u + 520u + 14u);

  const SafetensorsReader r = SafetensorsReader::in_memory(file, "golden");
  EXPECT_TRUE(r.has_checksums());
  EXPECT_EQ(r.metadata(), (SafetensorsMetadata{{"format", "pt"}}));  // checksum keys kept apart
  EXPECT_EQ(r.tensors()[0].sha256, sha256_hex(file.substr(528, 8)));
  EXPECT_EQ(r.read_tensor(r.index_of("b")).get(1), -2.0f);
}

// The file with byte `at` XORed with `mask`.
std::string flipped(std::string s, size_t at, char mask = 0x01) {
  s[at] = static_cast<char>(s[at] ^ mask);
  return s;
}

// The bytes of the header: the file without its data section.
size_t header_bytes(const std::string& file) {
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  return 8 + n;
}

TEST(SafetensorsStream, AFlippedDataByteIsRefusedNamingTheTensor) {
  ScratchDir dir;
  const auto tensors = mixed_tensors();
  const std::string good = serialize_safetensors(tensors);
  const SafetensorsReader probe = SafetensorsReader::in_memory(good, "x");
  const size_t data_start = header_bytes(good);
  for (const SafetensorsEntry& e : probe.tensors()) {
    if (e.nbytes() == 0) continue;
    const std::string bad = flipped(good, data_start + e.begin + e.nbytes() / 2);
    const std::string path = dir.path("w.safetensors");
    testing::write_bytes(path, bad);
    const std::string want = "tensor '" + e.name + "' in '" + path +
                             "' does not match its checksum: the file is damaged or was altered";
    EXPECT_EQ(user_error_of([&] { load_safetensors(path); }), want);
    // The header is sound: the reader opens, and only that tensor is refused.
    const SafetensorsReader r(path);
    for (size_t i = 0; i < r.tensors().size(); ++i) {
      if (r.tensors()[i].name == e.name) {
        EXPECT_EQ(user_error_of([&] { r.read_tensor(i); }), want);
      } else {
        EXPECT_NO_THROW(r.read_tensor(i));
      }
    }
    EXPECT_EQ(user_error_of([&] { parse_safetensors(bad, path); }), want);
  }
}

// The issue's scenario: two tensors of one shape with their data_offsets swapped in the header.
TEST(SafetensorsStream, SwappedOffsetsOfSameShapeTensorsAreRefused) {
  const auto tensors = mixed_tensors();
  const std::string first = R"("h.0.w":{"dtype":"F32","shape":[3,5],"data_offsets":[0,60]})";
  const std::string second = R"("h.1.w":{"dtype":"F32","shape":[3,5],"data_offsets":[60,120]})";
  const std::string first_swapped =
      R"("h.0.w":{"dtype":"F32","shape":[3,5],"data_offsets":[60,120]})";
  const std::string second_swapped =
      R"("h.1.w":{"dtype":"F32","shape":[3,5],"data_offsets":[0,60]})";
  for (Checksums c : {Checksums::Record, Checksums::None}) {
    std::string file = serialize_safetensors(tensors, {}, c);
    const size_t a = file.find(first), b = file.find(second);
    ASSERT_NE(a, std::string::npos);
    ASSERT_NE(b, std::string::npos);
    ASSERT_LT(a, b);
    file.replace(b, second.size(), second_swapped);  // the later one first: `a` stays valid
    file.replace(a, first.size(), first_swapped);
    if (c == Checksums::None) {
      // Without checksums the swap cannot be seen: the tensors load, exchanged.
      const SafetensorsFile f = parse_safetensors(file, "swapped");
      EXPECT_EQ(std::memcmp(f.get("h.0.w").data(), tensor_by_name(tensors, "h.1.w").data(), 60), 0);
    } else {
      EXPECT_EQ(user_error_of([&] { parse_safetensors(file, "swapped"); }),
                "corrupt safetensors file 'swapped': the header does not match its checksum: the "
                "file is damaged or was altered");
    }
  }
}

// The honest header over a data section with two same-shape tensors' bytes exchanged (what a
// header rewritten with its own checksum recomputed amounts to): each tensor's checksum catches
// it, naming the tensor.
TEST(SafetensorsStream, ExchangedDataUnderAnHonestHeaderIsRefused) {
  const auto tensors = mixed_tensors();
  std::string swapped;
  SafetensorsWriter w(&swapped, tensor_specs(tensors), {});
  for (const TensorSpec& s : w.order()) {
    const std::string name = s.name == "h.0.w" ? "h.1.w" : s.name == "h.1.w" ? "h.0.w" : s.name;
    const Tensor& t = tensor_by_name(tensors, name);
    w.append(t.data(), t.nbytes());
  }
  w.commit();
  const std::string honest = serialize_safetensors(tensors);
  const size_t n = header_bytes(honest);
  ASSERT_EQ(header_bytes(swapped), n);
  const std::string forged = honest.substr(0, n) + swapped.substr(n);
  ASSERT_NE(forged, honest);
  const SafetensorsReader r = SafetensorsReader::in_memory(forged, "forged");
  for (const char* name : {"h.0.w", "h.1.w"})
    EXPECT_EQ(user_error_of([&] { r.read_tensor(r.index_of(name)); }),
              "tensor '" + std::string(name) +
                  "' in 'forged' does not match its checksum: the file is damaged or was altered");
  EXPECT_NO_THROW(r.read_tensor(r.index_of("b16")));
}

TEST(SafetensorsStream, FilesWithoutChecksumsStillLoad) {
  ScratchDir dir;
  const auto tensors = mixed_tensors();
  save_safetensors(dir.path("old.safetensors"), tensors, {{"format", "pt"}}, Checksums::None);
  const SafetensorsReader r(dir.path("old.safetensors"));
  EXPECT_FALSE(r.has_checksums());
  for (const SafetensorsEntry& e : r.tensors()) EXPECT_EQ(e.sha256, "");
  const SafetensorsFile f = load_safetensors(dir.path("old.safetensors"));
  EXPECT_EQ(f.metadata, (SafetensorsMetadata{{"format", "pt"}}));
  for (const NamedTensor& t : tensors)
    EXPECT_EQ(std::memcmp(f.get(t.name).data(), t.tensor.data(), t.tensor.nbytes()), 0);
}

TEST(SafetensorsStream, ChecksumsAreAllOrNone) {
  std::string file = serialize_safetensors(mixed_tensors());
  // A tensor's checksum key renamed to a tensor the file does not hold: the header's own
  // checksum fails first.
  const size_t at = file.find("\"sha256:scalar\"");
  ASSERT_NE(at, std::string::npos);
  EXPECT_EQ(user_error_of([&] { parse_safetensors(flipped(file, at + 8, 0x20), "m"); }),
            "corrupt safetensors file 'm': the header does not match its checksum: the file is "
            "damaged or was altered");
  // A checksum that is not hex.
  const size_t digit = file.find("\"sha256:b16\":\"") + 14;
  std::string bad = file;
  bad[digit] = 'X';
  EXPECT_EQ(user_error_of([&] { parse_safetensors(bad, "m"); }),
            "corrupt safetensors file 'm': checksum 'sha256:b16' is not 64 lowercase hex digits");
}

TEST(SafetensorsStream, ReadsRangesAndPieces) {
  ScratchDir dir;
  const auto tensors = mixed_tensors();
  save_safetensors(dir.path("t.safetensors"), tensors);
  const SafetensorsReader r(dir.path("t.safetensors"));
  const size_t i = r.index_of("h.1.w", Shape{3, 5});
  const Tensor& want = tensor_by_name(tensors, "h.1.w");
  const char* bytes = static_cast<const char*>(want.data());
  // Row 1 of 3 (a rank's shard of the rows).
  char row[20];
  r.read_range(i, 20, 40, row);
  EXPECT_EQ(std::memcmp(row, bytes + 20, 20), 0);
  r.read_range(i, 60, 60, row);  // empty: nothing read
  // In pieces of 7 bytes through a small buffer, verified at the end.
  char buffer[7];
  std::string got;
  uint64_t expect_offset = 0;
  r.read_in_pieces(i, buffer, sizeof buffer, [&](const void* p, uint64_t offset, size_t n) {
    EXPECT_EQ(offset, expect_offset);
    expect_offset += n;
    got.append(static_cast<const char*>(p), n);
  });
  EXPECT_EQ(got, std::string(bytes, 60));
  // A whole read into the caller's memory.
  std::vector<float> into(15);
  r.read(i, into.data(), 60);
  EXPECT_EQ(into[14], want.get(14));
  EXPECT_EQ(user_error_of([&] {
              r.index_of("h.1.w", Shape{5, 3});
            }),
            "tensor 'h.1.w' in '" + dir.path("t.safetensors") +
                "' has shape [3, 5]; this model needs [5, 3]");
  EXPECT_EQ(user_error_of([&] { r.index_of("nope"); }),
            "'" + dir.path("t.safetensors") + "' has no tensor 'nope'");

  // Pieces of a damaged tensor: all handed over, then the mismatch.
  std::string file = testing::read_bytes(dir.path("t.safetensors"));
  file[file.size() - 1] ^= 1;  // the last byte: f16's
  const SafetensorsReader d = SafetensorsReader::in_memory(file, "d");
  size_t seen = 0;
  EXPECT_EQ(user_error_of([&] {
              d.read_in_pieces(d.index_of("f16"), buffer, sizeof buffer,
                               [&](const void*, uint64_t, size_t n) { seen += n; });
            }),
            "tensor 'f16' in 'd' does not match its checksum: the file is damaged or was altered");
  EXPECT_EQ(seen, 8u);
}

TEST(SafetensorsStream, MisuseIsAnInternalError) {
  const auto tensors = mixed_tensors();
  const auto specs = tensor_specs(tensors);
  {
    std::string out;
    SafetensorsWriter w(&out, specs);
    EXPECT_THROW(w.commit(), InternalError);  // nothing appended
  }
  {
    std::string out;
    SafetensorsWriter w(&out, specs);
    std::string all;
    for (const TensorSpec& s : w.order()) all += std::string(s.nbytes(), 'x');
    w.append(all.data(), all.size() - 1);
    EXPECT_EQ(w.next(), w.order().size() - 1);
    EXPECT_EQ(w.next_offset(), w.order().back().nbytes() - 1);
    EXPECT_THROW(w.commit(), InternalError);               // one byte short
    EXPECT_THROW(w.append(all.data(), 2), InternalError);  // one byte too many
  }
  {
    std::string out;
    SafetensorsWriter w(&out, specs);
    std::string all;
    for (const TensorSpec& s : w.order()) all += std::string(s.nbytes(), 'x');
    w.append(all.data(), all.size());
    w.commit();
    EXPECT_THROW(w.append("x", 1), InternalError);
    EXPECT_THROW(w.commit(), InternalError);
  }
  std::string out;
  EXPECT_THROW(SafetensorsWriter(&out, {{"a", DType::F32, Shape{1}}, {"a", DType::F32, Shape{1}}}),
               InternalError);
  EXPECT_THROW(SafetensorsWriter(&out, {{"__metadata__", DType::F32, Shape{1}}}), InternalError);
  EXPECT_THROW(SafetensorsWriter(&out, {}, {{"sha256:a", "x"}}), InternalError);
  EXPECT_THROW(SafetensorsWriter(&out, {}, {{"sha256-of-header", "x"}}), InternalError);
}

// A writer abandoned before commit leaves no file and the previous one unchanged.
TEST(SafetensorsStream, AnAbandonedWriterLeavesThePreviousFile) {
  ScratchDir dir;
  const std::string path = dir.path("w.safetensors");
  save_safetensors(path, mixed_tensors());
  const std::string before = testing::read_bytes(path);
  {
    SafetensorsWriter w(path, {{"x", DType::F32, Shape{4}}});
    w.append("abcd", 4);
  }
  EXPECT_EQ(testing::read_bytes(path), before);
  EXPECT_EQ(dir.list(), std::vector<std::string>{"w.safetensors"});
}

}  // namespace
}  // namespace tandem::io
