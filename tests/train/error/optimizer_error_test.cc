// The optimizer's settings: each bad one is refused with a message naming the flag.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>

#include "tandem/train/optimizer.h"
#include "train/test_util.h"

namespace tandem::train {
namespace {

using testing::user_error_of;

TEST(OptimizerErrors, EachBadSettingNamesItsFlag) {
  OptimizerConfig c;
  c.grad_dtype = "f16";
  EXPECT_EQ(user_error_of([&] { c.validate(); }), "--grad-dtype f16: the gradient dtypes are f32 and bf16");
  c = OptimizerConfig{};
  c.name = "sgd";
  EXPECT_EQ(user_error_of([&] { c.validate(); }), "--optimizer sgd: the optimizers are adamw and lamb");
  c = OptimizerConfig{};
  c.beta1 = 1.0;
  EXPECT_EQ(user_error_of([&] { c.validate(); }), "--beta1 1 must be in [0, 1)");
  c = OptimizerConfig{};
  c.exchange = "sideways";
  EXPECT_EQ(user_error_of([&] { c.validate(); }),
            "--grad-exchange sideways: the exchanges are overlap (with the backward) and after (the backward)");
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

TEST(OptimizerErrors, ABucketLargerThanTheModelIsRefusedBeforeTraining) {
  TrainConfig c = testing::tiny_run(2);
  c.optimizer.bucket_mb = 64.0;
  EXPECT_EQ(user_error_of([&] { train(c); }),
            "--bucket-mb 64: the model's parameters are 0.04 MiB; a bucket must be smaller");
}

}  // namespace
}  // namespace tandem::train
