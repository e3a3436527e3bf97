// Llama checkpoints exchanged as Hugging Face folders: an export holds LlamaForCausalLM's (or
// Qwen2ForCausalLM's) tensors, tandem's fused ones cut and transposed into nn.Linear's layout; a
// run started from it (--init-from) holds the same weights bit for bit on any grid, and so from a
// bf16 folder (the weights rounded) and a sharded one; the tokenizer travels with it and is
// checked against the data's; and, where PyTorch is installed, an independent Llama forward
// (tests/train/hf_llama_forward.py) reading the export reproduces tandem's logits and loss.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

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
namespace hf_llama_test {

using testing::HfExport;
using testing::ScratchDir;
using testing::train_and_export;
namespace fs = std::filesystem;

// The layouts a Llama export has: the head tied or its own, and Qwen2's q/k/v biases; and Llama
// 3.1's rotary scaling (over an original context short enough that it changes these positions).
struct Variant {
  const char* name;
  bool tied;
  bool qkv_bias;
  bool llama3 = false;
};
const Variant kVariants[] = {{"tied", true, false},
                             {"untied", false, false},
                             {"qwen2", true, true},
                             {"llama3", false, false, true}};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

// A small Llama: grouped-query attention (4 heads, 2 key/value heads of 16), an MLP of 160.
TrainConfig llama_run(const Variant& v, int64_t steps) {
  TrainConfig c = testing::tiny_run(steps);
  c.model.arch = nn::Arch::Llama;
  c.model.n_layers = 2;
  c.model.d_model = 64;
  c.model.n_heads = 4;
  c.model.kv_heads = 2;
  c.model.ffn = 160;
  c.model.tie_embeddings = v.tied;
  c.model.qkv_bias = v.qkv_bias;
  if (v.llama3) {
    c.model.rope_theta = 500000.0;
    c.model.rope_scaling = {nn::RopeType::Llama3, 32.0, 1.0, 4.0, 16};
  }
  return c;
}

TrainConfig llama_init(const HfExport& e, const std::string& folder) {
  TrainConfig c = testing::tiny_run(0);
  c.model = e.config.model;
  c.init_from = folder;
  c.keep_weights = true;
  return c;
}

class HfLlamaVariant : public ::testing::TestWithParam<Variant> {};

// The names, shapes and values: each Hugging Face tensor is its columns of tandem's tensor,
// transposed where nn.Linear stores (out, in).
TEST_P(HfLlamaVariant, ExportWritesLlamaForCausalLMsTensors) {
  const Variant v = GetParam();
  ScratchDir dir;
  const HfExport e = train_and_export(dir, llama_run(v, 3));
  EXPECT_EQ(dir.list("hf"), (std::vector<std::string>{"config.json", "model.safetensors"}));
  const io::SafetensorsFile hf = io::load_safetensors(e.folder + "/model.safetensors");
  const io::Checkpoint ck = io::load_checkpoint(e.checkpoint, false);
  auto tandem = [&](const std::string& name) -> const Tensor& {
    for (const io::NamedTensor& n : ck.weights)
      if (n.name == name) return n.tensor;
    throw std::runtime_error("no " + name);
  };
  const int64_t C = 64, KV = 32, F = 160;
  // hf(name)[o, i] == tandem(t)[i, first + o], every element.
  auto expect_columns = [&](const std::string& name, const std::string& t, int64_t first,
                            int64_t width) {
    const Tensor& w = tandem(t);
    const Tensor& h = hf.get(name, Shape{width, w.shape()[0]});
    for (int64_t o = 0; o < width; ++o)
      for (int64_t i = 0; i < w.shape()[0]; ++i)
        ASSERT_EQ(h.get(o * w.shape()[0] + i), w.get(i * w.shape()[1] + first + o))
            << name << " [" << o << ", " << i << "]";
  };
  auto expect_same = [&](const std::string& name, const std::string& t, int64_t first = 0) {
    const Tensor& w = tandem(t);
    const Tensor* h = hf.find(name);
    ASSERT_NE(h, nullptr) << name;
    for (int64_t i = 0; i < h->numel(); ++i) ASSERT_EQ(h->get(i), w.get(first + i)) << name;
  };
  size_t count = 3;  // embed_tokens, norm and lm_head
  expect_same("model.embed_tokens.weight", "wte.weight");
  expect_same("model.norm.weight", "ln_f.weight");
  if (v.tied)
    EXPECT_EQ(hf.find("lm_head.weight"), nullptr);
  else
    expect_same("lm_head.weight", "lm_head.weight");
  if (v.tied) --count;
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::string h = "h." + std::to_string(l) + ".";
    expect_same(p + "input_layernorm.weight", h + "ln_1.weight");
    expect_same(p + "post_attention_layernorm.weight", h + "ln_2.weight");
    expect_columns(p + "self_attn.q_proj.weight", h + "attn.c_attn.weight", 0, C);
    expect_columns(p + "self_attn.k_proj.weight", h + "attn.c_attn.weight", C, KV);
    expect_columns(p + "self_attn.v_proj.weight", h + "attn.c_attn.weight", C + KV, KV);
    expect_columns(p + "self_attn.o_proj.weight", h + "attn.c_proj.weight", 0, C);
    expect_columns(p + "mlp.gate_proj.weight", h + "mlp.c_fc.weight", 0, F);
    expect_columns(p + "mlp.up_proj.weight", h + "mlp.c_fc.weight", F, F);
    expect_columns(p + "mlp.down_proj.weight", h + "mlp.c_proj.weight", 0, C);
    count += 9;
    if (v.qkv_bias) {
      expect_same(p + "self_attn.q_proj.bias", h + "attn.c_attn.bias", 0);
      expect_same(p + "self_attn.k_proj.bias", h + "attn.c_attn.bias", C);
      expect_same(p + "self_attn.v_proj.bias", h + "attn.c_attn.bias", C + KV);
      count += 3;
    }
  }
  EXPECT_EQ(hf.tensors.size(), count);
  for (const io::NamedTensor& t : hf.tensors) EXPECT_EQ(t.tensor.dtype(), DType::F32) << t.name;

