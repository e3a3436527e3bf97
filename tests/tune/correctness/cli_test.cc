// `tandem tune` and `tandem emit` as a user runs them: the table marks the winner and its
// speed-up, --json says the same in machine-readable form, the second run reads the cache, and
// emit prints the generated source of a named schedule; --backend mpi starts itself under mpirun
// with the arguments the user gave.
#include "support/cli.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tune/tune_testing.h"

namespace tandem::testing {
namespace {

TEST(TuneCli, JsonThenCachedTable) {
  TempCacheDir dir("cli");
  const CommandResult r =
      run_tandem("tune adam --ranks 2 --size N=3001 --executor plan --reps 2 --json");
  ASSERT_EQ(r.status, 0) << r.output;
  const auto doc = nlohmann::json::parse(r.output);
  EXPECT_EQ(doc.at("workload"), "adam");
  EXPECT_EQ(doc.at("ranks"), 2);
  EXPECT_EQ(doc.at("backend"), "thread");
  EXPECT_EQ(doc.at("sizes").at("N"), 3001);
  EXPECT_EQ(doc.at("baseline"), "AR-C");
  EXPECT_FALSE(doc.at("from_cache").get<bool>());
  int winners = 0, retimed = 0;
  double best = 1e300, best_final = 1e300;
  const int final_reps = doc.at("final_round").at("reps").get<int>();
  for (const auto& c : doc.at("candidates")) {
    ASSERT_TRUE(c.at("ok").get<bool>()) << c.dump();
    EXPECT_EQ(c.at("times_s").size(), 2u);
    best = std::min(best, c.at("median_s").get<double>());
    winners += c.at("winner").get<bool>();
    if (c.at("retimed").get<bool>()) {
      ++retimed;
      EXPECT_EQ(c.at("final_times_s").size(), 4u);  // 2 x --reps
      best_final = std::min(best_final, c.at("final_median_s").get<double>());
    }
    if (c.at("name") == "AR-C") {
      EXPECT_DOUBLE_EQ(c.at("speedup").get<double>(), 1.0);
    }
  }
  EXPECT_EQ(winners, 1);
  EXPECT_LE(retimed, 4);
  EXPECT_NE(retimed, 1);
  EXPECT_EQ(final_reps, retimed > 0 ? 4 : 0);
  // The winner: the smallest interleaved median after a final round, else the smallest median.
  for (const auto& c : doc.at("candidates"))
    if (c.at("winner").get<bool>()) {
      EXPECT_EQ(c.at("name"), doc.at("winner"));
      if (retimed > 0) {
        ASSERT_TRUE(c.at("retimed").get<bool>()) << c.dump();
        EXPECT_DOUBLE_EQ(c.at("final_median_s").get<double>(), best_final);
        EXPECT_LE(c.at("median_s").get<double>(),
                  best * (1 + doc.at("final_round").at("margin").get<double>()));
      } else {
        EXPECT_DOUBLE_EQ(c.at("median_s").get<double>(), best);
      }
    }

  const CommandResult t = run_tandem("tune adam --ranks 2 --size N=3001 --executor plan --reps 2");
  ASSERT_EQ(t.status, 0) << t.output;
  const std::string winner = doc.at("winner").get<std::string>();
  EXPECT_NE(t.output.find("* " + winner + " "), std::string::npos) << t.output;
  if (winner != "AR-C") {  // the baseline is listed too (it can win on a loaded machine)
    // Marked "+" when it was within the final round's margin and timed again, else unmarked.
    bool baseline_retimed = false;
    for (const auto& c : doc.at("candidates"))
      if (c.at("name") == "AR-C") baseline_retimed = c.at("retimed").get<bool>();
    EXPECT_NE(t.output.find(baseline_retimed ? "+ AR-C " : "  AR-C "), std::string::npos)
        << t.output;
  }
  EXPECT_NE(t.output.find("1.00x"), std::string::npos) << t.output;
  EXPECT_NE(t.output.find("winner: " + winner), std::string::npos) << t.output;
  EXPECT_NE(t.output.find("final median"), std::string::npos) << t.output;
  if (retimed > 0) {
    EXPECT_NE(t.output.find("final round: the schedules within 15%"), std::string::npos)
        << t.output;
  }
  EXPECT_NE(t.output.find("(read: nothing timed, 0 compiled"), std::string::npos) << t.output;
  EXPECT_NE(
      t.output.find(" schedule(s) timed, the collectives one at a time, of a space of 96 recipes"),
      std::string::npos)
      << t.output;
  EXPECT_NE(t.output.find("chunk size (the winner timed at each, in turns; * the fastest, which "
                          "the tuned program runs at):"),
            std::string::npos)
      << t.output;
}

// --backend mpi outside mpirun starts itself under it, handing every process the arguments the
// user gave, as given (here the launcher is `echo`, which prints the command it was given).
TEST(TuneCli, UnderMpiItStartsItselfWithTheUsersOwnArguments) {
  const std::string args =
      "tune adam --backend=mpi --ranks 3 --size N=4Ki --reps 2 --schedules AR-C --json";
  const CommandResult r =
      run_command(fmt::format("TANDEM_MPIRUN=echo '{}' {}", tandem_binary(), args));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output, fmt::format("-np 3 --oversubscribe {} {}\n", tandem_binary(), args));
}

TEST(TuneCli, EmitPrintsTheGeneratedSource) {
  TempCacheDir dir("emit");
  const CommandResult list = run_tandem("emit adam --list");
  ASSERT_EQ(list.status, 0) << list.output;
  EXPECT_EQ(list.output.rfind("AR-C\n", 0), 0u) << list.output;
  const CommandResult r = run_tandem("emit adam --schedule AR-C --target cpp");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("tandem_run"), std::string::npos);
  EXPECT_NE(r.output.find("tandem_abi_version"), std::string::npos);
  // Another schedule gives another source.
  const std::string second = list.output.substr(5, list.output.find('\n', 5) - 5);
  const CommandResult r2 = run_tandem("emit adam --schedule '" + second + "' --target cpp");
  ASSERT_EQ(r2.status, 0) << r2.output;
  EXPECT_NE(r2.output, r.output);
}

