// Two hosts on one machine (scripts/netns-hosts.sh: two network namespaces with their own host
// names, a veth pair between them on a private /30, mpirun's remote shell entering them), 2 ranks
// on each, everything between the hosts over TCP: every collective against MPI's own on random
// inputs, the fused Adam schedules, `tandem train --dp 2 --tp 2` against the same grid on
// in-process ranks, a rank killed on one host, and the script's own teardown and errors.
//
// Each test makes its own pair of hosts and removes it. Where namespaces cannot be made (not
// root, no `ip`), the script says so and exits 77, and the test is skipped with its message. Every
// command runs under `timeout`, so that a hang is a failure, never a stuck suite.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "support/cli.h"
#include "support/scratch.h"

namespace tandem::train {
namespace {

using tandem::testing::CommandResult;
using tandem::testing::ScratchDir;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

const std::string kScript = TANDEM_NETNS_HOSTS;  // scripts/netns-hosts.sh in the source tree

// The folder of this executable, where the other test executables are built.
std::string tests_dir() { return fs::canonical("/proc/self/exe").parent_path().string(); }

// `netns-hosts.sh ARGS` under a time limit (TERM first, so that the script's trap tears the hosts
// down; KILL 10 s later).
CommandResult hosts(const std::string& args, int seconds = 120) {
  return tandem::testing::run_command(
      fmt::format("timeout -k 10 -s TERM {} '{}' {}", seconds, kScript, args));
}

// The names of the two hosts the script announced ("netns-hosts: A (addr) and B (addr) on ...").
std::vector<std::string> host_names(const std::string& output) {
  std::smatch m;
  if (!std::regex_search(output, m,
                         std::regex("netns-hosts: (tmh[0-9]+a) \\([0-9.]+\\) and (tmh[0-9]+b)")))
    return {};
  return {m[1], m[2]};
}

// After every run: no namespace and no interface of that run is left.
void expect_torn_down(const std::string& output) {
  const std::vector<std::string> names = host_names(output);
  ASSERT_EQ(names.size(), 2u) << output;
  const CommandResult ns = tandem::testing::run_command("ip netns list");
  const CommandResult links = tandem::testing::run_command("ip -o link");
  for (const std::string& n : names) {
    EXPECT_THAT(ns.output, Not(HasSubstr(n))) << "namespace " << n << " is left";
    EXPECT_THAT(links.output, Not(HasSubstr(n))) << "interface " << n << " is left";
    EXPECT_FALSE(fs::exists("/etc/netns/" + n)) << "/etc/netns/" << n << " is left";
  }
}

#define SKIP_WITHOUT_NAMESPACES(r)                                                       \
  if ((r).status == 77 && (r).output.find("netns-hosts: skipped:") != std::string::npos) \
  GTEST_SKIP() << (r).output

// Each rank says where it runs: ranks 0 and 1 on host A, 2 and 3 on host B, each host under its
// own name.
TEST(TwoHosts, TwoRanksOnEachHostUnderItsOwnName) {
  const CommandResult r =
      hosts("mpirun sh -c 'echo \"rank $OMPI_COMM_WORLD_RANK on $(hostname)\"'", 60);
  SKIP_WITHOUT_NAMESPACES(r);
  ASSERT_EQ(r.status, 0) << r.output;
  const std::vector<std::string> names = host_names(r.output);
  ASSERT_EQ(names.size(), 2u) << r.output;
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_THAT(r.output, HasSubstr(fmt::format("rank {} on {}\n", rank, names[rank / 2])));
  expect_torn_down(r.output);
}

// tests/comm/mpi under the two hosts: every collective on the world, the hierarchical ones with
// the nodes the host names give, and MpiReference: all_reduce, reduce_scatter, all_gather and
// broadcast against MPI_Allreduce, MPI_Reduce_scatter, MPI_Allgatherv and MPI_Bcast on random
// inputs. (As for comm.mpi.np4.nodes_of_2, the error and timeout suites are left out: they name
// calls of the flat algorithms.)
TEST(TwoHosts, EveryCollectiveAgainstMpi) {
  const CommandResult r = hosts(fmt::format(
      "mpirun '{}/test_comm_mpi' --gtest_color=no --gtest_filter=-MpiErrors.*:MpiTimeout.*",
      tests_dir()));
  SKIP_WITHOUT_NAMESPACES(r);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output,
              HasSubstr("[       OK ] MpiReference.EveryCollectiveAgainstMpiOnRandomInputs"))
      << r.output;
  EXPECT_THAT(r.output, HasSubstr("[       OK ] MpiHierarchical.EveryCollectiveAndRandomInputs"))
      << r.output;
  expect_torn_down(r.output);
}

// Every enumerated schedule of Adam, the fused one among them, by the plan runner and compiled,
// equal to the reference interpreter across the two hosts.
TEST(TwoHosts, FusedAdamSchedules) {
  for (const char* suite : {"test_exec_mpi' --gtest_color=no --gtest_filter=MpiEquivalence.Adam",
                            "test_exec_mpi' --gtest_color=no --gtest_filter=CompiledMpi.Adam"}) {
    const CommandResult r = hosts(fmt::format("mpirun '{}/{}", tests_dir(), suite));
    SKIP_WITHOUT_NAMESPACES(r);
    EXPECT_EQ(r.status, 0) << r.output;
    EXPECT_THAT(r.output, ContainsRegex("\\[       OK \\] (MpiEquivalence|CompiledMpi)\\.Adam"))
        << r.output;
    expect_torn_down(r.output);
  }
}

// Each step's "loss" field of a metrics file, as written.
std::vector<std::string> losses_of(const std::string& metrics) {
  return tandem::testing::logged_losses(metrics);
}

// dp 2 x tp 2 with each tp group on one host and the data-parallel exchange between the hosts:
// the loss curve of the same grid on 4 in-process ranks, bitwise (every group has 2 ranks, and a
// sum of two terms is the same in either order).
TEST(TwoHosts, TrainMatchesTheSameGridInProcess) {
  ScratchDir dir;
  const std::string flags =
      "--model tiny --dp 2 --tp 2 --steps 6 --eval-every 0 --threads 1 --quiet";
  const CommandResult r =
      hosts(fmt::format("mpirun '{}' train --backend mpi {} --metrics {}",
                        tandem::testing::tandem_binary(), flags, dir.path("mpi.jsonl")));
  SKIP_WITHOUT_NAMESPACES(r);
  ASSERT_EQ(r.status, 0) << r.output;
  const std::vector<std::string> names = host_names(r.output);
  EXPECT_THAT(r.output,
              HasSubstr("rank mapping (2 nodes, tp inside a node, then pp, then dp across nodes)"))
      << r.output;
  EXPECT_THAT(r.output, Not(HasSubstr("warning"))) << r.output;
  const CommandResult in_process = tandem::testing::run_tandem(
      fmt::format("train --backend thread {} --metrics {}", flags, dir.path("thread.jsonl")));
  ASSERT_EQ(in_process.status, 0) << in_process.output;
  const std::vector<std::string> want = losses_of(dir.path("thread.jsonl"));
  ASSERT_EQ(want.size(), 6u) << in_process.output;
  EXPECT_EQ(losses_of(dir.path("mpi.jsonl")), want);
  expect_torn_down(r.output);
}

// A job of 4 training processes, each writing its pid to DIR/pid.<rank> first (exec keeps it).
std::string training_job(const ScratchDir& dir) {
  return fmt::format(
      "mpirun sh -c 'echo $$ > {}/pid.$OMPI_COMM_WORLD_RANK; exec \"{}\" train --backend mpi "
      "--model tiny "
      "--dp 2 --tp 2 --steps 100000000 --eval-every 0 --threads 1 --quiet --metrics {}/m.jsonl'",
      dir.path(), tandem::testing::tandem_binary(), dir.path());
}

bool wait_for(const std::function<bool()>& ready, int seconds) {
  for (int i = 0; i < seconds * 10 && !ready(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  return ready();
}

int pid_in(const std::string& file) {
  std::ifstream f(file);
  int pid = 0;
  f >> pid;
  return pid;
}

// Rank 3, on host B, killed while the job trains: mpirun ends the whole job within seconds, naming
// the rank and its host, and no process of the job is left.
TEST(TwoHosts, AKilledRankEndsTheJobNamingIt) {
  ScratchDir dir;
  auto job = std::async(std::launch::async, [&] { return hosts(training_job(dir), 90); });
  // Training has begun (the metrics file has a step) on every rank; or the job ended first (the
  // hosts could not be made here: a skip, below).
  const bool started = wait_for(
      [&] {
        if (job.wait_for(std::chrono::seconds(0)) == std::future_status::ready) return true;
        for (int q = 0; q < 4; ++q)
          if (pid_in(dir.path("pid." + std::to_string(q))) <= 0) return false;
        return fs::exists(dir.path("m.jsonl")) && fs::file_size(dir.path("m.jsonl")) > 0;
      },
      60);
  std::vector<int> pids;
  for (int q = 0; q < 4; ++q) pids.push_back(pid_in(dir.path("pid." + std::to_string(q))));
  if (started && pids[3] > 0) ::kill(pids[3], SIGKILL);
  const auto killed = Clock::now();
  const CommandResult r = job.get();
  const double seconds = std::chrono::duration<double>(Clock::now() - killed).count();
  SKIP_WITHOUT_NAMESPACES(r);
  ASSERT_TRUE(started) << "the job did not start training within a minute:\n" << r.output;
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.status, 124) << "the job did not end by itself:\n" << r.output;
  const std::vector<std::string> names = host_names(r.output);
  ASSERT_EQ(names.size(), 2u) << r.output;
  EXPECT_THAT(r.output,
              ContainsRegex(fmt::format("process rank 3 with PID [0-9]+ on node {} exited on "
                                        "signal 9",
                                        names[1])))
      << r.output;
  EXPECT_LT(seconds, 15) << "the job took " << seconds << " s to end after the kill:\n" << r.output;
  // (A process killed a moment ago may take that moment to go.)
  for (int q = 0; q < 3; ++q)
    EXPECT_TRUE(wait_for([&] { return ::kill(pids[q], 0) != 0; }, 5))
        << "rank " << q << " (pid " << pids[q] << ") is left";
  expect_torn_down(r.output);
}

// The hosts are removed when the command fails, and when the script is stopped by a signal while
// the command still runs (as `timeout` or Ctrl-C would).
TEST(TwoHosts, TornDownWhenTheCommandFailsOrTheScriptIsStopped) {
  const CommandResult failed = hosts("run sh -c 'exit 3'", 30);
  SKIP_WITHOUT_NAMESPACES(failed);
  EXPECT_EQ(failed.status, 3) << failed.output;
  expect_torn_down(failed.output);

  ScratchDir dir;
  const std::string out = dir.path("out");
  const CommandResult started = tandem::testing::run_command(
      fmt::format("'{}' run sleep 300 >'{}' 2>&1 & echo $!", kScript, out));
  const int pid = std::stoi(started.output);
  std::vector<std::string> names;
  ASSERT_TRUE(wait_for(
      [&] {
        std::ifstream f(out);
        names = host_names(std::string(std::istreambuf_iterator<char>(f), {}));
        return names.size() == 2 &&
               tandem::testing::run_command("ip netns pids " + names[0])
                       .output.find_first_of("0123456789") != std::string::npos;
      },
      30))
      << "the hosts were not made";
  const auto stopped = Clock::now();
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  ASSERT_TRUE(wait_for([&] { return ::kill(pid, 0) != 0; }, 20))
      << "the script did not end on SIGTERM";
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - stopped).count(), 5);
  std::ifstream f(out);
  expect_torn_down(std::string(std::istreambuf_iterator<char>(f), {}));
}

