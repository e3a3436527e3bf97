// Recipes as values: every enumerated name parses back to its recipe and prints again unchanged,
// applying a parsed name builds the very plan the enumerator built, the fields mean what they
// say, and a program with two collectives gets per-collective combinations.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "schedule/testing.h"
#include "tandem/core/error.h"
#include "tandem/dsl/dsl.h"
#include "tandem/schedule/transforms.h"

namespace tandem::schedule {
namespace {

// The plan's text without its first line (which carries the name).
std::string plan_body(const Schedule& s) {
  std::string text = s.lower().str();
  return text.erase(0, text.find('\n'));
}

using testing::names_of;

void expect_round_trips(const dsl::Program& program, const std::vector<NamedSchedule>& all) {
  for (const NamedSchedule& ns : all) {
    const Recipe r = Recipe::parse(ns.name);
    EXPECT_EQ(r.str(), ns.name) << program.name();
    EXPECT_EQ(ns.recipe.str(), ns.name) << program.name();
    EXPECT_TRUE(r == ns.recipe) << program.name() << ": " << ns.name;
    const NamedSchedule again = schedule_by_name(program, ns.name);
    EXPECT_EQ(again.name, ns.name);
    EXPECT_EQ(plan_body(again.schedule), plan_body(ns.schedule))
        << program.name() << ": " << ns.name;
    EXPECT_EQ(again.schedule.lower().name, ns.name);
  }
}

TEST(Recipe, EveryEnumeratedNameOfTheWorkloadsRoundTrips) {
  for (std::string_view w : dsl::workloads::names()) {
    const dsl::Program program = dsl::workloads::by_name(w);
    const auto all = enumerate_schedules(program);
    ASSERT_FALSE(all.empty()) << w;
    expect_round_trips(program, all);
  }
}

// Names one edit away from a real one (a character dropped, doubled or replaced) either parse to a
// recipe that prints them back or are a UserError: never an internal error.
TEST(Recipe, NearMissesParseBackOrAreUserErrors) {
  int accepted = 0, refused = 0;
  for (const NamedSchedule& ns : enumerate_schedules(testing::two_collectives())) {
    const std::string& n = ns.name;
    for (size_t i = 0; i < n.size(); ++i)
      for (const std::string& x :
           {n.substr(0, i) + n.substr(i + 1), n.substr(0, i + 1) + n.substr(i),
            n.substr(0, i) + "0" + n.substr(i + 1), n.substr(0, i) + "|" + n.substr(i + 1)}) {
        try {
          EXPECT_EQ(Recipe::parse(x).str(), x);
          ++accepted;
        } catch (const UserError&) {
          ++refused;
        }
      }
  }
  EXPECT_GT(refused, 1000);
  EXPECT_GT(accepted, 0);  // e.g. "+slice(mm)": a slice input's name with a letter doubled
}

TEST(Recipe, FieldsOfAName) {
  const Recipe r = Recipe::parse("ol[8](MM,fused(RS-C)-P2P)-AG+slice(m,v)");
  ASSERT_EQ(r.collectives.size(), 1u);
  const CollectiveRecipe& c = r.collectives[0];
  EXPECT_EQ(c.move, Move::ReorderTransfers);
  EXPECT_TRUE(c.fuse);
  EXPECT_TRUE(c.overlap_matmul);
  EXPECT_TRUE(c.overlap_send);
  EXPECT_EQ(c.blocks, 8);
  EXPECT_TRUE(r.fused_loops());
  EXPECT_EQ(r.slice, (std::vector<std::string>{"m", "v"}));

  const Recipe plain = Recipe::parse("RS-AG-fused(C)");
  EXPECT_EQ(plain.collectives[0].move, Move::Split);
  EXPECT_FALSE(plain.collectives[0].fuse);
  EXPECT_TRUE(plain.loops);
  EXPECT_FALSE(plain.collectives[0].overlapped());

  EXPECT_TRUE(Recipe::parse("C").collectives.empty());
  EXPECT_TRUE(Recipe::parse("fused(C)").loops);
  EXPECT_EQ(Recipe::parse("fused(RS-C-AG)|ol(MM,AR-fused(C))").collectives.size(), 2u);
}

TEST(Recipe, ValuesPrintAsNames) {
  Recipe r;
  r.collectives.resize(2);
  r.collectives[0].move = Move::Reorder;
  r.collectives[0].fuse = true;
  r.collectives[1].overlap_matmul = true;
  r.collectives[1].blocks = 16;
  r.slice = {"m"};
  // The fused first collective implies loop fusion, which the second part's C shows.
  EXPECT_EQ(r.str(), "fused(RS-C-AG)|ol[16](MM,AR-fused(C))+slice(m)");
  EXPECT_TRUE(Recipe::parse(r.str()) == r);
  r.collectives[1].blocks = kDefaultBlocks;
  EXPECT_EQ(r.str(), "fused(RS-C-AG)|ol(MM,AR-fused(C))+slice(m)");
  // Blocks matter only to an overlap.
  CollectiveRecipe a, b;
  b.blocks = 9;
  EXPECT_TRUE(a == b);
  a.overlap_send = b.overlap_send = true;
  EXPECT_FALSE(a == b);
}

TEST(Recipe, ApplyCarriesTheBlockCount) {
  const dsl::Program layer = dsl::workloads::megatron_layer();
  const Schedule s = Recipe::parse("ol[8](MM,fused(AR-C))").apply(layer);
  ASSERT_EQ(s.overlaps().size(), 1u);
  EXPECT_EQ(s.overlaps()[0].blocks, 8);
  ASSERT_EQ(s.fused().size(), 1u);
  EXPECT_EQ(s.name(), "ol[8](MM,fused(AR-C))");
  EXPECT_EQ(Recipe::parse("ol(MM,fused(AR-C))").apply(layer).overlaps()[0].blocks, kDefaultBlocks);
}

TEST(Recipe, ApplyIsTheTransformationsByHand) {
  // fused(RS-C-AG)+slice(m,v) on Adam is split, reorder, as_slice, fuse and the loops, by hand.
  const dsl::Program adam = dsl::workloads::adam();
  Schedule hand(adam);
  const auto [rs, ag] = hand.split("g_sum");
  std::vector<StageRef> consumers;
  for (const char* n : {"m1", "v1", "w1"}) consumers.emplace_back(n);
  hand.reorder(ag, consumers);
  hand.as_slice("m");
  hand.as_slice("v");
  const Schedule applied = Recipe::parse("fused(RS-C-AG)+slice(m,v)").apply(adam);
  EXPECT_EQ(applied.program().str(), hand.program().str());
  EXPECT_EQ(applied.fused().size(), 1u);
  EXPECT_EQ(applied.fused()[0].collective, *applied.program().find("g_sum.rs"));
}

TEST(Recipe, UnscheduledIsTheProgramAsWritten) {
  EXPECT_EQ(Recipe::unscheduled(dsl::workloads::adam()).str(), "AR-C");
  EXPECT_EQ(
      Recipe::unscheduled(dsl::workloads::adam()).apply(dsl::workloads::adam()).program().str(),
      dsl::workloads::adam().str());
  dsl::Program axpy("axpy");
  {
    using namespace tandem::dsl;  // NOLINT
    const Expr x = axpy.input(F32, {"N"}, Replicated, "x");
    axpy.output((x + x).named("y"), "y");
  }
  EXPECT_EQ(Recipe::unscheduled(axpy).str(), "C");
}

TEST(Recipe, AReduceScatterOfTheProgramIsNotAPart) {
  // Only AllReduces take parts; a ReduceScatter the program was written with stays as it is.
  dsl::Program p("scatter_and_reduce");
  {
    using namespace tandem::dsl;  // NOLINT
    const Expr g = p.input(F32, {"N"}, Local, "g");
    p.output(ReduceScatter(Sum, g).named("g_part"), "g_part");
    const Expr h = p.input(F32, {"N"}, Local, "h");
    const Expr w = p.input(F32, {"N"}, Replicated, "w");
    update(w, w - AllReduce(Sum, h).named("h_sum")).named("w1");
  }
  EXPECT_EQ(recipe_collectives(p).size(), 1u);
  const auto names = names_of(enumerate_schedules(p));
  EXPECT_NE(std::find(names.begin(), names.end(), "fused(RS-C-AG)"), names.end());
  expect_round_trips(p, enumerate_schedules(p));
}

// ------------------------------------------------------------------ several collectives

TEST(PerCollective, TheSpaceAndItsCombinations) {
  const dsl::Program p = testing::two_collectives();
  EXPECT_EQ(recipe_collectives(p).size(), 2u);
  EXPECT_EQ(recipe_space_size(p), 2 * (4 + 1) * 16 * 16);
  EXPECT_EQ(recipe_space_size(dsl::workloads::adam()), 96);
  const auto all = enumerate_schedules(p);
  const auto names = names_of(all);
  auto has = [&](const std::string& n) {
    return std::find(names.begin(), names.end(), n) != names.end();
  };
  EXPECT_EQ(names.front(), "AR-C");  // one part: every collective the same
  // Each collective its own choice, in both directions.
  for (const char* n : {"RS-C-AG|AR-C", "AR-C|RS-C-AG", "AR-C|ol(MM,AR-C)",
                        "fused(RS-C-AG)|ol(MM,AR-fused(C))", "fused(AR-C)|ol(MM,fused(RS-C-AG))",
                        "RS-C-AG|ol(MM,AR-C)+slice(m)", "fused(RS-C-AG)+slice(m)"})
    EXPECT_TRUE(has(n)) << n;
  // No overlap of g_sum: its input is no matmul.
  for (const std::string& n : names) EXPECT_NE(n.rfind("ol(", 0), 0u) << n;
  // Every name is distinct and round-trips.
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size());
  expect_round_trips(p, all);
  std::set<std::string> plans;
  for (const NamedSchedule& ns : all)
    EXPECT_TRUE(plans.insert(plan_body(ns.schedule)).second) << ns.name;
}

TEST(PerCollective, OneCollectiveAtATime) {
  const dsl::Program p = testing::two_collectives();
  std::vector<CollectiveRecipe> base(2);
  base[0].move = Move::Reorder;
  base[0].fuse = true;
  const auto second = enumerate_collective(p, base, 1);
  ASSERT_FALSE(second.empty());
  for (const NamedSchedule& ns : second) {
    const auto& c = ns.recipe.collectives;
    // The first collective stays fused(RS-C-AG) (one part when both agree).
    EXPECT_EQ(c.front().move, Move::Reorder) << ns.name;
    EXPECT_TRUE(c.front().fuse) << ns.name;
  }
  const auto names = names_of(second);
  EXPECT_NE(std::find(names.begin(), names.end(), "fused(RS-C-AG)|ol(MM,fused(AR-C))"),
            names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "fused(RS-C-AG)"), names.end());
  expect_round_trips(p, second);
}

TEST(PerCollective, PartsAddressCollectivesInProgramOrder) {
  const dsl::Program p = testing::two_collectives();
  const Schedule s = Recipe::parse("AR-C|ol[2](MM,AR-C)").apply(p);
  ASSERT_EQ(s.overlaps().size(), 1u);
  EXPECT_EQ(s.overlaps()[0].blocks, 2);
  const auto& st = s.overlaps()[0].stages;
  EXPECT_TRUE(std::binary_search(st.begin(), st.end(), *s.program().find("z")));
  EXPECT_FALSE(std::binary_search(st.begin(), st.end(), *s.program().find("g_sum")));
}

}  // namespace
}  // namespace tandem::schedule