  const auto cfg = nlohmann::json::parse(testing::read_bytes(e.folder + "/config.json"));
  EXPECT_EQ(cfg["model_type"], v.qkv_bias ? "qwen2" : "llama");
  EXPECT_EQ(cfg["architectures"][0], v.qkv_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM");
  EXPECT_EQ(cfg["hidden_size"], 64);
  EXPECT_EQ(cfg["intermediate_size"], 160);
  EXPECT_EQ(cfg["num_attention_heads"], 4);
  EXPECT_EQ(cfg["num_key_value_heads"], 2);
  EXPECT_EQ(cfg["num_hidden_layers"], 2);
  EXPECT_EQ(cfg["max_position_embeddings"], 16);
  EXPECT_EQ(cfg["vocab_size"], 256);
  EXPECT_EQ(cfg["rms_norm_eps"], 1e-5);
  if (v.llama3) {
    EXPECT_EQ(cfg["rope_theta"], 500000.0);
    EXPECT_EQ(cfg["rope_scaling"], nlohmann::json({{"rope_type", "llama3"},
                                                   {"factor", 32.0},
                                                   {"low_freq_factor", 1.0},
                                                   {"high_freq_factor", 4.0},
                                                   {"original_max_position_embeddings", 16}}));
  } else {
    EXPECT_EQ(cfg["rope_theta"], 10000.0);
    EXPECT_TRUE(cfg["rope_scaling"].is_null());
  }
  EXPECT_EQ(cfg["tie_word_embeddings"], v.tied);
  EXPECT_EQ(cfg["hidden_act"], "silu");
  EXPECT_EQ(cfg["torch_dtype"], "float32");
  nn::GPTConfig want = e.config.model;
  want.max_positions = want.seq_len;
  EXPECT_EQ(hf_model_config(e.folder), want);
}

// --init-from gives back the checkpoint's weights bit for bit, and trains on.
TEST_P(HfLlamaVariant, InitFromTheExportIsBitwise) {
  ScratchDir dir;
  const HfExport e = train_and_export(dir, llama_run(GetParam(), 3));
  TrainConfig c = llama_init(e, e.folder);
  const TrainResult r = train(c);
  EXPECT_EQ(r.first_step, 0);
  EXPECT_EQ(r.weights, testing::checkpoint_weights(e.checkpoint, c.model));
  c.steps = 2;
  const TrainResult t = train(c);
  ASSERT_EQ(t.losses.size(), 2u);
  EXPECT_TRUE(std::isfinite(t.losses[1]));
}

// On tensor- and pipeline-parallel grids (key/value heads split over 2 ranks, the head on the last
// stage), the same weights.
TEST(HfLlamaInit, OnGridsTheSameWeights) {
  ScratchDir dir;
  const HfExport e = train_and_export(dir, llama_run(kVariants[1], 3));
  for (const parallel::GridShape& grid :
       {parallel::GridShape{1, 2, 1}, parallel::GridShape{2, 1, 2}}) {
    TrainConfig c = llama_init(e, e.folder);
    c.grid = grid;
    EXPECT_EQ(train(c).weights, testing::checkpoint_weights(e.checkpoint, c.model)) << grid.str();
  }
}

// The export's tensors, each changed by `convert`, written as `shards` files (one:
// model.safetensors; more: model-0000k-of-0000n.safetensors and the index) into `out`, with its
// config.json.
template <typename F>
void rewrite_folder(const std::string& from, const std::string& out, int shards, F&& convert) {
  fs::create_directories(out);
  fs::copy_file(from + "/config.json", out + "/config.json");
  const io::SafetensorsFile f = io::load_safetensors(from + "/model.safetensors");
  std::vector<std::vector<io::NamedTensor>> parts(static_cast<size_t>(shards));
  nlohmann::json map = nlohmann::json::object();
  for (size_t i = 0; i < f.tensors.size(); ++i) {
    const size_t k = i * static_cast<size_t>(shards) / f.tensors.size();
    parts[k].push_back({f.tensors[i].name, convert(f.tensors[i].tensor)});
    map[f.tensors[i].name] = fmt::format("model-{:05}-of-{:05}.safetensors", k + 1, shards);
  }
  if (shards == 1) {
    io::save_safetensors(out + "/model.safetensors", parts[0], {{"format", "pt"}},
                         io::Checksums::None);
    return;
  }
  for (int k = 0; k < shards; ++k)
    io::save_safetensors(out + fmt::format("/model-{:05}-of-{:05}.safetensors", k + 1, shards),
                         parts[static_cast<size_t>(k)], {{"format", "pt"}}, io::Checksums::None);
  testing::write_bytes(
      out + "/model.safetensors.index.json",
      nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", map}}.dump(2));
}

// Folders as published: bf16 (the weights load rounded to bf16, each value exactly) and f16, and
// sharded with an index (bitwise).
TEST(HfLlamaInit, ReadsBf16F16AndShardedFolders) {
  ScratchDir dir;
  const HfExport e = train_and_export(dir, llama_run(kVariants[1], 3));
  const std::vector<float> exact = testing::checkpoint_weights(e.checkpoint, e.config.model);
  for (const DType t : {DType::BF16, DType::F16}) {
    const std::string folder = dir.path(std::string(dtype_name(t)));
    rewrite_folder(e.folder, folder, 1, [&](const Tensor& x) { return x.to(t); });
    const TrainConfig c = llama_init(e, folder);
    const std::vector<float> got = train(c).weights;
    ASSERT_EQ(got.size(), exact.size());
    const Tensor rounded = Tensor::view_of(const_cast<float*>(exact.data()), DType::F32,
                                           {static_cast<int64_t>(exact.size())})
                               .to(t);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], rounded.get(static_cast<int64_t>(i))) << dtype_name(t) << " element " << i;
  }
  const std::string sharded = dir.path("sharded");
  rewrite_folder(e.folder, sharded, 3, [](const Tensor& x) { return x; });
  EXPECT_TRUE(fs::exists(sharded + "/model-00003-of-00003.safetensors"));
  EXPECT_EQ(train(llama_init(e, sharded)).weights, exact);
  // Sharded and bf16 at once.
  const std::string both = dir.path("sharded-bf16");
  rewrite_folder(e.folder, both, 2, [](const Tensor& x) { return x.to(DType::BF16); });
  EXPECT_EQ(train(llama_init(e, both)).weights.size(), exact.size());
}

