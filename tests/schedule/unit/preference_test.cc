// Choosing from a preference list (schedule::first_allowed): the first name the program allows,
// well-formed names it does not allow passed over; and Recipe::try_apply, which says why a recipe
// does not apply without raising an error.
#include "tandem/schedule/preference.h"

#include <gtest/gtest.h>

#include <string>

#include "tandem/core/error.h"
#include "tandem/dsl/workloads.h"

namespace tandem::schedule {
namespace {

TEST(Preference, TheFirstNameTheProgramAllows) {
  const dsl::Program adam = dsl::workloads::adam();
  // A matmul overlap does not apply to Adam: passed over.
  auto chosen = first_allowed(adam, {"ol(MM,AR-C)", "RS-C-AG", "AR-C"}, "test");
  ASSERT_TRUE(chosen.has_value());
  EXPECT_EQ(chosen->schedule.name, "RS-C-AG");
  EXPECT_EQ(chosen->schedule.schedule.name(), "RS-C-AG");
  EXPECT_EQ(chosen->index, 1u);
  chosen = first_allowed(adam, {"fused(RS-C-AG)+slice(m,v)", "AR-C"}, "test");
  ASSERT_TRUE(chosen.has_value());
  EXPECT_EQ(chosen->schedule.name, "fused(RS-C-AG)+slice(m,v)");
  EXPECT_EQ(chosen->index, 0u);
  EXPECT_FALSE(first_allowed(adam, {"ol(MM,AR-C)"}, "test").has_value());
  EXPECT_FALSE(first_allowed(adam, {}, "test").has_value());
}

TEST(Preference, TryApplySaysWhyTheProgramDoesNotAllowARecipe) {
  const dsl::Program adam = dsl::workloads::adam();
  const std::string why =
      "schedule 'ol(MM,AR-C)', collective 1 (g_sum): ol(MM,...) overlaps a collective with the "
      "matmul producing its "
      "input, but its input g is computed by input";
  const Applied no = Recipe::parse("ol(MM,AR-C)").try_apply(adam);
  EXPECT_FALSE(no.schedule.has_value());
  EXPECT_EQ(no.why, why);
  // apply() raises the same message.
  try {
    Recipe::parse("ol(MM,AR-C)").apply(adam);
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), why);
  }
  const Applied yes = Recipe::parse("RS-C-AG").try_apply(adam);
  ASSERT_TRUE(yes.schedule.has_value());
  EXPECT_EQ(yes.schedule->name(), "RS-C-AG");
  EXPECT_EQ(yes.why, "");
  // A part count the program does not take, and a fusion with nothing to fuse.
  EXPECT_NE(
      Recipe::parse("AR-C|AR-C").try_apply(adam).why.find("has 2 parts, but program 'adam' has 1"),
      std::string::npos);
  EXPECT_NE(Recipe::parse("RS-C-AG+slice(q)").try_apply(adam).why.find("no stage named 'q'"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem::schedule
