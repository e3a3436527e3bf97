// Checkpoints a run must refuse: missing, incomplete, unreadable metadata, an unknown format
// version, corrupt tensors, and a config that does not match the run.
#include <gtest/gtest.h>

#include "support/files.h"
#include "support/scratch.h"
#include "tandem/io/checkpoint.h"

namespace tandem::io {
namespace {

using nlohmann::json;
using testing::ScratchDir;
using testing::user_error_of;

// A valid checkpoint in `dir`, to be damaged by each test.
void save_small(const std::string& dir) {
  Checkpoint c;
  c.meta.model_config = {{"d_model", 256}, {"layers", 4}};
  c.meta.step = 7;
  c.meta.optimizer = "adamw";
  c.weights = {{"wte", Tensor::zeros(DType::F32, Shape{4, 4})}};
  c.optimizer = {{"m.wte", Tensor::zeros(DType::F32, Shape{4, 4})}};
  save_checkpoint(dir, c);
}

// meta.json with one field replaced (or removed, for a null value).
void edit_meta(const std::string& dir, const std::string& key, const json& value) {
  json j = json::parse(read_file(dir + "/meta.json"));
  if (value.is_null()) {
    j.erase(key);
  } else {
    j[key] = value;
  }
  testing::write_bytes(dir + "/meta.json", j.dump());
}

TEST(CheckpointErrors, MissingFolderOrNotAFolder) {
  ScratchDir dir;
  EXPECT_EQ(user_error_of([&] { load_checkpoint(dir.path("nope")); }),
            "checkpoint folder '" + dir.path("nope") + "' does not exist");
  testing::write_bytes(dir.path("file"), "x");
  EXPECT_EQ(user_error_of([&] { load_checkpoint(dir.path("file")); }),
            "checkpoint '" + dir.path("file") + "' is not a folder");
}

TEST(CheckpointErrors, MissingFiles) {
  ScratchDir dir;
  const std::string ck = dir.path("ckpt");
  save_small(ck);
  std::filesystem::remove(ck + "/optimizer.safetensors");
  EXPECT_EQ(user_error_of([&] { load_checkpoint(ck); }),
            "checkpoint '" + ck + "' is incomplete: it has no optimizer.safetensors");
  // Not needed when the optimizer state will not be read (eval, sample).
  EXPECT_EQ(load_checkpoint(ck, false).meta.step, 7);
  std::filesystem::remove(ck + "/weights.safetensors");
  std::filesystem::remove(ck + "/meta.json");
  EXPECT_EQ(user_error_of([&] { load_checkpoint(ck, false); }),
            "checkpoint '" + ck + "' is incomplete: it has no weights.safetensors and meta.json");
  EXPECT_EQ(
      user_error_of([&] { load_checkpoint(ck); }),
      "checkpoint '" + ck +
          "' is incomplete: it has no weights.safetensors, optimizer.safetensors and meta.json");
}

TEST(CheckpointErrors, MetaIsNotJson) {
  ScratchDir dir;
  const std::string ck = dir.path("ckpt");
  save_small(ck);
  testing::write_bytes(ck + "/meta.json", "{\"step\": 7,");
  const std::string m = user_error_of([&] { load_checkpoint(ck); });
  EXPECT_EQ(m.rfind("checkpoint metadata '" + ck +
                        "/meta.json' is not valid JSON: parse error at line 1, column ",
                    0),
            0u)
      << m;
}

TEST(CheckpointErrors, UnknownFormatVersion) {
  ScratchDir dir;
  const std::string ck = dir.path("ckpt");
  save_small(ck);
  edit_meta(ck, "format_version", 2);
  EXPECT_EQ(user_error_of([&] { load_checkpoint(ck); }),
            "checkpoint metadata '" + ck +
                "/meta.json' has format version 2; this tandem (0.1.0) reads "
                "format version 1 (the checkpoint was written by a newer tandem)");
  edit_meta(ck, "format_version", 0);
  EXPECT_EQ(user_error_of([&] { load_checkpoint(ck); }),
            "checkpoint metadata '" + ck +
                "/meta.json' has format version 0; this tandem (0.1.0) reads "
                "format version 1");
  edit_meta(ck, "format_version", nullptr);
  EXPECT_EQ(user_error_of([&] { load_checkpoint(ck); }),
            "invalid checkpoint metadata '" + ck +
                "/meta.json': it has no integer 'format_version', so "
                "it is not tandem checkpoint metadata");
}

TEST(CheckpointErrors, MissingOrIllTypedFields) {
  ScratchDir dir;
  const std::string ck = dir.path("ckpt");
  const std::string prefix = "invalid checkpoint metadata '" + ck + "/meta.json': ";
  save_small(ck);
  edit_meta(ck, "step", -3);
  EXPECT_EQ(user_error_of([&] { load_checkpoint(ck); }),
            prefix + "'step' must be a non-negative integer (it is -3)");
  edit_meta(ck, "step", nullptr);
  EXPECT_EQ(user_error_of([&] { load_checkpoint(ck); }), prefix + "the top level has no 'step'");
  edit_meta(ck, "step", 7);
  edit_meta(ck, "model", "gpt");
  EXPECT_EQ(user_error_of([&] { load_checkpoint(ck); }),
            prefix + "'model' must be a JSON object (it is \"gpt\")");
  edit_meta(ck, "model", json::object());
  edit_meta(ck, "data", {{"source", "x"}, {"position", 3}});
  EXPECT_EQ(user_error_of([&] { load_checkpoint(ck); }), prefix + "'data' has no 'fingerprint'");
  edit_meta(ck, "data", {{"source", "x"}, {"fingerprint", ""}, {"position", 3}});
  edit_meta(ck, "rng", {{"seed", 1.5}, {"counter", 0}});
  EXPECT_EQ(user_error_of([&] { load_checkpoint(ck); }),
            prefix + "'seed' must be a non-negative integer (it is 1.5)");
  edit_meta(ck, "rng", {{"seed", 1}, {"counter", 0}});
  edit_meta(ck, "optimizer", {{"name", 3}, {"hyperparameters", json::object()}});
  EXPECT_EQ(user_error_of([&] { load_checkpoint(ck); }),
            prefix + "'name' must be a string (it is 3)");
  edit_meta(ck, "optimizer", {{"name", "adamw"}, {"hyperparameters", json::object()}});
  EXPECT_EQ(load_checkpoint(ck).meta.data_position, 3);
  testing::write_bytes(ck + "/meta.json", "[1]");
  EXPECT_EQ(user_error_of([&] { load_checkpoint(ck); }), prefix + "it is not a JSON object");
}

TEST(CheckpointErrors, CorruptTensorFiles) {
  ScratchDir dir;
  const std::string ck = dir.path("ckpt");
  save_small(ck);
  const std::string w = read_file(ck + "/weights.safetensors");
  testing::write_bytes(ck + "/weights.safetensors", w.substr(0, w.size() - 4));
  EXPECT_EQ(
      user_error_of([&] { load_checkpoint(ck); }),
      "corrupt safetensors file '" + ck +
          "/weights.safetensors': truncated: tensor 'wte' ends at byte 64 of the data section, "
          "which has only 60 bytes");
  testing::write_bytes(ck + "/weights.safetensors", w);
  testing::write_bytes(ck + "/optimizer.safetensors", "garbage");
  EXPECT_EQ(user_error_of([&] { load_checkpoint(ck); }),
            "corrupt safetensors file '" + ck +
                "/optimizer.safetensors': truncated to 7 bytes (a safetensors file starts with an "
                "8-byte header length)");
  EXPECT_NO_THROW(load_checkpoint(ck, /*with_optimizer=*/false));
}

TEST(CheckpointErrors, ConfigMismatch) {
  const json saved = {{"d_model", 256}, {"layers", 4}, {"heads", 4}, {"dtype", "f32"}};
  EXPECT_EQ(user_error_of([&] {
              check_config_compatible(
                  "ckpt", saved, {{"d_model", 128}, {"layers", 4}, {"heads", 4}, {"dtype", "f32"}});
            }),
            "checkpoint 'ckpt' was trained with d_model 256, this run asks for 128");
  EXPECT_EQ(
      user_error_of([&] {
        check_config_compatible("ckpt", saved,
                                {{"d_model", 128}, {"layers", 2}, {"heads", 4}, {"dtype", "bf16"}});
      }),
      "checkpoint 'ckpt' was trained with d_model 256, dtype f32 and layers 4, this run asks for "
      "d_model 128, dtype bf16 and layers 2");
  EXPECT_EQ(user_error_of([&] {
              check_config_compatible("ckpt", saved, {{"d_model", 256}}, {"layers"});
            }),
            "checkpoint 'ckpt' was trained with layers 4, this run asks for (unset)");
}

}  // namespace
}  // namespace tandem::io