// The commands: tandem export, then tandem train --init-from on a tensor-parallel grid, the whole
// Llama block (family, key/value heads, MLP width, head) taken from config.json.
TEST(HfLlamaCommands, ExportThenTrainInitFrom) {
  ScratchDir dir;
  const HfExport e = train_and_export(dir, llama_run(kVariants[2], 3));
  const auto x = tandem::testing::run_tandem("export --format hf --out '" + dir.path("hf2") +
                                             "' '" + e.config.save_dir + "'");
  ASSERT_EQ(x.status, 0) << x.output;
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
  // Flags that say what the folder says are accepted.
  const auto same = tandem::testing::run_tandem(
      "train --init-from '" + dir.path("hf2") +
      "' --arch llama --layers 2 --heads 4 --kv-heads 2 --d-model 64 --ffn 160 --qkv-bias "
      "--seq-len 8 --steps 0 --batch 4 --executor plan --eval-every 0 --quiet --threads 1");
  EXPECT_EQ(same.status, 0) << same.output;
}

// A Llama trained on token shards: its SentencePiece tokenizer goes beside the weights as
// tokenizer.model (config.json names its end-of-text id), and a run from the folder on those
// shards checks it is theirs.
TEST(HfLlamaExport, CopiesTheTokenizerAndInitFromChecksIt) {
  ScratchDir dir;
  testing::write_corpus(dir);
  data::tokenize(testing::tiny_tokenize(dir, "shards"));
  TrainConfig c = llama_run(kVariants[1], 1);
  c.data = dir.path("shards");
  c.model.vocab_size = data::data_vocab_size(c.data);
  c.save_dir = dir.path("ck");
  train(c);
  const std::string hf = dir.path("hf");
  export_hf(c.save_dir, hf);
  EXPECT_EQ(dir.list("hf"),
            (std::vector<std::string>{"config.json", "model.safetensors", "tokenizer.model"}));
  const auto cfg = nlohmann::json::parse(testing::read_bytes(hf + "/config.json"));
  EXPECT_EQ(cfg["vocab_size"], c.model.vocab_size);
  EXPECT_EQ(cfg["eos_token_id"], data::Tokenizer::load(hf + "/tokenizer.model").eos_id());
  EXPECT_TRUE(cfg["bos_token_id"].is_null());  // SentencePiece models put none before documents
  TrainConfig init = c;
  init.save_dir.clear();
  init.steps = 0;
  init.init_from = hf;
  init.keep_weights = true;
  EXPECT_EQ(train(init).weights,
            testing::checkpoint_weights(io::resolve_checkpoint(c.save_dir), c.model));
  testing::write_bytes(hf + "/tokenizer.model", "not the shards' tokenizer");
  EXPECT_NE(testing::user_error_of([&] { train(init); })
                .find("the tokenizer '" + hf + "/tokenizer.model' is not the one --data '" +
                      dir.path("shards") + "' was encoded with"),
            std::string::npos);
}

