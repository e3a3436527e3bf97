// Checkpoints exchanged in the Hugging Face GPT-2 layout: an export holds GPT2LMHeadModel's names
// with the checkpoint's bytes and a config.json transformers reads; a run started from it
// (--init-from) holds the same weights bit for bit on any grid; the hub's older layout loads too;
// and, where PyTorch is installed, an independent GPT-2 forward (tests/train/hf_gpt2_forward.py)
// reading the export reproduces tandem's logits.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "support/cli.h"
#include "tandem/data/token_corpus.h"
#include "tandem/data/tokenizer.h"
#include "tandem/io/checkpoint.h"
#include "tandem/io/checkpoint_series.h"
#include "tandem/io/hf_folder.h"
#include "tandem/io/safetensors.h"
#include "tandem/train/evaluate.h"
#include "tandem/train/hf_folder.h"
#include "train/test_util.h"
#include "train/token_test_util.h"

namespace tandem::train {
namespace {

using testing::HfExport;
using testing::ScratchDir;
using testing::train_and_export;
namespace fs = std::filesystem;

TEST(HfGpt2Export, WritesGPT2LMHeadModelsNamesWithTheCheckpointsBytes) {
  ScratchDir dir;
  const HfExport e = train_and_export(dir, testing::tiny_run(3));
  EXPECT_EQ(dir.list("hf"), (std::vector<std::string>{"config.json", "model.safetensors"}));
  const io::SafetensorsFile hf = io::load_safetensors(e.folder + "/model.safetensors");
  const io::Checkpoint ck = io::load_checkpoint(e.checkpoint, false);
  EXPECT_EQ(hf.metadata.at("format"), "pt");
  ASSERT_EQ(hf.tensors.size(), ck.weights.size());  // no lm_head.weight: tied
  for (const io::NamedTensor& w : ck.weights) {
    const Tensor& t = hf.get("transformer." + w.name, w.tensor.shape());
    EXPECT_EQ(t.dtype(), DType::F32);
    EXPECT_EQ(std::memcmp(t.data(), w.tensor.data(), w.tensor.nbytes()), 0) << w.name;
  }
  EXPECT_EQ(hf.find("lm_head.weight"), nullptr);

  const auto cfg = nlohmann::json::parse(testing::read_bytes(e.folder + "/config.json"));
  EXPECT_EQ(cfg["architectures"], nlohmann::json({"GPT2LMHeadModel"}));
  EXPECT_EQ(cfg["model_type"], "gpt2");
  EXPECT_EQ(cfg["vocab_size"], 256);
  EXPECT_EQ(cfg["n_positions"], 16);
  EXPECT_EQ(cfg["n_embd"], 16);
  EXPECT_EQ(cfg["n_layer"], 2);
  EXPECT_EQ(cfg["n_head"], 2);
  EXPECT_TRUE(cfg["n_inner"].is_null());
  EXPECT_EQ(cfg["activation_function"], "gelu_new");  // GELU's tanh approximation
  EXPECT_EQ(cfg["layer_norm_epsilon"], 1e-5);
  EXPECT_EQ(cfg["tie_word_embeddings"], true);
  EXPECT_EQ(cfg["resid_pdrop"], 0.0);
  EXPECT_TRUE(cfg["eos_token_id"].is_null());  // bytes: no end-of-text token
  EXPECT_EQ(hf_model_config(e.folder), (nn::GPTConfig{256, 2, 2, 16, 16, 16, 0.0f}));
}

TEST(HfGpt2Export, ReplacesAPreviousExportWholeAndLeavesItOnAFailedWrite) {
  ScratchDir dir;
  const HfExport e = train_and_export(dir, testing::tiny_run(3));
  const std::string before = testing::read_bytes(e.folder + "/model.safetensors");
  // A later checkpoint exported over it.
  TrainConfig more = e.config;
  more.steps = 5;
  more.resume_dir = e.config.save_dir;
  train(more);
  export_hf(e.config.save_dir, e.folder);
  const std::string after = testing::read_bytes(e.folder + "/model.safetensors");
  EXPECT_NE(after, before);
  // A write that fails half-way (a full disk, here a file-size limit) leaves the last export.
  std::string message;
  {
    const testing::FileSizeLimit limit(4096);
    message = testing::user_error_of([&] { export_hf(dir.path("ckpt"), e.folder); });
  }
  EXPECT_NE(message.find("the previous contents of '" + e.folder + "' are unchanged"),
            std::string::npos)
      << message;
  EXPECT_EQ(testing::read_bytes(e.folder + "/model.safetensors"), after);
  EXPECT_EQ(dir.list("hf"), (std::vector<std::string>{"config.json", "model.safetensors"}));
}

// --init-from on several grids: the initial weights are the export's, bit for bit.
class HfGpt2InitGrid : public ::testing::TestWithParam<parallel::GridShape> {};

TEST_P(HfGpt2InitGrid, StartsFromTheExportedWeightsBitForBit) {
  ScratchDir dir;
  const HfExport e = train_and_export(dir, testing::tiny_run(3));
  TrainConfig c = testing::tiny_run(0);
  c.grid = GetParam();
  c.init_from = e.folder;
  c.keep_weights = true;
  const TrainResult r = train(c);
  EXPECT_EQ(r.first_step, 0);
  EXPECT_EQ(r.weights, testing::checkpoint_weights(e.checkpoint, c.model)) << c.grid.str();
  // And trains on from there: step 0, a fresh optimizer.
  c.steps = 2;
  const TrainResult t = train(c);
  EXPECT_EQ(t.first_step, 0);
  ASSERT_EQ(t.losses.size(), 2u);
  EXPECT_TRUE(std::isfinite(t.losses[1]));
}

INSTANTIATE_TEST_SUITE_P(Grids, HfGpt2InitGrid,
                         ::testing::Values(parallel::GridShape{1, 1, 1},
                                           parallel::GridShape{1, 2, 1},
                                           parallel::GridShape{1, 1, 2},
                                           parallel::GridShape{2, 1, 1}),
                         [](const auto& info) {
                           const auto& g = info.param;
                           return "dp" + std::to_string(g.dp) + "_tp" + std::to_string(g.tp) +
                                  "_pp" + std::to_string(g.pp);
                         });

TEST(HfGpt2Init, SavesTheFoldersModelAsACheckpointWithStepsZero) {
  ScratchDir dir;
  const HfExport e = train_and_export(dir, testing::tiny_run(3));
  TrainConfig c = testing::tiny_run(0);
  c.init_from = e.folder;
  c.save_dir = dir.path("imported");
  train(c);
  const std::string saved = io::resolve_checkpoint(c.save_dir);
  EXPECT_EQ(io::read_run_meta(saved + "/meta.json").step, 0);
  EXPECT_EQ(testing::checkpoint_weights(saved, c.model),
            testing::checkpoint_weights(e.checkpoint, c.model));
}

// The hub's older files: GPT2Model's names without "transformer.", the causal masks stored as
// buffers, and the tied head stored too.
TEST(HfGpt2Init, ReadsTheHubsOlderLayout) {
  ScratchDir dir;
  const HfExport e = train_and_export(dir, testing::tiny_run(3));
  io::SafetensorsFile f = io::load_safetensors(e.folder + "/model.safetensors");
  std::vector<io::NamedTensor> old;
  for (io::NamedTensor& t : f.tensors) {
    t.name = t.name.substr(std::string("transformer.").size());
    if (t.name == "wte.weight") old.push_back({"lm_head.weight", t.tensor});
    old.push_back(t);
  }
  for (int i = 0; i < 2; ++i) {
    old.push_back(
        {"h." + std::to_string(i) + ".attn.bias", Tensor::zeros(DType::F32, {1, 1, 16, 16})});
    old.push_back({"h." + std::to_string(i) + ".attn.masked_bias", Tensor::zeros(DType::F32, {})});
  }
  io::save_safetensors(e.folder + "/model.safetensors", old, {{"format", "pt"}},
                       io::Checksums::None);
  TrainConfig c = testing::tiny_run(0);
  c.init_from = e.folder;
  c.keep_weights = true;
  EXPECT_EQ(train(c).weights, testing::checkpoint_weights(e.checkpoint, c.model));
}

// A model trained on token shards: its tokenizer goes beside the weights (config.json names its
// end-of-text id), and a run started from the folder on those shards checks it is theirs.
TEST(HfGpt2Export, CopiesTheTokenizerAndInitFromChecksIt) {
  ScratchDir dir;
  testing::write_corpus(dir);
  data::tokenize(testing::tiny_tokenize(dir, "shards"));
  TrainConfig c = testing::tiny_run(1);
  c.data = dir.path("shards");
  c.model.vocab_size = data::data_vocab_size(c.data);
  c.save_dir = dir.path("ck");
  train(c);
  const std::string hf = dir.path("hf");
  export_hf(c.save_dir, hf);
  EXPECT_EQ(dir.list("hf"),
            (std::vector<std::string>{"config.json", "model.safetensors", "tokenizer.model"}));
  EXPECT_EQ(testing::read_bytes(hf + "/tokenizer.model"),
            testing::read_bytes(dir.path("shards/tokenizer.model")));
  const auto cfg = nlohmann::json::parse(testing::read_bytes(hf + "/config.json"));
  EXPECT_EQ(cfg["vocab_size"], 320);
  EXPECT_EQ(cfg["eos_token_id"], data::Tokenizer::load(hf + "/tokenizer.model").eos_id());

  TrainConfig init = c;
  init.save_dir.clear();
  init.steps = 0;
  init.init_from = hf;
  init.keep_weights = true;
  EXPECT_EQ(train(init).weights,
            testing::checkpoint_weights(io::resolve_checkpoint(c.save_dir), c.model));
  // Another tokenizer beside the weights: the ids would mean other pieces.
  testing::write_bytes(hf + "/tokenizer.model", "not the shards' tokenizer");
  EXPECT_NE(testing::user_error_of([&] { train(init); })
                .find("the tokenizer '" + hf + "/tokenizer.model' is not the one --data '" +
                      dir.path("shards") + "' was encoded with"),
            std::string::npos);
}

// The commands: tandem export, then tandem train --init-from on a tensor-parallel grid, its model
// taken from config.json.
TEST(HfGpt2Commands, ExportThenTrainInitFrom) {
  ScratchDir dir;
  const HfExport e = train_and_export(dir, testing::tiny_run(3));
  const auto x = tandem::testing::run_tandem("export --format hf --out '" + dir.path("hf2") +
                                             "' '" + e.config.save_dir + "'");
  ASSERT_EQ(x.status, 0) << x.output;
  EXPECT_NE(x.output.find("written to " + dir.path("hf2") + " as model.safetensors, config.json"),
            std::string::npos)
      << x.output;
  EXPECT_EQ(testing::read_bytes(dir.path("hf2/model.safetensors")),
            testing::read_bytes(e.folder + "/model.safetensors"));
  const auto t = tandem::testing::run_tandem(
      "train --init-from '" + dir.path("hf2") + "' --steps 0 --save '" + dir.path("ck2") +
      "' --dp 1 --tp 2 --pp 1 --batch 4 --executor plan --eval-every 0 --quiet --threads 1");
  ASSERT_EQ(t.status, 0) << t.output;
  EXPECT_NE(t.output.find("starting from the Hugging Face folder " + dir.path("hf2")),
            std::string::npos)
      << t.output;
  EXPECT_EQ(testing::checkpoint_weights(io::resolve_checkpoint(dir.path("ck2")), e.config.model),
            testing::checkpoint_weights(e.checkpoint, e.config.model));
}

// An independent reader: GPT-2's forward in PyTorch on the exported folder gives tandem's logits.
TEST(HfGpt2PyTorch, ForwardOnTheExportReproducesTandemsLogits) {
  // The python3 on PATH, else Debian's (where python3-torch installs), unless TANDEM_PYTHON names
  // one.
  std::string python;
  for (const char* py :
       {static_cast<const char*>(std::getenv("TANDEM_PYTHON")), "python3", "/usr/bin/python3"})
    if (py != nullptr && python.empty() &&
        tandem::testing::run_command(std::string(py) + " -c 'import torch'").status == 0)
      python = py;
  if (python.empty())
    GTEST_SKIP() << "no python3 can import torch: install Debian's python3-torch to run this check";
  ScratchDir dir;
  const HfExport e = train_and_export(dir, testing::tiny_run(20));
  const LoadedModel m = load_model(e.checkpoint);
  const nn::GPTConfig& c = m.config;
  const std::vector<int32_t> tokens = {84, 104, 101, 32, 99, 97, 116, 32, 115, 97, 116, 255, 0, 7};
  const int T = static_cast<int>(tokens.size());
  ASSERT_LE(T, c.seq_len);
  // tandem's logits: ln_f's output (its forward) times the tied head wte, in double.
  nn::GPTActivations acts(c, 1, T);
  nn::Workspace ws(c, 1, T);
  nn::gpt_forward(m.params, acts, ws, nn::Batch{tokens.data(), nullptr, 1, T},
                  nn::StepRng{0, 0, 0, false});
  const float* x = acts.head.ptr(nn::FinalAct::LnfOut);
  const float* wte = m.params["wte.weight"].data_as<float>();
  std::vector<double> ours(static_cast<size_t>(T) * c.vocab_size);
  for (int t = 0; t < T; ++t)
    for (int v = 0; v < c.vocab_size; ++v) {
      double s = 0;
      for (int i = 0; i < c.d_model; ++i)
        s += static_cast<double>(x[t * c.d_model + i]) * wte[v * c.d_model + i];
      ours[static_cast<size_t>(t) * c.vocab_size + v] = s;
    }

  std::string ids;
  for (int32_t id : tokens) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  const std::string script = std::string(TANDEM_SOURCE_DIR) + "/tests/train/hf_gpt2_forward.py";
  const auto r = tandem::testing::run_command(python + " '" + script + "' '" + e.folder + "' " +
                                              ids + " '" + dir.path("logits.bin") + "'");
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string bytes = testing::read_bytes(dir.path("logits.bin"));
  ASSERT_EQ(bytes.size(), ours.size() * sizeof(double));
  std::vector<double> theirs(ours.size());
  std::memcpy(theirs.data(), bytes.data(), bytes.size());
  // tandem runs in f32 (and its GELU's tanh is a fast approximation); the reference in f64.
  double worst = 0, largest = 0;
  size_t at = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    largest = std::max(largest, std::abs(theirs[i]));
    if (std::abs(ours[i] - theirs[i]) > worst) worst = std::abs(ours[i] - theirs[i]), at = i;
  }
  EXPECT_GT(largest, 0.1);  // logits that mean something
  EXPECT_LT(worst, 1e-4 * std::max(1.0, largest))
      << "max |difference| " << worst << " at token " << at / c.vocab_size << ", id "
      << at % c.vocab_size << " (tandem " << ours[at] << ", PyTorch " << theirs[at] << ")";
}

}  // namespace
}  // namespace tandem::train
