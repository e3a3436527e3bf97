// Hostile JSON in every file io reads: nested 100 000 deep (which overflowed the stack of a
// recursive walk, dump() or a copy, while the message was made) or with a field of the wrong type
// gives one UserError naming the file and the field, never a signal or nlohmann's own text.
#include <gtest/gtest.h>

#include "support/files.h"
#include "support/scratch.h"
#include "tandem/io/checkpoint.h"
#include "tandem/io/hf_folder.h"
#include "tandem/io/json_file.h"

namespace tandem::io {
namespace {

using nlohmann::json;
using testing::ScratchDir;
using testing::user_error_of;

namespace hostile_json_error_test {

// `[[[...1...]]]`, `depth` deep.
std::string nested_array(size_t depth) {
  return std::string(depth, '[') + "1" + std::string(depth, ']');
}

// An object whose member `key` is nested `depth` deep.
std::string nested_member(const std::string& key, size_t depth) {
  return "{\"" + key + "\": " + nested_array(depth) + "}";
}

void save_checkpoint_in(const std::string& dir) {
  Checkpoint c;
  c.meta.model_config = {{"d_model", 256}};
  c.meta.step = 7;
  c.meta.optimizer = "adamw";
  c.weights = {{"wte", Tensor::zeros(DType::F32, Shape{4, 4})}};
  c.optimizer = {{"m.wte", Tensor::zeros(DType::F32, Shape{4, 4})}};
  save_checkpoint(dir, c);
}

}  // namespace hostile_json_error_test

using namespace hostile_json_error_test;

TEST(HostileJson, NestingPastTheLimitIsRefusedNamingTheFile) {
  EXPECT_EQ(user_error_of([] { parse_json(nested_array(100000), "file 'x.json'"); }),
            "file 'x.json' nests arrays and objects more than 64 deep: it is not a file tandem "
            "reads");
  EXPECT_EQ(user_error_of([] { parse_json(nested_member("a", 65), "f"); }),
            "f nests arrays and objects more than 64 deep: it is not a file tandem reads");
  // At the limit, read.
  EXPECT_EQ(parse_json(nested_array(64), "f").dump().size(), 129u);
  EXPECT_EQ(
      user_error_of([] { parse_ordered_json(nested_array(100000), "f"); }).rfind("f nests", 0), 0u);
}

TEST(HostileJson, NotJsonNamesTheFileWithoutTheLibrarysPrefix) {
  const std::string m = user_error_of([] { parse_json("{\"a\": ", "config 'c.json'"); });
  EXPECT_EQ(m.rfind("config 'c.json' is not valid JSON: parse error at line 1", 0), 0u) << m;
  EXPECT_EQ(m.find("[json.exception"), std::string::npos) << m;
}

TEST(HostileJson, TypedFieldsNameTheFieldAndTheType) {
  const json j = json::parse(R"({"n": "3", "big": 3000000000, "a": [1, 2, 3], "s": 1.5,
                                  "o": {"deep": {"x": 1}}})");
  EXPECT_EQ(user_error_of([&] { json_int(j["n"], "F", "n"); }),
            "F: 'n' must be an integer (it is \"3\")");
  EXPECT_EQ(user_error_of([&] { json_int(j["big"], "F", "big", 1, INT32_MAX); }),
            "F: 'big' must be an integer from 1 to 2147483647 (it is 3000000000)");
  EXPECT_EQ(user_error_of([&] { json_string(j["a"], "F", "a"); }),
            "F: 'a' must be a string (it is an array of 3)");
  EXPECT_EQ(user_error_of([&] { json_u64(j["s"], "F", "s"); }),
            "F: 's' must be a non-negative integer (it is 1.5)");
  EXPECT_EQ(user_error_of([&] { json_array(j["o"], "F", "o"); }),
            "F: 'o' must be an array (it is an object of 1 member)");
  EXPECT_EQ(user_error_of([&] { json_member(j["o"]["deep"], "y", "F", "o.deep.y"); }),
            "F has no 'o.deep.y'");
  EXPECT_EQ(user_error_of([&] { json_member(j["a"], "y", "F", "a.y"); }),
            "F: 'a' must be a JSON object (it is an array of 3)");
  std::string long_text;
  for (int i = 0; i < 25; ++i) long_text += "0123456789";
  EXPECT_EQ(user_error_of([&] { json_bool(json(long_text), "F", "long"); }),
            "F: 'long' must be true or false (it is \"" + long_text.substr(0, 200) + "\"...)");
}

TEST(HostileJson, EntriesNamingFilesStayInTheirFolder) {
  EXPECT_EQ(file_in_folder("d", "a.bin", "index 'd/i.json'", "files[0]"), "d/a.bin");
  for (const std::string bad : {"../a.bin", "/etc/passwd", "..", ".", "", "sub/a.bin"})
    EXPECT_EQ(user_error_of([&] { file_in_folder("d", bad, "index 'd/i.json'", "files[0]"); }),
              "index 'd/i.json': 'files[0]' names '" + bad +
                  "', which is not a file in its folder (an entry is a plain file name, without "
                  "'/' or '..': it may not reach outside the folder)");
}

TEST(HostileJson, CheckpointMetadata) {
  ScratchDir dir;
  const std::string ck = dir.path("ckpt");
  save_checkpoint_in(ck);
  testing::write_bytes(ck + "/meta.json", nested_array(100000));
  EXPECT_EQ(user_error_of([&] { load_checkpoint(ck); }),
            "checkpoint metadata '" + ck +
                "/meta.json' nests arrays and objects more than 64 deep: it is not a file tandem "
                "reads");
  // A deep value (within the limit) where an object belongs: the message gives its kind, never
  // the value.
  save_checkpoint_in(ck);
  std::string text = read_file(ck + "/meta.json");
  const size_t at = text.find("\"model\":");
  ASSERT_NE(at, std::string::npos);
  text.insert(at + 8, nested_array(60) + ", \"unused\":");
  testing::write_bytes(ck + "/meta.json", text);
  EXPECT_EQ(user_error_of([&] { load_checkpoint(ck); }),
            "invalid checkpoint metadata '" + ck +
                "/meta.json': 'model' must be a JSON object (it is an array of 1)");
}

TEST(HostileJson, HuggingFaceConfig) {
  ScratchDir dir;
  testing::write_bytes(dir.path("config.json"), nested_member("n_layer", 100000));
  EXPECT_EQ(user_error_of([&] { read_hf_config(dir.path("config.json")); }),
            "Hugging Face model config '" + dir.path("config.json") +
                "' nests arrays and objects more than 64 deep: it is not a file tandem reads");
  testing::write_bytes(dir.path("config.json"), nested_member("n_layer", 60));
  const std::string m = user_error_of([&] { read_hf_config(dir.path("config.json")); });
  EXPECT_LT(m.size(), 300u) << m;
  EXPECT_NE(m.find(dir.path("config.json")), std::string::npos) << m;
}

}  // namespace
}  // namespace tandem::io