// Shards encoded with Llama 3's tokenizer.json (tests/data/llama3/): the export carries it as
// tokenizer.json, with its <|begin_of_text|> and <|end_of_text|> ids in config.json.
TEST(HfLlamaExport, CarriesALlama3TokenizerJsonAndItsIds) {
  ScratchDir dir;
  testing::write_corpus(dir);
  const std::string json = std::string(TANDEM_SOURCE_DIR) + "/tests/data/llama3/tokenizer.json";
  const auto r = tandem::testing::run_tandem(
      fmt::format("tokenize '{}' --out '{}' --tokenizer '{}' --threads 2 --quiet",
                  dir.path("corpus"), dir.path("shards"), json));
  ASSERT_EQ(r.status, 0) << r.output;
  TrainConfig c = llama_run(kVariants[0], 1);
  c.data = dir.path("shards");
  c.model.vocab_size = data::data_vocab_size(c.data);
  c.save_dir = dir.path("ck");
  train(c);
  const std::string hf = dir.path("hf");
  export_hf(c.save_dir, hf);
  EXPECT_EQ(dir.list("hf"),
            (std::vector<std::string>{"config.json", "model.safetensors", "tokenizer.json"}));
  EXPECT_EQ(testing::read_bytes(hf + "/tokenizer.json"), testing::read_bytes(json));
  const data::Tokenizer t = data::Tokenizer::load(json);
  ASSERT_GE(t.bos_id(), 0);
  ASSERT_GE(t.eos_id(), 0);
  const auto cfg = nlohmann::json::parse(testing::read_bytes(hf + "/config.json"));
  EXPECT_EQ(cfg["bos_token_id"], t.bos_id());
  EXPECT_EQ(cfg["eos_token_id"], t.eos_id());
  TrainConfig init = c;
  init.save_dir.clear();
  init.steps = 0;
  init.init_from = hf;
  init.keep_weights = true;
  EXPECT_EQ(train(init).weights,
            testing::checkpoint_weights(io::resolve_checkpoint(c.save_dir), c.model));
}

