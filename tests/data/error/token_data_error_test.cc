// Token data a run cannot use, and the messages that say why: inputs that are missing, empty or
// binary or not well-formed UTF-8, input folders with link loops, vocabularies and thread counts
// out of range, output folders that cannot take the shards, leftovers of killed runs, a run
// stopped by SIGTERM, and shard folders that are truncated, foreign or from another tokenizer.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "support/cli.h"
#include "tandem/data/token_corpus.h"
#include "tandem/data/tokenizer.h"
#include "tandem/io/atomic_file.h"
#include "tandem/io/token_shards.h"
#include "train/token_test_util.h"

namespace tandem::data {
namespace {

using testing::ScratchDir;
using testing::user_error_of;
namespace fs = std::filesystem;

TEST(TokenizeErrors, BadInputs) {
  ScratchDir dir;
  TokenizeConfig c = train::testing::tiny_tokenize(dir, "out");
  c.inputs = {dir.path("none")};
  EXPECT_EQ(user_error_of([&] { tokenize(c); }), "input '" + dir.path("none") + "' does not exist");
  fs::create_directories(dir.path("empty"));
  c.inputs = {dir.path("empty")};
  EXPECT_EQ(user_error_of([&] { tokenize(c); }),
            "input folder '" + dir.path("empty") + "' holds no files");
  testing::write_bytes(dir.path("empty/e.txt"), "");
  EXPECT_EQ(user_error_of([&] { tokenize(c); }), "the corpus (1 file) holds no text");
  testing::write_bytes(dir.path("bin.dat"), std::string("ab\0cd", 5));
  c.inputs = {dir.path("bin.dat")};
  EXPECT_EQ(user_error_of([&] { tokenize(c); }),
            "text file '" + dir.path("bin.dat") +
                "' is binary (a NUL byte at offset 2); tokenize reads UTF-8 text");
  EXPECT_FALSE(fs::exists(dir.path("out")));
}

TEST(TokenizeErrors, NotUtf8) {
  ScratchDir dir;
  train::testing::write_corpus(dir);
  testing::write_bytes(dir.path("corpus/sub/latin1.txt"), "caf\xe9 au lait\n");
  TokenizeConfig c = train::testing::tiny_tokenize(dir, "out");
  EXPECT_EQ(user_error_of([&] { tokenize(c); }),
            "text file '" + dir.path("corpus/sub/latin1.txt") +
                "' is not UTF-8 text: byte 3 (0xe9) is not valid UTF-8");
  EXPECT_FALSE(fs::exists(dir.path("out")));  // nothing written half
  EXPECT_EQ(dir.list(), (std::vector<std::string>{"corpus"}));
}

TEST(TokenizeErrors, IllFormedUtf8) {
  // Sequences that look like UTF-8 but are not well-formed: each refused at its first byte.
  ScratchDir dir;
  train::testing::write_corpus(dir);
  TokenizeConfig c = train::testing::tiny_tokenize(dir, "first");
  tokenize(c);  // a tokenizer to encode with, trained once
  c.tokenizer = dir.path("first/tokenizer.model");
  const std::pair<const char*, const char*> cases[] = {
      {"ok \xED\xA0\x80 surrogate\n", "0xed"},      // U+D800, a surrogate
      {"ok \xE0\x80\x80 overlong\n", "0xe0"},       // U+0000 in three bytes
      {"ok \xC1\xBF overlong\n", "0xc1"},           // '\x7f' in two bytes
      {"ok \xF0\x8F\xBF\xBF overlong\n", "0xf0"},   // U+FFFF in four bytes
      {"ok \xF4\x90\x80\x80 too large\n", "0xf4"},  // U+110000
  };
  for (const auto& [text, byte] : cases) {
    testing::write_bytes(dir.path("bad.txt"), text);
    c.inputs = {dir.path("bad.txt")};
    c.output_dir = dir.path("out");
    EXPECT_EQ(user_error_of([&] { tokenize(c); }), "text file '" + dir.path("bad.txt") +
                                                       "' is not UTF-8 text: byte 3 (" + byte +
                                                       ") is not valid UTF-8");
    EXPECT_FALSE(fs::exists(dir.path("out")));
  }
  // The largest code point and the last ones before and after the surrogates are text.
  testing::write_bytes(dir.path("good.txt"), "ok \xF4\x8F\xBF\xBF \xED\x9F\xBF \xEE\x80\x80\n");
  c.inputs = {dir.path("good.txt")};
  EXPECT_NO_THROW(tokenize(c));
}

TEST(TokenizeErrors, VocabularySizes) {
  ScratchDir dir;
  train::testing::write_corpus(dir);
  TokenizeConfig c = train::testing::tiny_tokenize(dir, "out");
  c.vocab_size = 261;
  EXPECT_EQ(user_error_of([&] { tokenize(c); })
                .rfind("--vocab-size 261 is too small for this corpus: its characters, the 256 "
                       "byte tokens and the control tokens need at least ",
                       0),
            0u);
  c.vocab_size = 60000;
  EXPECT_EQ(
      user_error_of([&] {
        tokenize(c);
      }).rfind("--vocab-size 60000 is too large for this corpus: its text yields at most ", 0),
      0u);
}

TEST(TokenizeErrors, FlagsAreCheckedBeforeSentencePiece) {
  // SentencePiece's own check lines were printed for these.
  ScratchDir dir;
  train::testing::write_corpus(dir);
  TokenizeConfig c = train::testing::tiny_tokenize(dir, "out");
  for (int vocab : {1, 259}) {
    c.vocab_size = vocab;
    EXPECT_EQ(user_error_of([&] { tokenize(c); }),
              "--vocab-size " + std::to_string(vocab) +
                  " is too small: the 256 byte tokens and 3 control tokens come first, so a "
                  "vocabulary holds at least 260");
  }
  c.vocab_size = 320;
  c.threads = 100000;
  EXPECT_EQ(user_error_of([&] { tokenize(c); }),
            "--threads 100000 must be 0 (every core) or from 1 to 1024");
  EXPECT_EQ(dir.list(), (std::vector<std::string>{"corpus"}));
  c.threads = 200;  // encodes on 200; SentencePiece, which refuses more than 128, trains on 128
  EXPECT_EQ(tokenize(c).vocab_size, 320);
}

TEST(TokenizeErrors, LinkLoopsInAnInputFolder) {
  // A link to itself: "filesystem error: status: Too many levels of symbolic links" was printed.
  ScratchDir dir;
  train::testing::write_corpus(dir);
  fs::create_symlink("loop", dir.path("corpus/sub/loop"));
  EXPECT_EQ(user_error_of([&] { corpus_files({dir.path("corpus")}); }),
            "cannot read '" + dir.path("corpus/sub/loop") + "' in input folder '" +
                dir.path("corpus") + "': Too many levels of symbolic links");
  EXPECT_EQ(
      user_error_of([&] { corpus_files({dir.path("corpus/sub/loop")}); }),
      "cannot read input '" + dir.path("corpus/sub/loop") + "': Too many levels of symbolic links");
  // A link to nothing is no file, as before.
  fs::remove(dir.path("corpus/sub/loop"));
  fs::create_symlink("nowhere", dir.path("corpus/sub/dangling"));
  EXPECT_EQ(corpus_files({dir.path("corpus")}).size(), 3u);
}

// A process id that is no longer running: a child's, once it has exited.
long tokenize_dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

TEST(TokenizeErrors, LeftoversOfKilledRunsAreRemoved) {
  // A run killed (SIGKILL, a second SIGTERM) leaves OUT.tmp-<pid>-<random>; the next run to write
  // OUT removes it, but not the folder of a run still writing (it holds a claim on it).
  ScratchDir dir;
  train::testing::write_corpus(dir);
  const std::string dead = std::to_string(tokenize_dead_pid());
  for (const std::string& name : {"out.tmp-" + dead + "-abc", "out.tmp-" + dead + "-claimed"})
    fs::create_directories(dir.path(name) + "/x");
  io::FolderClaim claim;
  ASSERT_EQ(claim.claim(dir.path("out.tmp-" + dead + "-claimed")), 0);
  tokenize(train::testing::tiny_tokenize(dir, "out"));
  EXPECT_EQ(dir.list(),
            (std::vector<std::string>{"corpus", "out", "out.tmp-" + dead + "-claimed"}));
}

TEST(TokenizeErrors, StoppedBySigtermItWritesNothing) {
  // The first SIGTERM stops the run (after the tokenizer's training) and removes its temporary
  // folder; the command exits as the signal would have ended it. (The wait for the folder ends
  // too if the process does, so that a binary that cannot start fails the test, not hangs it.)
  ScratchDir dir;
  train::testing::write_corpus(dir);
  const auto r = testing::run_command(
      fmt::format("cd '{}' && {{ '{}' tokenize corpus --out out --vocab-size 320 --quiet & pid=$!; "
                  "while kill -0 $pid 2>/dev/null && ! ls -d out.tmp-* >/dev/null 2>&1 && "
                  "[ ! -e out ]; do :; done; "
                  "kill -TERM $pid; wait $pid; echo \"exit $?\"; }}",
                  dir.path(""), testing::tandem_binary()));
  EXPECT_NE(r.output.find("tandem tokenize: SIGTERM: stopping after the text being encoded, "
                          "writing nothing (again: stop at once)\n"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("exit 143"), std::string::npos) << r.output;
  EXPECT_EQ(dir.list(), (std::vector<std::string>{"corpus"}));
}

TEST(TokenizeErrors, OutputFolders) {
  ScratchDir dir;
  train::testing::write_corpus(dir);
  TokenizeConfig c = train::testing::tiny_tokenize(dir, "corpus");
  EXPECT_EQ(user_error_of([&] { tokenize(c); }),
            "output folder '" + dir.path("corpus") + "' is not empty; give a new or empty folder");
  c.output_dir = dir.path("corpus/a.txt/out");
  EXPECT_EQ(user_error_of([&] {
              tokenize(c);
            }).rfind("cannot create output folder '" + dir.path("corpus/a.txt/out") + "': ", 0),
            0u);
  c.output_dir = dir.path("corpus/a.txt");
  EXPECT_EQ(user_error_of([&] { tokenize(c); }), "output folder '" + dir.path("corpus/a.txt") +
                                                     "' is a file; give a new or empty folder");
}

class ShardErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    train::testing::write_corpus(dir_);
    tokenize(train::testing::tiny_tokenize(dir_, "shards"));
  }
  std::string shard() const { return dir_.path("shards/train-000001.bin"); }
  ScratchDir dir_;
};

TEST_F(ShardErrors, Truncated) {
  fs::resize_file(shard(), fs::file_size(shard()) - 1);
  EXPECT_EQ(user_error_of([&] { load_shard_corpus(dir_.path("shards")); }),
            "token shard '" + shard() +
                "' has 4063 bytes, but its header announces 2000 tokens of 2 bytes (4064 bytes: "
                "it is truncated)");
}

TEST_F(ShardErrors, WrongMagic) {
  std::string bytes = testing::read_bytes(shard());
  bytes[0] = 'X';
  testing::write_bytes(shard(), bytes);
  EXPECT_EQ(
      user_error_of([&] { load_shard_corpus(dir_.path("shards")); }),
      "token shard '" + shard() + "' is not a tandem token shard (its magic number is wrong)");
}

TEST_F(ShardErrors, AnotherTokenizer) {
  // A tokenizer of the same size trained on other text, and its shards.
  fs::create_directories(dir_.path("text2"));
  testing::write_bytes(dir_.path("text2/t.txt"), synthetic_text(20000, 99));
  TokenizeConfig other = train::testing::tiny_tokenize(dir_, "other");
  other.inputs = {dir_.path("text2")};
  tokenize(other);
  // One of its shards among these: its header names the other tokenizer.
  fs::copy_file(dir_.path("other/train-000001.bin"), shard(), fs::copy_options::overwrite_existing);
  const std::string message = user_error_of([&] { load_shard_corpus(dir_.path("shards")); });
  EXPECT_EQ(message.rfind(
                "token shard '" + shard() + "' was written with another tokenizer (SHA-256 ", 0),
            0u)
      << message;
  // The folder's tokenizer replaced: its SHA-256 is not the one the shards were written with.
  const std::string model = dir_.path("shards/tokenizer.model");
  fs::copy_file(dir_.path("other/tokenizer.model"), model, fs::copy_options::overwrite_existing);
  EXPECT_EQ(user_error_of([&] {
              load_shard_corpus(dir_.path("shards"));
            }).rfind("tokenizer '" + model + "' (SHA-256 ", 0),
            0u);
}

TEST_F(ShardErrors, TokenPastTheVocabulary) {
  std::string bytes = testing::read_bytes(shard());
  bytes[io::kShardHeaderBytes + 20] = '\xff';
  bytes[io::kShardHeaderBytes + 21] = '\xff';
  testing::write_bytes(shard(), bytes);
  const Corpus c = load_shard_corpus(dir_.path("shards"));
  std::vector<int32_t> out(2000);
  EXPECT_EQ(user_error_of([&] { c.train.read(2000, 2000, out.data()); }),
            "token shard '" + shard() +
                "' holds token id 65535 at token 10, at or past the vocabulary of 320 tokens");
}

TEST_F(ShardErrors, TruncatedWhileTheRunReadsIt) {
  // Mapped when opened, then cut by another program: reading its pages raised SIGBUS, which
  // killed the run without a word.
  const Corpus c = load_shard_corpus(dir_.path("shards"));
  fs::resize_file(shard(), 0);
  std::vector<int32_t> out(2000);
  EXPECT_EQ(user_error_of([&] { c.train.read(2000, 2000, out.data()); }),
            "token shard '" + shard() +
                "' changed while this run read it: tokens 0 to 1999 of its 2000 are no longer in "
                "the file (was it truncated or rewritten?)");
  c.train.read(0, 2000, out.data());  // the other shards read on
  EXPECT_EQ(user_error_of([&] { c.train.read(1990, 20, out.data()); }),
            "token shard '" + shard() +
                "' changed while this run read it: tokens 0 to 9 of its 2000 are no longer in "
                "the file (was it truncated or rewritten?)");
}

TEST_F(ShardErrors, NotAShardFolder) {
  EXPECT_EQ(user_error_of([&] { load_shard_corpus(dir_.path("corpus")); }),
            "data folder '" + dir_.path("corpus") +
                "' holds no shards.json: it is not a folder written by tandem tokenize");
  fs::remove(shard());
  EXPECT_EQ(user_error_of([&] { load_shard_corpus(dir_.path("shards")); }),
            "token shard '" + shard() + "' does not exist");
}

}  // namespace
}  // namespace tandem::data