TEST(TwoHosts, BadArgumentsAreOneError) {
  const CommandResult none = hosts("", 10);
  EXPECT_EQ(none.status, 2);
  EXPECT_THAT(none.output, HasSubstr("netns-hosts: error: usage: "));
  const CommandResult zero = hosts("-n 0 mpirun true", 10);
  EXPECT_EQ(zero.status, 2);
  EXPECT_EQ(zero.output,
            "netns-hosts: error: -n '0': ranks per host must be a whole number of 1 or more\n");
  const CommandResult empty = hosts("run", 10);
  EXPECT_EQ(empty.status, 2);
  EXPECT_EQ(empty.output, "netns-hosts: error: 'run' needs a command to run\n");
  const CommandResult rate = hosts("--rate-mbit 1.5 run true", 10);
  EXPECT_EQ(rate.status, 2);
  EXPECT_EQ(rate.output,
            "netns-hosts: error: --rate-mbit '1.5': the rate must be a whole number of Mbit/s, 1 "
            "or more\n");
}

// --rate-mbit puts a token bucket of that rate on both ends of the pair (each host's egress).
TEST(TwoHosts, ARateLimitsBothEndsOfTheLink) {
  const CommandResult r = hosts(
      "--rate-mbit 300 run sh -c 'tc qdisc show; \"$NETNS_AGENT\" \"${NETNS_HOSTS#* }\" tc qdisc "
      "show'",
      60);
  SKIP_WITHOUT_NAMESPACES(r);
  ASSERT_EQ(r.status, 0) << r.output;
  const std::vector<std::string> names = host_names(r.output);
  ASSERT_EQ(names.size(), 2u) << r.output;
  EXPECT_THAT(r.output, HasSubstr("link: 300 Mbit/s each way"));
  for (const std::string& n : names)
    EXPECT_TRUE(std::regex_search(
        r.output, std::regex("qdisc tbf [0-9a-f]+: dev " + n + " root .*rate 300Mbit")))
        << n << " is not limited:\n"
        << r.output;
  expect_torn_down(r.output);
}

}  // namespace
}  // namespace tandem::train
