// Checkpoints streamed tensor by tensor: the writer's files equal save_checkpoint's whatever the
// pieces and the interleaving of the two parts; a writer killed or failing at any point leaves the
// old checkpoint whole; the reader checks everything up front, reads tensors whole (verified) or
// by range, resolves a series, and skips the optimizer state when asked.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "support/files.h"
#include "support/scratch.h"
#include "tandem/core/error.h"
#include "tandem/io/checkpoint.h"
#include "tandem/io/checkpoint_series.h"

namespace tandem::io {
namespace {

using testing::ScratchDir;
using testing::user_error_of;

Tensor filled(DType t, Shape shape, float base) {
  Tensor x = Tensor::empty(t, std::move(shape));
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, base + static_cast<float>(i) * 0.125f);
  return x;
}

Checkpoint sample(int64_t step) {
  Checkpoint c;
  c.meta.model_config = {{"d_model", 8}, {"layers", 1}};
  c.meta.step = step;
  c.meta.optimizer = "adamw";
  const float s = static_cast<float>(step);
  c.weights = {{"wte.weight", filled(DType::F32, Shape{64, 8}, s)},
               {"h.0.attn.c_attn.weight", filled(DType::F32, Shape{8, 24}, -s)},
               {"h.0.ln_1.weight", filled(DType::BF16, Shape{8}, 1.0f)}};
  c.optimizer = {{"m.wte.weight", filled(DType::F32, Shape{64, 8}, 0.5f * s)},
                 {"v.wte.weight", filled(DType::F32, Shape{64, 8}, 2.0f)}};
  return c;
}

const Tensor& by_name(const std::vector<NamedTensor>& tensors, const std::string& name) {
  for (const NamedTensor& t : tensors)
    if (t.name == name) return t.tensor;
  throw std::runtime_error("no tensor " + name);
}

// Streams `c` into `dir` with pieces of at most `piece` bytes, alternating the two parts tensor
// by tensor; stops (returning false) after `stop_after` pieces when it is given.
bool stream(const std::string& dir, const Checkpoint& c, size_t piece,
            const FolderWriteHooks& hooks = {}, int stop_after = -1) {
  CheckpointWriter w(dir, c.meta, tensor_specs(c.weights), tensor_specs(c.optimizer), hooks);
  int pieces = 0;
  const CheckpointPart parts[] = {CheckpointPart::Weights, CheckpointPart::Optimizer};
  size_t index[2] = {0, 0};
  while (index[0] < w.order(parts[0]).size() || index[1] < w.order(parts[1]).size()) {
    for (int p = 0; p < 2; ++p) {
      if (index[p] >= w.order(parts[p]).size()) continue;
      const TensorSpec& spec = w.order(parts[p])[index[p]++];
      const Tensor& t = by_name(p == 0 ? c.weights : c.optimizer, spec.name);
      const char* bytes = static_cast<const char*>(t.data());
      for (size_t at = 0; at < t.nbytes(); at += piece) {
        if (pieces++ == stop_after) return false;
        w.append(parts[p], bytes + at, std::min(piece, t.nbytes() - at));
      }
      EXPECT_EQ(w.next(parts[p]), index[p]);
    }
  }
  w.commit();
  return true;
}

void expect_same(const Checkpoint& got, const Checkpoint& want) {
  EXPECT_EQ(got.meta, want.meta);
  for (const auto* part : {&want.weights, &want.optimizer}) {
    const auto& got_part = part == &want.weights ? got.weights : got.optimizer;
    ASSERT_EQ(got_part.size(), part->size());
    for (const NamedTensor& t : *part) {
      const Tensor& g = by_name(got_part, t.name);
      ASSERT_EQ(g.shape(), t.tensor.shape()) << t.name;
      EXPECT_EQ(std::memcmp(g.data(), t.tensor.data(), t.tensor.nbytes()), 0) << t.name;
    }
  }
}

TEST(CheckpointStream, WritesWhatSaveCheckpointWrites) {
  ScratchDir dir;
  const Checkpoint c = sample(3);
  save_checkpoint(dir.path("whole"), c);
  for (size_t piece : {5, 32, 100000}) {
    stream(dir.path("streamed"), c, piece);
    for (std::string_view f : {kWeightsFile, kOptimizerFile, kMetaFile})
      EXPECT_EQ(testing::read_bytes(dir.path("streamed/" + std::string(f))),
                testing::read_bytes(dir.path("whole/" + std::string(f))))
          << f << " in pieces of " << piece;
  }
  EXPECT_EQ(dir.list(), (std::vector<std::string>{"streamed", "whole"}));
  expect_same(load_checkpoint(dir.path("streamed")), c);
}

TEST(CheckpointStream, StreamsIntoASeries) {
  ScratchDir dir;
  const Checkpoint c = sample(5);
  save_in_series(dir.path("whole"), c, 2);
  const std::string folder = save_in_series(
      dir.path("ck"), c.meta, tensor_specs(c.weights), tensor_specs(c.optimizer),
      [&](CheckpointWriter& w) {
        // The weights row by row (8 floats), the optimizer state whole.
        for (const TensorSpec& spec : w.order(CheckpointPart::Weights)) {
          const Tensor& t = by_name(c.weights, spec.name);
          for (size_t at = 0; at < t.nbytes(); at += 32)
            w.append(CheckpointPart::Weights, static_cast<const char*>(t.data()) + at,
                     std::min<size_t>(32, t.nbytes() - at));
        }
        w.append_tensors(CheckpointPart::Optimizer, c.optimizer);
      },
      2);
  EXPECT_EQ(folder, dir.path("ck/step-00000005"));
  EXPECT_EQ(resolve_checkpoint(dir.path("ck")), folder);
  for (std::string_view f : {kWeightsFile, kOptimizerFile, kMetaFile})
    EXPECT_EQ(testing::read_bytes(folder + "/" + std::string(f)),
              testing::read_bytes(dir.path("whole/step-00000005/" + std::string(f))));
}

TEST(CheckpointStream, ReaderChecksUpFrontAndReadsOnDemand) {
  ScratchDir dir;
  const Checkpoint c = sample(4);
  save_in_series(dir.path("ck"), c, 2);
  const CheckpointReader r(dir.path("ck"));
  EXPECT_EQ(r.folder(), dir.path("ck/step-00000004"));
  EXPECT_EQ(r.meta(), c.meta);
  EXPECT_TRUE(r.weights().has_checksums());
  EXPECT_EQ(r.weights().metadata(), (SafetensorsMetadata{{"format", "pt"}}));
  // One tensor whole, verified, into the caller's memory; a row range of another.
  const size_t i = r.weights().index_of("wte.weight", Shape{64, 8});
  std::vector<float> wte(64 * 8);
  r.weights().read(i, wte.data(), wte.size() * 4);
  EXPECT_EQ(wte[9], by_name(c.weights, "wte.weight").get(9));
  std::vector<float> rows(2 * 8);  // rows 10 and 11
  r.optimizer().read_range(r.optimizer().index_of("v.wte.weight"), 10 * 32, 12 * 32, rows.data());
  EXPECT_EQ(rows[0], by_name(c.optimizer, "v.wte.weight").get(80));
  expect_same(r.read_all(), c);

  // Without the optimizer state, its file may be missing.
  std::filesystem::remove(dir.path("ck/step-00000004/optimizer.safetensors"));
  const CheckpointReader light(dir.path("ck"), /*with_optimizer=*/false);
  EXPECT_TRUE(light.read_all().optimizer.empty());
  EXPECT_THROW(light.optimizer(), InternalError);
  EXPECT_EQ(user_error_of([&] { CheckpointReader(dir.path("ck")); }),
            "checkpoint '" + dir.path("ck/step-00000004") +
                "' is incomplete: it has no optimizer.safetensors");
}

TEST(CheckpointStream, ADamagedTensorIsRefusedNamingItAndTheFile) {
  ScratchDir dir;
  const std::string ck = dir.path("ck");
  save_checkpoint(ck, sample(1));
  std::string w = testing::read_bytes(ck + "/weights.safetensors");
  w[w.size() - 3] ^= 0x10;  // inside the last tensor of the data section: the bf16 one
  testing::write_bytes(ck + "/weights.safetensors", w);
  const CheckpointReader r(ck);  // the headers are sound
  const std::string want = "tensor 'h.0.ln_1.weight' in '" + ck +
                           "/weights.safetensors' does not match its checksum: the file is "
                           "damaged or was altered";
  EXPECT_EQ(user_error_of([&] { r.read_all(); }), want);
  EXPECT_EQ(user_error_of([&] { load_checkpoint(ck, false); }), want);
  EXPECT_NO_THROW(r.weights().read_tensor(r.weights().index_of("wte.weight")));
  // A damaged header is refused before any tensor is read.
  w = testing::read_bytes(ck + "/optimizer.safetensors");
  w[20] ^= 0x01;
  testing::write_bytes(ck + "/optimizer.safetensors", w);
  const std::string m = user_error_of([&] { CheckpointReader{ck}; });
  EXPECT_EQ(m.rfind("corrupt safetensors file '" + ck + "/optimizer.safetensors': ", 0), 0u) << m;
}

// Killed after any number of pieces, or at any stage of the swap: the checkpoint a later run
// loads is the old one or the new one, whole.
TEST(CheckpointStream, AKilledWriterLeavesTheOldOrTheNewCheckpoint) {
  struct Kill {
    int after_pieces;
    const char* stage;
  };
  const std::vector<Kill> kills = {{0, nullptr},
                                   {1, nullptr},
                                   {7, nullptr},
                                   {-1, "wrote weights.safetensors"},
                                   {-1, "wrote meta.json"},
                                   {-1, "exchanged"},
                                   {-1, "removed old"}};
  for (const Kill& k : kills) {
    SCOPED_TRACE(k.stage ? k.stage : std::to_string(k.after_pieces) + " pieces");
    ScratchDir dir;
    const std::string ck = dir.path("ck");
    save_checkpoint(ck, sample(1));
    const pid_t pid = ::fork();
    if (pid == 0) {
      FolderWriteHooks hooks;
      hooks.after = [&](std::string_view s) {
        if (k.stage != nullptr && s == k.stage) ::_exit(42);
      };
      try {
        if (!stream(ck, sample(2), 64, hooks, k.after_pieces)) ::_exit(42);
      } catch (...) {
        ::_exit(1);
      }
      ::_exit(0);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status));
    if (WEXITSTATUS(status) == 0) continue;  // no such stage on this filesystem
    ASSERT_EQ(WEXITSTATUS(status), 42);
    const Checkpoint back = load_checkpoint(ck);
    const bool committed = k.stage != nullptr && (std::string_view(k.stage) == "exchanged" ||
                                                  std::string_view(k.stage) == "removed old");
    EXPECT_EQ(back.meta.step, committed ? 2 : 1);
    expect_same(back, sample(back.meta.step));
    // The next save clears what the killed one left.
    save_checkpoint(ck, sample(3));
    EXPECT_EQ(dir.list(), std::vector<std::string>{"ck"});
  }
}

TEST(CheckpointStream, AnAbandonedOrFailingWriterLeavesTheOldCheckpoint) {
  ScratchDir dir;
  const std::string ck = dir.path("ck");
  save_checkpoint(ck, sample(1));
  EXPECT_FALSE(stream(ck, sample(2), 64, {}, 3));  // destroyed without commit
  EXPECT_EQ(dir.list(), std::vector<std::string>{"ck"});
  expect_same(load_checkpoint(ck), sample(1));
  {
    testing::FileSizeLimit limit(1024);  // the disk fills up during the first tensor
    EXPECT_EQ(user_error_of([&] { stream(ck, sample(2), 64); }),
              "cannot write '" + ck +
                  "/weights.safetensors': File too large; the previous "
                  "contents of '" +
                  ck + "' are unchanged");
  }
  EXPECT_EQ(dir.list(), std::vector<std::string>{"ck"});
  expect_same(load_checkpoint(ck), sample(1));
}

}  // namespace
}  // namespace tandem::io
