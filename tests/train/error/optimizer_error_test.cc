// The optimizer's settings: each bad one is refused with a message naming the flag.
#include <gtest/gtest.h>

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
}

}  // namespace
}  // namespace tandem::train
