// The optimizer's settings and the choices the train command names: each bad one is refused with a
// message naming the flag.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>

#include "support/cli.h"
#include "tandem/parallel/optimizer.h"
#include "train/test_util.h"

namespace tandem::train {
namespace {

using testing::user_error_of;

TEST(OptimizerErrors, EachBadSettingNamesItsFlag) {
  using parallel::OptimizerConfig;
  OptimizerConfig c;
  c.grad_dtype = DType::F16;
  EXPECT_EQ(user_error_of([&] { c.validate(); }),
            "--grad-dtype f16: the gradient dtypes are f32 and bf16");
  c = OptimizerConfig{};
  c.beta1 = 1.0;
  EXPECT_EQ(user_error_of([&] { c.validate(); }), "--beta1 1 must be in [0, 1)");
  c = OptimizerConfig{};
  c.bucket_mb = 0.0;
  EXPECT_EQ(user_error_of([&] { c.validate(); }), "--bucket-mb 0 must be a positive number of MiB");
  c.bucket_mb = -1.0;
  EXPECT_EQ(user_error_of([&] { c.validate(); }),
            "--bucket-mb -1 must be a positive number of MiB");
  c = OptimizerConfig{};
  for (const double bad : {-1.0, 0.0, std::nan("")}) {
    c.clip_grad_norm = bad;
    EXPECT_EQ(
        user_error_of([&] { c.validate(); }),
        fmt::format(
            "--clip-grad-norm {} must be a positive number (the largest norm of the gradient)",
            bad));
  }
}

// Names are parsed once, on the command line.
TEST(OptimizerErrors, UnknownNamesAreRefusedByTheCommand) {
  const std::pair<const char*, const char*> cases[] = {
      {"train --grad-dtype f16",
       "--grad-dtype f16: the gradient dtypes are f32 and bf16 (or auto: the autotuner's choice)"},
      {"train --optimizer sgd", "--optimizer sgd: the optimizers are adamw and lamb"},
      {"train --grad-exchange sideways",
       "--grad-exchange sideways: the exchanges are overlap (with the backward) and after (the "
       "backward)"},
      {"train --backend tcp", "--backend 'tcp' is not a backend; choose thread or mpi"},
      {"train --executor fast", "--executor 'fast': the executors are compiled, plan, reference"},
  };
  for (const auto& [args, message] : cases) {
    const auto r = tandem::testing::run_tandem(args);
    EXPECT_EQ(r.status, 1) << args;
    EXPECT_EQ(r.output, std::string("tandem: error: ") + message + "\n") << args;
  }
}

TEST(OptimizerErrors, ABucketLargerThanTheModelIsRefusedBeforeTraining) {
  TrainConfig c = testing::tiny_run(2);
  c.optimizer.bucket_mb = 64.0;
  EXPECT_EQ(user_error_of([&] { train(c); }),
            "--bucket-mb 64: the model's parameters are 0.04 MiB; a bucket must be smaller");
}

// A disk too full for the moments' file (a file-size limit fails fallocate the same way) says the
// file is for the optimizer state, not for swapped activations.
TEST(OptimizerErrors, AFullDiskForTheOptimizerStateSaysSo) {
  testing::ScratchDir dir;
  TrainConfig c = testing::tiny_run(1);
  c.optimizer.state_tier = ooc::TierSpec::parse("file:" + dir.path("moments"));
  std::string message;
  {
    testing::FileSizeLimit limit(4096);
    message = user_error_of([&] { train(c); });
  }
  EXPECT_NE(message.find("for the optimizer state (--optimizer-state): File too large"),
            std::string::npos)
      << message;
}

}  // namespace
}  // namespace tandem::train
