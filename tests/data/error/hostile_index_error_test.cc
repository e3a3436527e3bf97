// Hostile shards.json and tokenizer.json files: nested 100 000 deep, fields of the wrong type or
// past 32 bits, and entries naming files outside the folder; each gives one UserError naming the
// file and the field, never a signal, and no file outside the folder is read. And a link planted
// where tokenize writes its output folder is refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "tandem/data/token_corpus.h"
#include "tandem/data/tokenize.h"
#include "tandem/data/tokenizer.h"
#include "train/hf_tokenizer_test_util.h"
#include "train/token_test_util.h"

namespace tandem::data {
namespace {

using testing::ScratchDir;
using testing::user_error_of;
namespace fs = std::filesystem;

namespace hostile_index_error_test {

std::string deep(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

class HostileIndex : public ::testing::Test {
 protected:
  void SetUp() override {
    train::testing::write_corpus(dir_);
    tokenize(train::testing::tiny_tokenize(dir_, "shards"));
    index_ = nlohmann::json::parse(testing::read_bytes(path()));
  }
  std::string path() const { return dir_.path("shards/shards.json"); }
  std::string prefix() const { return "shard index '" + path() + "'"; }
  // shards.json with `change` made, then the message loading it gives.
  std::string refusal(const std::function<void(nlohmann::json&)>& change) {
    nlohmann::json j = index_;
    change(j);
    testing::write_bytes(path(), j.dump());
    return user_error_of([&] { load_shard_corpus(dir_.path("shards")); });
  }
  ScratchDir dir_;
  nlohmann::json index_;
};

}  // namespace hostile_index_error_test

using hostile_index_error_test::deep;
using hostile_index_error_test::HostileIndex;

TEST_F(HostileIndex, DeeplyNested) {
  testing::write_bytes(path(), deep(100000));
  EXPECT_EQ(
      user_error_of([&] { load_shard_corpus(dir_.path("shards")); }),
      prefix() + " nests arrays and objects more than 64 deep: it is not a file tandem reads");
  testing::write_bytes(path(), "{\"version\": " + deep(100000) + "}");
  EXPECT_EQ(
      user_error_of([&] { data_vocab_size(dir_.path("shards")); }),
      prefix() + " nests arrays and objects more than 64 deep: it is not a file tandem reads");
}

TEST_F(HostileIndex, WronglyTypedFieldsNameTheField) {
  EXPECT_EQ(refusal([](auto& j) { j["version"] = "1"; }),
            prefix() + ": 'version' must be an integer (it is \"1\")");
  EXPECT_EQ(refusal([](auto& j) { j["vocab_size"] = 3000000000u; }),
            prefix() + ": 'vocab_size' must be an integer from 1 to 2147483647 (it is 3000000000)");
  EXPECT_EQ(refusal([](auto& j) { j["train"] = nlohmann::json::array({1}); }),
            prefix() + ": 'train' must be a JSON object (it is an array of 1)");
  EXPECT_EQ(
      refusal([](auto& j) { j["train"]["shards"][0]["tokens"] = "many"; }),
      prefix() + ": 'train.shards[0].tokens' must be a non-negative integer (it is \"many\")");
  EXPECT_EQ(refusal([](auto& j) { j["validation"]["shards"] = 7; }),
            prefix() + ": 'validation.shards' must be an array (it is 7)");
  EXPECT_EQ(refusal([](auto& j) { j["validation"]["text_bytes"] = nlohmann::json::object(); }),
            prefix() +
                ": 'validation.text_bytes' must be a non-negative integer (it is an object of 0 "
                "members)");
  EXPECT_EQ(refusal([](auto& j) { j["validation"]["text_bytes"] = 0; }),
            prefix() + ": 'validation.text_bytes' is 0 but the validation split holds " +
                std::to_string(index_["validation"]["tokens"].get<uint64_t>()) +
                " tokens: they came from some text");
  EXPECT_EQ(refusal([](auto& j) { j["validation"].erase("text_bytes"); }),
            prefix() + ": 'validation.text_bytes' is missing but the validation split holds " +
                std::to_string(index_["validation"]["tokens"].get<uint64_t>()) +
                " tokens: they came from some text");
  EXPECT_EQ(refusal([](auto& j) { j["tokenizer_sha256"] = 5; }),
            prefix() + ": 'tokenizer_sha256' must be a string (it is 5)");
}

TEST_F(HostileIndex, EntriesMayNotLeaveTheFolder) {
  // A shard outside the folder, valid in itself: refused for where it is, not read.
  fs::copy_file(dir_.path("shards/train-000000.bin"), dir_.path("outside.bin"));
  const std::string tail =
      "', which is not a file in its folder (an entry is a plain file name, without '/' or '..': "
      "it may not reach outside the folder)";
  EXPECT_EQ(refusal([](auto& j) { j["train"]["shards"][0]["file"] = "../outside.bin"; }),
            prefix() + ": 'train.shards[0].file' names '../outside.bin" + tail);
  const std::string absolute = dir_.path("outside.bin");
  EXPECT_EQ(refusal([&](auto& j) { j["train"]["shards"][0]["file"] = absolute; }),
            prefix() + ": 'train.shards[0].file' names '" + absolute + tail);
  EXPECT_EQ(refusal([](auto& j) { j["tokenizer"] = "../corpus/a.txt"; }),
            prefix() + ": 'tokenizer' names '../corpus/a.txt" + tail);
}

TEST(HostileTokenizer, DeeplyNestedOrWronglyTyped) {
  ScratchDir dir;
  const std::string path = dir.path("tokenizer.json");
  testing::write_bytes(path, "{\"model\": " + deep(100000) + "}");
  EXPECT_EQ(user_error_of([&] { Tokenizer::load(path); }),
            "tokenizer '" + path +
                "' nests arrays and objects more than 64 deep: it is not a file tandem reads");
  nlohmann::json j = train::testing::test_tokenizer_json();
  j["added_tokens"] = {{{"id", "0"}, {"content", "<|endoftext|>"}, {"special", true}}};
  train::testing::write_tokenizer(dir, j);
  EXPECT_EQ(user_error_of([&] { Tokenizer::load(path); }),
            "tokenizer '" + path + "': 'added_tokens[0].id' must be an integer (it is \"0\")");
  j["added_tokens"] = {{{"id", 0}, {"content", "<|endoftext|>"}, {"special", "yes"}}};
  train::testing::write_tokenizer(dir, j);
  EXPECT_EQ(
      user_error_of([&] { Tokenizer::load(path); }),
      "tokenizer '" + path + "': 'added_tokens[0].special' must be true or false (it is \"yes\")");
  j = train::testing::test_tokenizer_json();
  j["model"]["vocab"]["a"] = 1.5;
  train::testing::write_tokenizer(dir, j);
  EXPECT_EQ(user_error_of([&] { Tokenizer::load(path); }),
            "tokenizer '" + path + "': 'model.vocab[\"a\"]' must be an integer (it is 1.5)");
}

TEST(HostileTokenizeOutput, AnOutputFolderThatIsALinkIsRefused) {
  ScratchDir dir;
  train::testing::write_corpus(dir);
  fs::create_directories(dir.path("elsewhere"));
  fs::create_directory_symlink(dir.path("elsewhere"), dir.path("shards"));
  EXPECT_EQ(user_error_of([&] { tokenize(train::testing::tiny_tokenize(dir, "shards")); }),
            "output folder '" + dir.path("shards") +
                "' is a symbolic link: tandem does not write through links (remove it, or give "
                "another path)");
  EXPECT_TRUE(fs::is_empty(dir.path("elsewhere")));
}

}  // namespace
}  // namespace tandem::data