// Ring attention's exchange, a Shift alone: one schedule, emitted as a shift (kind 4), tuned for
// its chunk size against the reference on 3 ranks.
TEST(TuneCli, RingShiftEmitsAndTunes) {
  TempCacheDir dir("ring");
  const CommandResult list = run_tandem("emit kv_ring --list");
  ASSERT_EQ(list.status, 0) << list.output;
  EXPECT_EQ(list.output, "C\n");
  const CommandResult src = run_tandem("emit kv_ring --target cpp");
  ASSERT_EQ(src.status, 0) << src.output;
  EXPECT_NE(src.output.find("c.kind = 4;"), std::string::npos) << src.output;
  const CommandResult r =
      run_tandem("tune kv_ring --ranks 3 --size N=1001 --executor plan --reps 2 --json");
  ASSERT_EQ(r.status, 0) << r.output;
  const auto doc = nlohmann::json::parse(r.output);
  EXPECT_EQ(doc.at("workload"), "kv_ring");
  EXPECT_EQ(doc.at("winner"), "C");
  for (const auto& c : doc.at("candidates")) EXPECT_TRUE(c.at("ok").get<bool>()) << c.dump();
}

// Llama's epilogue, the layer without its bias, by name, with the layers' dtype flags.
TEST(TuneCli, EmitsTheLayerWithoutItsBias) {
  TempCacheDir dir("emit-no-bias");
  const CommandResult with =
      run_tandem("emit megatron_layer --schedule AR-C --target cpp --wire bf16");
  const CommandResult without =
      run_tandem("emit megatron_layer_no_bias --schedule AR-C --target cpp --wire bf16");
  ASSERT_EQ(with.status, 0) << with.output;
  ASSERT_EQ(without.status, 0) << without.output;
  EXPECT_NE(with.output.find("add(z_cast, bias)"), std::string::npos) << with.output;
  EXPECT_NE(without.output.find("program 'megatron_layer_no_bias'"), std::string::npos);
  EXPECT_EQ(without.output.find("add(z_cast"), std::string::npos) << without.output;
}

TEST(TuneCli, EmitWithoutAScheduleEmitsTheTunersChoiceElseThePreference) {
  TempCacheDir dir("emit-default");
  const CommandResult before = run_tandem("emit adam --target cpp");
  ASSERT_EQ(before.status, 0) << before.output;
  EXPECT_EQ(
      before.output.rfind(
          "emit: schedule fused(RS-C-AG)+slice(m,v): the built-in preference (no tuning record "
          "for 'adam' in ",
          0),
      0u)
      << before.output;
  const CommandResult t =
      run_tandem("tune adam --ranks 2 --size N=64 --reps 1 --schedules RS-C-AG --json");
  ASSERT_EQ(t.status, 0) << t.output;
  const CommandResult after = run_tandem("emit adam --target cpp");
  ASSERT_EQ(after.status, 0) << after.output;
  const std::string first = after.output.substr(0, after.output.find('\n'));
  EXPECT_NE(first.find(": the tuner's choice for N=64 on 2 thread rank(s) ("), std::string::npos)
      << first;
  const std::string winner = first.substr(15, first.find(':', 15) - 15);  // after "emit: schedule "
  const CommandResult named = run_tandem("emit adam --target cpp --schedule '" + winner + "'");
  EXPECT_EQ(after.output.substr(after.output.find('\n') + 1), named.output) << winner;
}

}  // namespace
}  // namespace tandem::testing