// The python3 that can import torch: TANDEM_PYTHON, the one on PATH, else Debian's.
std::string torch_python() {
  for (const char* py :
       {static_cast<const char*>(std::getenv("TANDEM_PYTHON")), "python3", "/usr/bin/python3"})
    if (py != nullptr &&
        tandem::testing::run_command(std::string(py) + " -c 'import torch'").status == 0)
      return py;
  return "";
}

// An independent reader: Llama's forward in PyTorch on the exported folder gives tandem's logits
// and loss, for each layout. Trained 100 steps, so that attention depends on positions: a rotary
// convention or scaling read otherwise moves the logits by tenths (4 orders of magnitude past
// the bound), where 20 steps' nearly uniform attention hides it below f32's rounding.
TEST_P(HfLlamaVariant, PyTorchForwardOnTheExportReproducesTandem) {
  const std::string python = torch_python();
  if (python.empty())
    GTEST_SKIP() << "no python3 can import torch: install Debian's python3-torch to run this check";
  const Variant v = GetParam();
  ScratchDir dir;
  const HfExport e = train_and_export(dir, llama_run(v, 100));
  const LoadedModel m = load_model(e.checkpoint);
  const nn::GPTConfig& c = m.config;
  const std::vector<int32_t> tokens = {84, 104, 101, 32, 99, 97, 116, 32, 115, 97, 116, 255, 0, 7};
  const int T = static_cast<int>(tokens.size());
  ASSERT_LE(T, c.seq_len);
  // tandem's logits: the final norm's output (its forward) times the head, in double.
  nn::GPTActivations acts(c, 1, T);
  nn::Workspace ws(c, 1, T);
  nn::gpt_forward(m.params, acts, ws, nn::Batch{tokens.data(), nullptr, 1, T},
                  nn::StepRng{0, 0, 0, false});
  const float* x = acts.head.ptr(nn::FinalAct::LnfOut);
  const float* head = m.params.final_stage().wte;
  std::vector<double> ours(static_cast<size_t>(T) * c.vocab_size);
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < c.vocab_size; ++j) {
      double s = 0;
      for (int i = 0; i < c.d_model; ++i)
        s += static_cast<double>(x[t * c.d_model + i]) * head[j * c.d_model + i];
      ours[static_cast<size_t>(t) * c.vocab_size + j] = s;
    }
  // tandem's loss: each of the first T - 1 tokens predicting the next.
  nn::GPTActivations acts1(c, 1, T - 1);
  nn::Workspace ws1(c, 1, T - 1);
  const double loss =
      nn::gpt_forward(m.params, acts1, ws1, nn::Batch{tokens.data(), tokens.data() + 1, 1, T - 1},
                      nn::StepRng{0, 0, 0, false});

  std::string ids;
  for (int32_t id : tokens) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  const std::string script = std::string(TANDEM_SOURCE_DIR) + "/tests/train/hf_llama_forward.py";
  const auto r = tandem::testing::run_command(python + " '" + script + "' '" + e.folder + "' " +
                                              ids + " '" + dir.path("logits.bin") + "'");
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string bytes = testing::read_bytes(dir.path("logits.bin"));
  ASSERT_EQ(bytes.size(), (ours.size() + 1) * sizeof(double));
  std::vector<double> theirs(ours.size() + 1);
  std::memcpy(theirs.data(), bytes.data(), bytes.size());
  const double their_loss = theirs.back();
  theirs.pop_back();
  // tandem runs in f32; the reference in f64.
  double worst = 0, largest = 0;
  size_t at = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    largest = std::max(largest, std::abs(theirs[i]));
    if (std::abs(ours[i] - theirs[i]) > worst) worst = std::abs(ours[i] - theirs[i]), at = i;
  }
  std::cout << "[ " << v.name << " ] loss: tandem " << loss << ", PyTorch " << their_loss
            << ", |difference| " << std::abs(loss - their_loss) << "; logits max |difference| "
            << worst << "\n";
  EXPECT_GT(largest, 0.1);  // logits that mean something
  EXPECT_LT(worst, 1e-4 * std::max(1.0, largest))
      << "max |difference| " << worst << " at token " << at / c.vocab_size << ", id "
      << at % c.vocab_size << " (tandem " << ours[at] << ", PyTorch " << theirs[at] << ")";
  EXPECT_LT(std::abs(loss - their_loss), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Layouts, HfLlamaVariant, ::testing::ValuesIn(kVariants),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace hf_llama_test
}  // namespace tandem::train
