// Numbers a user gives, refused before any work with one message naming them: flags past their
// type or their sensible range (never wrapped, clamped or spun on), the environment's settings,
// a BLAS library that cannot be loaded, a process out of file descriptors, the address-space
// limit in the memory check, and `tandem eval`'s own memory check.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <string>
#include <vector>

#include "support/cli.h"
#include "tandem/nn/gpt.h"
#include "tandem/train/evaluate.h"
#include "tandem/train/model_config.h"
#include "train/test_util.h"

namespace tandem::train {
namespace {

using tandem::testing::run_command;
using tandem::testing::run_tandem;
using ::testing::HasSubstr;
using testing::ScratchDir;
using testing::user_error_of;

// A one-step run of the tiny model on one in-process rank, quick to refuse or to run.
const std::string kTiny =
    "--model tiny --dp 1 --tp 1 --steps 1 --eval-every 0 --executor plan --threads 1 --quiet";

// `tandem train <flags>` fails within seconds with exactly `message`.
void expect_refused(const std::string& flags, const std::string& message) {
  const auto begin = std::chrono::steady_clock::now();
  const auto r = run_tandem("train " + flags);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  EXPECT_EQ(r.status, 1) << flags << "\n" << r.output;
  EXPECT_EQ(r.output, "tandem: error: " + message + "\n") << flags;
  EXPECT_LT(s, 10.0) << flags;
}

TEST(Numbers, FlagsPastTheirTypeAreRefusedNotWrapped) {
  const std::string help = " (tandem train --help lists the flags)";
  expect_refused("--steps 99999999999999999999",
                 "--steps: '99999999999999999999' is out of range" + help);
  expect_refused("--seed -1", "--seed: '-1' must not be negative" + help);
  expect_refused("--warmup -99999999999999999999",
                 "--warmup: '-99999999999999999999' is out of range" + help);
  // Past an int: CLI11's own refusal.
  expect_refused("--layers 99999999999", "Could not convert: --layers = 99999999999" + help);
}

TEST(Numbers, SizesPastTheirRangeAreRefusedAtOnce) {
  expect_refused("--layers 2147483647", "--layers 2147483647 must be at most 65536");
  expect_refused("--d-model 2147483646 --heads 2", "--d-model 2147483646 must be at most 1048576");
  expect_refused("--d-model 100000000 --heads 2", "--d-model 100000000 must be at most 1048576");
  expect_refused("--seq-len 2000000000", "--seq-len 2000000000 must be at most 16777216");
  expect_refused("--d-model 1048576 --heads 2 --layers 65536",
                 "GPT config: the model would have 864692022145974272 parameters; at most "
                 "1099511627776 (2^40)");
  expect_refused("--batch 100000000 --seq-len 100000",
                 "--batch 100000000 x --seq-len 100000: a layer's largest activation would hold "
                 "5.12e+15 values (the MLP's, 512 wide); at most 2^40");
  expect_refused("--dp 65536 --tp 65536 --heads 65536 --d-model 65536",
                 "--dp 65536 x --tp 65536 x --pp 1 is 4294967296 ranks; at most 16777216");
  expect_refused("--threads 2147483647", "--threads 2147483647 must be 0 (automatic) to 1024");
}

// A checkpoint's meta.json whose size is past an int is refused, not wrapped to a negative.
TEST(Numbers, ModelConfigValuesPastAnIntAreRefused) {
  nlohmann::json j = model_config_to_json(testing::tiny_run(1).model);
  j["vocab_size"] = int64_t{1000000000000};
  EXPECT_EQ(user_error_of([&] { model_config_from_json(j, "meta.json"); }),
            "meta.json: the model config's 'vocab_size' (1000000000000) is out of range");
  j["vocab_size"] = 1 << 30;
  EXPECT_EQ(user_error_of([&] { model_config_from_json(j, "meta.json"); }),
            "meta.json: GPT config: vocab_size is 1073741824; it must be at most 16777216");
}

TEST(Numbers, EnvironmentSettingsAreCheckedBeforeTheRun) {
  auto run = [](const std::string& env) {
    return run_command(
        fmt::format("{} '{}' train {}", env, tandem::testing::tandem_binary(), kTiny));
  };
  for (const char* bad : {"abc", "-5", "inf", "nan"}) {
    const auto r = run(std::string("TANDEM_COMM_TIMEOUT=") + bad);
    EXPECT_EQ(r.status, 1) << r.output;  // not SIGABRT
    EXPECT_EQ(r.output, fmt::format("tandem: error: TANDEM_COMM_TIMEOUT={} is not a timeout: "
                                    "expected a number of seconds, 0 or more (0: wait forever; "
                                    "default 600)\n",
                                    bad));
  }
  auto r = run("TANDEM_COMM_TIMEOUT=1e10");
  EXPECT_EQ(r.output,
            "tandem: error: TANDEM_COMM_TIMEOUT=1e10 is too long a timeout: at most 1e+09 seconds "
            "(0: wait forever)\n");
  r = run("TANDEM_COMM_CHUNK_BYTES=99999999999999999999");
  EXPECT_EQ(r.output,
            "tandem: error: environment variable TANDEM_COMM_CHUNK_BYTES='99999999999999999999' "
            "is out of range (a 64-bit integer)\n");
  r = run("TANDEM_COMM_CHUNK_BYTES=-5");
  EXPECT_THAT(r.output, HasSubstr("TANDEM_COMM_CHUNK_BYTES=-5 is not a chunk size"));
  EXPECT_EQ(r.status, 1);
}

TEST(Numbers, ABlasLibraryThatCannotBeLoadedIsRefused) {
  ScratchDir dir;
  testing::write_bytes(dir.path("not-a-library.so"), "plain text\n");
  for (const std::string& lib : {dir.path("missing.so"), dir.path("not-a-library.so")}) {
    const auto r = run_command(fmt::format("TANDEM_BLAS_LIBRARY='{}' '{}' train {}", lib,
                                           tandem::testing::tandem_binary(), kTiny));
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_THAT(r.output,
                HasSubstr("tandem: error: TANDEM_BLAS_LIBRARY=" + lib + " cannot be loaded: "));
  }
}

// With almost no descriptors left the compiler cannot start; the message says why, rather than
// that the compiler does not run.
TEST(Numbers, RunningOutOfFileDescriptorsIsSaid) {
  ScratchDir dir;
  // The limit is set in an inner shell: the outer one's redirection (2>&1) would need more.
  const auto r = run_command(fmt::format(
      "sh -c \"ulimit -n 8; TANDEM_CACHE_DIR='{}' exec '{}' train --model tiny --dp 1 --tp 1 "
      "--steps 1 --eval-every 0 --executor compiled --threads 1 --quiet\"",
      dir.path("cache"), tandem::testing::tandem_binary()));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("has run out of file descriptors"));
  EXPECT_THAT(r.output, HasSubstr("(raise it with ulimit -n)"));
}

// Under `ulimit -v` the room under the limit is what the run has, however much the machine has.
TEST(Numbers, TheAddressSpaceLimitIsPartOfTheMemoryCheck) {
  const auto r = run_command(fmt::format(
      "ulimit -v 2000000; env -u TANDEM_MEMORY_LIMIT '{}' train --d-model 1024 --heads 8 "
      "--layers 8 --dp 1 --tp 1 --steps 1 --executor plan --quiet",
      tandem::testing::tandem_binary()));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output,
              HasSubstr("the room under the address-space limit (ulimit -v) of 1.91 GiB"));
}

// Evaluation's activations grow with --batch up to the data's window count: refused up front
// like training's.
TEST(Numbers, EvalHasTheMemoryCheck) {
  const nn::GPTConfig c = testing::tiny_run(1).model;
  const nn::ParameterSet params(c);
  const std::vector<uint8_t> tokens(100000, 'a');
  ::setenv("TANDEM_MEMORY_LIMIT", "2MiB", 1);
  const std::string e = user_error_of([&] { evaluate_windows(params, tokens, 16, 100000000, 0); });
  ::unsetenv("TANDEM_MEMORY_LIMIT");
  EXPECT_THAT(e, HasSubstr("this evaluation needs about "));
  EXPECT_THAT(e, HasSubstr("for 6249 windows of 16 tokens at a time), but 2.00 MiB is available "
                           "(TANDEM_MEMORY_LIMIT). To fit, give a smaller --batch"));
}

}  // namespace
}  // namespace tandem::train
