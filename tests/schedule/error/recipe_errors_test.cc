// Every bad schedule name is one UserError that quotes the name and says what is wrong: names
// that do not parse, and names a program does not allow (the messages a user reads from
// `tandem emit --schedule`, TANDEM_SCHEDULE_<PROGRAM> and `tandem tune --only`).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "schedule/testing.h"
#include "tandem/core/error.h"
#include "tandem/schedule/preference.h"
#include "tandem/schedule/transforms.h"

namespace tandem::schedule {
namespace {

std::string parse_error(const std::string& name) {
  try {
    Recipe::parse(name);
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

std::string apply_error(const dsl::Program& p, const std::string& name) {
  try {
    schedule_by_name(p, name);
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

// The message up to the grammar reminder every parse error ends with.
std::string head(const std::string& e) { return e.substr(0, e.find("; a schedule name is")); }

TEST(RecipeErrors, NamesThatDoNotParse) {
  EXPECT_EQ(head(parse_error("fastest")), "schedule 'fastest': 'fastest' is not a schedule part");
  EXPECT_EQ(head(parse_error("")), "schedule '': the name is empty");
  EXPECT_EQ(head(parse_error("AR-C|")),
            "schedule 'AR-C|': an empty part (two '|' in a row, or one at an end)");
  EXPECT_EQ(head(parse_error("AR-C+fast")),
            "schedule 'AR-C+fast': '+fast' follows the parts; the only suffix is "
            "+slice(INPUT,...)");
  EXPECT_EQ(head(parse_error("AR-C+slice(m")),
            "schedule 'AR-C+slice(m': '+slice(' must end the name with ')'");
  EXPECT_EQ(head(parse_error("AR-C+slice(m,m)")),
            "schedule 'AR-C+slice(m,m)': '+slice(m,m)' lists 'm' twice");
  EXPECT_EQ(head(parse_error("AR-C+slice(m,)")),
            "schedule 'AR-C+slice(m,)': '+slice(m,)' must list input names (letters, digits, '_' "
            "and '.') "
            "separated by ','");
  EXPECT_EQ(head(parse_error("ol(AR-C)")),
            "schedule 'ol(AR-C)': 'ol(AR-C)' overlaps nothing: an overlap names MM (the matmul "
            "producing the "
            "collective's input), P2P (the send its result reaches), or both");
  EXPECT_EQ(head(parse_error("ol[0](MM,AR-C)")),
            "schedule 'ol[0](MM,AR-C)': in 'ol[0](MM,AR-C)', an overlap's block count is written "
            "ol[BLOCKS] with "
            "BLOCKS a whole number from 1 to 999999 without leading zeros");
  EXPECT_NE(parse_error("ol[08](MM,AR-C)").find("without leading zeros"), std::string::npos);
  EXPECT_NE(parse_error("ol[x](MM,AR-C)").find("an overlap's block count is written"),
            std::string::npos);
  EXPECT_EQ(head(parse_error("ol[4](MM,AR-C)")),
            "schedule 'ol[4](MM,AR-C)': in 'ol[4](MM,AR-C)', 4 blocks is the default: write "
            "ol(...) without [4]");
  EXPECT_EQ(head(parse_error("ol(MM,AR-X)")),
            "schedule 'ol(MM,AR-X)': in 'ol(MM,AR-X)', 'AR-X' is not a schedule part");
  EXPECT_EQ(head(parse_error("ol(MM,RS-C-AG)-AG")),
            "schedule 'ol(MM,RS-C-AG)-AG': in 'ol(MM,RS-C-AG)-AG', ol(...)-AG closes the overlap "
            "before the gather, "
            "so it holds a part that sends its slices (RS-C-P2P, RS-fused(C)-P2P or "
            "fused(RS-C)-P2P), not 'RS-C-AG'");
  EXPECT_EQ(head(parse_error("ol(RS-C-P2P-AG,P2P)")),
            "schedule 'ol(RS-C-P2P-AG,P2P)': in 'ol(RS-C-P2P-AG,P2P)', a part that sends its "
            "slices overlaps with "
            "its send as ol(RS-C-P2P)-AG");
  EXPECT_EQ(head(parse_error("fused(AR-C)|AR-C")),
            "schedule 'fused(AR-C)|AR-C': part 2 leaves its computations unfused (C) while another "
            "part fuses loops; "
            "loop fusion is program-wide, so write AR-fused(C)");
  EXPECT_NE(
      parse_error("fastest").find("; a schedule name is one part per collective joined by '|'"),
      std::string::npos);
}

TEST(RecipeErrors, NamesTheProgramDoesNotAllow) {
  const dsl::Program adam = dsl::workloads::adam();
  EXPECT_EQ(apply_error(adam, "ol(MM,AR-C)"),
            "program 'adam': schedule 'ol(MM,AR-C)', collective 1 (g_sum): ol(MM,...) overlaps a "
            "collective with the "
            "matmul producing its input, but its input g is computed by input");
  EXPECT_EQ(apply_error(adam, "ol(AR-C,P2P)"),
            "program 'adam': schedule 'ol(AR-C,P2P)', collective 1 (g_sum): ol(...,P2P) overlaps a "
            "collective with "
            "the send its result reaches, but no send follows it");
  EXPECT_EQ(apply_error(adam, "RS-C-P2P-AG"),
            "program 'adam': schedule 'RS-C-P2P-AG', collective 1 (g_sum): no send or receive "
            "consumes its result "
            "where it could carry the slice, so RS-C-P2P-AG would be RS-C-AG; write that");
  EXPECT_EQ(apply_error(adam, "fused(RS-AG)-C"),
            "program 'adam': schedule 'fused(RS-AG)-C', collective 1 (g_sum): no computation on "
            "its result can run "
            "inside it (on each reduced chunk), so there is nothing to fuse into it");
  EXPECT_EQ(apply_error(adam, "AR-C|AR-C"),
            "program 'adam': schedule 'AR-C|AR-C' has 2 parts, but program 'adam' has 1 "
            "collective(s) (g_sum); give "
            "one part for all of them or one per collective, in program order, joined by '|'");
  EXPECT_EQ(apply_error(adam, "C"),
            "program 'adam': schedule 'C': program 'adam' has 1 collective(s) (g_sum); name a part "
            "for them (AR-C, "
            "...)");
  // as_slice's own rule, named by as_slice.
  EXPECT_NE(apply_error(adam, "AR-C+slice(m)").find("program 'adam': as_slice"), std::string::npos)
      << apply_error(adam, "AR-C+slice(m)");
  EXPECT_NE(apply_error(adam, "RS-C-AG+slice(q)").find("no stage named 'q'"), std::string::npos);
}

TEST(RecipeErrors, ProgramsWithoutCollectives) {
  dsl::Program axpy("axpy");
  {
    using namespace tandem::dsl;  // NOLINT
    const Expr x = axpy.input(F32, {"N"}, Replicated, "x");
    axpy.output((x + x).named("y"), "y");
  }
  EXPECT_EQ(apply_error(axpy, "AR-C"),
            "program 'axpy': schedule 'AR-C': program 'axpy' has no AllReduce of at least one dim, "
            "so it takes no "
            "per-collective part; its schedules are C and fused(C)");
  EXPECT_EQ(apply_error(axpy, "fused(C)"),
            "program 'axpy': schedule 'fused(C)': no two element-wise computations of program "
            "'axpy' can share a "
            "loop, so fused(C) is C");
}

TEST(RecipeErrors, ReorderThatMovesNothing) {
  // z's only consumer reads it through a matmul, which does not run on a row slice here.
  dsl::Program p("reduce_then_matmul");
  {
    using namespace tandem::dsl;  // NOLINT
    const Expr g = p.input(F32, {"N", "N"}, Local, "g");
    const Expr w = p.input(F32, {"N", "N"}, Replicated, "w");
    const Expr z = AllReduce(Sum, g).named("z");
    p.output(matmul(w, z).named("y"), "y");
  }
  EXPECT_EQ(apply_error(p, "RS-C-AG"),
            "program 'reduce_then_matmul': schedule 'RS-C-AG', collective 1 (z): nothing that "
            "consumes its result "
            "can run on this rank's slice, so reorder would change nothing; split it without "
            "reordering (RS-AG-C)");
}

TEST(RecipeErrors, EnumerateOneCollectiveOfAnother) {
  const dsl::Program adam = dsl::workloads::adam();
  try {
    enumerate_collective(adam, std::vector<CollectiveRecipe>(1), 1);
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()),
              "enumerate_collective: program 'adam' has 1 collective(s); got 1 part(s) and "
              "collective index 1");
  }
}

// A name of any length gives one short line: a name 18 000 overlaps deep gave a 324 KB message.
// Names and their parts are shown cut in the middle, with their length; control characters as '?'.
TEST(RecipeErrors, LongNamesAreAbbreviated) {
  std::string deep;
  for (int i = 0; i < 18000; ++i) deep += "ol(";
  deep += "AR-C";
  for (int i = 0; i < 18000; ++i) deep += ")";
  const std::string message = parse_error(deep);
  EXPECT_LT(message.size(), 1000u) << message.size();
  EXPECT_EQ(head(message),
            "schedule 'ol(ol(ol(ol(ol(ol(ol(ol(ol(ol(ol(ol(ol(...))))))))))))))))))) (72004 "
            "characters)': 'ol(ol(ol(ol(ol(ol(ol(ol(ol...)))))))))))) (72004 characters)' overlaps "
            "nothing: an overlap names MM (the matmul producing the collective's input), P2P (the "
            "send its result reaches), or both");
  for (const std::string& name :
       {"AR-C+slice(" + std::string(20000, 'a') + ",a,a)", "AR-C+" + std::string(20000, 'q'),
        "ol(MM," + std::string(20000, 'x') + ")", std::string(20000, 'z') + "|AR-C"})
    EXPECT_LT(parse_error(name).size(), 1000u) << parse_error(name).substr(0, 200);
  EXPECT_EQ(head(parse_error("AR\nC")), "schedule 'AR?C': 'AR?C' is not a schedule part");
}

// A misspelt name in a preference list is an error naming where the list came from, wherever it
// stands (a well-formed name the program does not allow is passed over: preference_test.cc).
TEST(RecipeErrors, AMisspeltPreferenceIsAnError) {
  const dsl::Program adam = dsl::workloads::adam();
  for (const std::vector<std::string>& names :
       {std::vector<std::string>{"fusd(RS-C-AG)", "AR-C"},
        std::vector<std::string>{"AR-C", "fusd(RS-C-AG)"}}) {
    std::string message = "no error";
    try {
      first_allowed(adam, names, "TANDEM_X");
    } catch (const UserError& e) {
      message = e.what();
    }
    EXPECT_EQ(head(message),
              "TANDEM_X: schedule 'fusd(RS-C-AG)': 'fusd(RS-C-AG)' is not a schedule part");
  }
}

}  // namespace
}  // namespace tandem::schedule
