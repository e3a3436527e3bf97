// A schedule forced with TANDEM_SCHEDULE_<PROGRAM> that does not parse ends the run before
// training with one error naming the variable and the name.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "train/test_util.h"

namespace tandem::train {
namespace {

using testing::user_error_of;

TEST(ScheduleErrors, AMisspeltForcedScheduleNamesTheVariable) {
  ::setenv("TANDEM_SCHEDULE_ADAM", "fusd(RS-C-AG)", 1);
  const std::string message = user_error_of([] { train(testing::tiny_run(1)); });
  ::unsetenv("TANDEM_SCHEDULE_ADAM");
  EXPECT_EQ(
      message.substr(0, message.find("; a schedule name is")),
      "rank 0 of 1: TANDEM_SCHEDULE_ADAM=fusd(RS-C-AG): program 'adam': schedule 'fusd(RS-C-AG)': "
      "'fusd(RS-C-AG)' is not a schedule part");
}

}  // namespace
}  // namespace tandem::train
