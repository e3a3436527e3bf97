// Every JSON file tandem reads, through the reader a user's file goes through, given the hostile
// edits of support/json_mutations.h (each value nested thousands deep, oversized, of every other
// type): each mutant is read or refused with one short UserError naming the file, never a crash,
// another exception or the JSON library's text. The readers: a checkpoint's meta.json (--resume,
// eval), a token folder's shards.json, tokenizer.json, the config.json of a Hugging Face folder
// (GPT-2 and Llama) and its weights index, the header of a safetensors file, the tuner's records
// and the out-of-core profiles. (The JSON the ranks send each other, src/train/settings.cc and
// grid_plan.cc, is tandem's own and never read from a file.) The unit label runs it under ASan.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "support/json_mutations.h"
#include "tandem/data/token_corpus.h"
#include "tandem/data/tokenize.h"
#include "tandem/data/tokenizer.h"
#include "tandem/io/hf_folder.h"
#include "tandem/io/safetensors.h"
#include "tandem/io/safetensors_stream.h"
#include "tandem/ooc/profile.h"
#include "tandem/train/model_config.h"
#include "tandem/tune/cache.h"
#include "train/hf_tokenizer_test_util.h"
#include "train/test_util.h"
#include "train/token_test_util.h"

namespace tandem::train {
namespace {

using tandem::testing::check_json_mutants;
using tandem::testing::json_mutants;
using testing::read_bytes;
using testing::ScratchDir;
using testing::write_bytes;
namespace fs = std::filesystem;

// Both outcomes must occur: a reader that refused everything would check nothing it reads.
void expect_both(const tandem::testing::JsonMutationCounts& c, const std::string& reader) {
  EXPECT_GT(c.refused, 0) << reader;
  EXPECT_GT(c.read, 0) << reader;
}

TEST(JsonReadersMutation, CheckpointMetadata) {
  ScratchDir dir;
  TrainConfig c = testing::tiny_run(1);
  c.save_dir = dir.path("ck");
  train(c);
  const std::string ck = io::resolve_checkpoint(c.save_dir);
  const std::string meta = ck + "/meta.json";
  const std::string valid = read_bytes(meta);
  TrainConfig resume = c;
  resume.save_dir.clear();
  resume.resume_dir = ck;
  expect_both(check_json_mutants(json_mutants(valid), ck,
                                 [&](const std::string& text) {
                                   write_bytes(meta, text);
                                   // As the command reads it, then as the ranks' resume does.
                                   const io::RunMeta m = io::CheckpointReader(ck, false).meta();
                                   model_config_from_json(m.model_config,
                                                          "checkpoint '" + ck + "'");
                                   prepare_resume(resume);
                                 }),
              "meta.json");
}

TEST(JsonReadersMutation, ShardIndex) {
  ScratchDir dir;
  testing::write_corpus(dir);
  data::TokenizeConfig t = testing::tiny_tokenize(dir, "tokens");
  t.tokenizer = testing::write_tokenizer(dir, testing::test_tokenizer_json());
  data::tokenize(t);
  const std::string index = dir.path("tokens/shards.json");
  const std::string valid = read_bytes(index);
  // A shard or tokenizer the index names is refused naming that file, in the folder.
  expect_both(check_json_mutants(json_mutants(valid), dir.path("tokens"),
                                 [&](const std::string& text) {
                                   write_bytes(index, text);
                                   data::data_vocab_size(dir.path("tokens"));
                                   data::load_shard_corpus(dir.path("tokens"));
                                 }),
              "shards.json");
}

TEST(JsonReadersMutation, Tokenizer) {
  ScratchDir dir;
  const std::string path = dir.path("tokenizer.json");
  expect_both(check_json_mutants(json_mutants(testing::test_tokenizer_json().dump()), path,
                                 [&](const std::string& text) {
                                   write_bytes(path, text);
                                   data::Tokenizer::load(path);
                                 }),
              "tokenizer.json");
}

TEST(JsonReadersMutation, HuggingFaceConfig) {
  ScratchDir dir;
  fs::create_directories(dir.path("hf"));
  const std::string path = dir.path("hf/config.json");
  auto reader = [&](const std::string& text) {
    write_bytes(path, text);
    hf_model_config(dir.path("hf"));
  };
  io::HfGpt2Config gpt2;
  gpt2.vocab_size = 300;
  gpt2.n_positions = 64;
  gpt2.n_embd = 32;
  gpt2.n_layer = 2;
  gpt2.n_head = 2;
  gpt2.eos_token_id = 299;
  expect_both(check_json_mutants(json_mutants(io::hf_gpt2_config_json(gpt2).dump()), path, reader),
              "GPT-2 config.json");
  io::HfLlamaConfig llama;
  llama.vocab_size = 300;
  llama.hidden_size = 32;
  llama.intermediate_size = 64;
  llama.num_hidden_layers = 2;
  llama.num_attention_heads = 4;
  llama.num_key_value_heads = 2;
  llama.max_position_embeddings = 64;
  expect_both(
      check_json_mutants(json_mutants(io::hf_llama_config_json(llama).dump()), path, reader),
      "Llama config.json");
}

TEST(JsonReadersMutation, HuggingFaceWeightsIndex) {
  ScratchDir dir;
  fs::create_directories(dir.path("hf"));
  io::save_safetensors(dir.path("hf/model-00001-of-00001.safetensors"),
                       {{"wte.weight", Tensor::zeros(DType::F32, Shape{4, 2})},
                        {"wpe.weight", Tensor::zeros(DType::F32, Shape{2, 2})}});
  const std::string index = dir.path("hf/model.safetensors.index.json");
  const nlohmann::json valid = {{"metadata", {{"total_size", 40}}},
                                {"weight_map",
                                 {{"wte.weight", "model-00001-of-00001.safetensors"},
                                  {"wpe.weight", "model-00001-of-00001.safetensors"}}}};
  expect_both(check_json_mutants(json_mutants(valid.dump()), index,
                                 [&](const std::string& text) {
                                   write_bytes(index, text);
                                   io::HfWeights(dir.path("hf"), io::hf_gpt2_canonical_name);
                                 }),
              "model.safetensors.index.json");
}

TEST(JsonReadersMutation, SafetensorsHeader) {
  const std::string file = io::serialize_safetensors(
      {{"a", Tensor::zeros(DType::F32, Shape{3, 2})}, {"b", Tensor::zeros(DType::BF16, Shape{5})}},
      {{"note", "x"}});
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[i]);
  const std::string header = file.substr(8, n), data = file.substr(8 + n);
  auto framed = [&](const std::string& h) {
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
    return out + h + data;
  };
  ASSERT_EQ(framed(header), file);
  // Without its checksums (which any edit breaks), so that mutants get past them to the fields.
  const std::string plain = io::serialize_safetensors(
      {{"a", Tensor::zeros(DType::F32, Shape{3, 2})}, {"b", Tensor::zeros(DType::BF16, Shape{5})}},
      {{"note", "x"}}, io::Checksums::None);
  uint64_t m = 0;
  for (int i = 7; i >= 0; --i) m = (m << 8) | static_cast<unsigned char>(plain[i]);
  expect_both(check_json_mutants(json_mutants(plain.substr(8, m)), "x.safetensors",
                                 [&](const std::string& text) {
                                   const std::string bytes = framed(text);
                                   io::parse_safetensors(bytes, "x.safetensors");
                                   io::SafetensorsReader::in_memory(bytes, "x.safetensors");
                                 }),
              "safetensors header");
}

TEST(JsonReadersMutation, TuningRecord) {
  tune::TuneRecord r;
  r.key.program = "adam";
  r.key.program_hash = tune::hash_hex("program adam");
  r.key.sizes = {{"N", 1 << 20}};
  r.key.ranks = 2;
  r.key.backend = "thread";
  r.key.executor = "compiled";
  r.key.machine = "test machine";
  r.key.candidates = tune::hash_hex("AR-C\nfused(RS-C-AG)");
  r.warmup = 1;
  r.reps = 3;
  r.created = "2026-01-01T00:00:00Z";
  r.check_sizes = {{"N", 4096}};
  r.candidates = {{"AR-C", true, "", 0.0, {0.03, 0.01}, {0.02, 0.02}},
                  {"fused(RS-C-AG)", true, "", 1e-7, {0.004, 0.005}, {0.004}}};
  r.winner = "fused(RS-C-AG)";
  r.chunk_bytes = 65536;
  r.chunks = {{65536, {0.004}}, {262144, {0.005}}};
  expect_both(check_json_mutants(json_mutants(tune::record_to_json(r)), "tuning record 'r.json'",
                                 [&](const std::string& text) {
                                   tune::record_from_json(text, "tuning record 'r.json'");
                                 }),
              "tuning record");
}

// A damaged profile is a miss (measured again and replaced), never an error: every mutant must
// load as nothing or as a profile, with no exception at all.
TEST(JsonReadersMutation, OutOfCoreProfile) {
  ScratchDir dir;
  const std::string cache = dir.path("cache");
  ooc::Profile p = ooc::uniform_profile(3, 0.01, 0.02, 1e9, 2e9);
  const std::string key = R"({"model": "tiny", "ranks": 1})";
  ooc::store_cached_profile(cache, "p.json", key, p);
  const std::string path = cache + "/ooc/p.json";
  ASSERT_TRUE(fs::exists(path));
  int loaded = 0;
  const auto c =
      check_json_mutants(json_mutants(read_bytes(path)), path, [&](const std::string& text) {
        {
          std::ofstream f(path, std::ios::trunc | std::ios::binary);
          f << text;
        }
        if (ooc::load_cached_profile(cache, "p.json", key)) ++loaded;
      });
  EXPECT_EQ(c.refused, 0);
  EXPECT_GT(loaded, 0);  // some mutants (a time made 0) are still a profile
}

}  // namespace
}  // namespace tandem::train
