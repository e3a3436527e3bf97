// Token shards that change under a run: the run stops with one error naming the shard, and under
// --save the model trained so far is kept, as after SIGTERM.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <ostream>
#include <regex>
#include <streambuf>
#include <string>

#include "tandem/data/token_corpus.h"
#include "tandem/data/tokenize.h"
#include "tandem/train/evaluate.h"
#include "tandem/train/trainer.h"
#include "train/test_util.h"
#include "train/token_test_util.h"

namespace tandem::train {
namespace {

namespace fs = std::filesystem;
using testing::ScratchDir;
using testing::user_error_of;

// An output that empties every token shard of `folder` at its first write: the run's first line
// comes after its data is opened and mapped, so the shards change under the running job.
class TruncatingOnFirstWrite : public std::streambuf {
 public:
  explicit TruncatingOnFirstWrite(std::string folder) : folder_(std::move(folder)) {}

 protected:
  int overflow(int c) override {
    truncate();
    return c;
  }
  std::streamsize xsputn(const char*, std::streamsize n) override {
    truncate();
    return n;
  }

 private:
  void truncate() {
    if (done_) return;
    done_ = true;
    for (const auto& e : fs::directory_iterator(folder_))
      if (e.path().extension() == ".bin") fs::resize_file(e.path(), 0);
  }
  std::string folder_;
  bool done_ = false;
};

TEST(ChangedData, ATruncatedShardStopsTheRunWithItsNameAndKeepsTheModel) {
  ScratchDir dir;
  testing::write_corpus(dir);
  data::tokenize(testing::tiny_tokenize(dir, "shards"));
  TrainConfig c = testing::tiny_run(20);
  c.data = dir.path("shards");
  c.model.vocab_size = data::data_vocab_size(c.data);
  c.eval_every = 0;
  c.save_dir = dir.path("ck");
  TruncatingOnFirstWrite truncating(dir.path("shards"));
  std::ostream out(&truncating);
  c.out = &out;
  const std::string m = user_error_of([&] { train(c); });
  std::smatch got;
  ASSERT_TRUE(std::regex_match(
      m, got,
      std::regex("token shard '.*\\.bin' changed while this run read it: tokens [0-9]+ to [0-9]+ "
                 "of its [0-9]+ are no longer in the file \\(was it truncated or rewritten\\?\\); "
                 "training stopped before step ([0-9]+); the checkpoint at step ([0-9]+) is saved "
                 "in '.*/ck/step-0*\\2': resume from it once the data is whole")))
      << m;
  EXPECT_EQ(std::stoll(got[2]) + 1, std::stoll(got[1]));
  EXPECT_EQ(load_model(dir.path("ck")).meta.step, std::stoll(got[2]));
}

}  // namespace
}  // namespace tandem::train
