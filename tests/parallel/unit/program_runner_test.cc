// How a ProgramRunner picks its schedule: the first preference the program allows (each parsed as
// a recipe and applied, nothing enumerated), else the unscheduled program;
// TANDEM_SCHEDULE_<PROGRAM> forces one, and a name it cannot use is one error saying why, as is a
// preference that does not parse. The first preference's chunk size goes with it alone, into every
// runner prepared.
#include "tandem/parallel/program_runner.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "tandem/comm/thread.h"
#include "tandem/core/error.h"
#include "tandem/dsl/workloads.h"

namespace tandem::parallel {
namespace {

constexpr exec::RunnerKind kRef = exec::RunnerKind::Reference;

TEST(ProgramRunnerSchedule, TheFirstPreferenceTheProgramAllows) {
  const dsl::Program adam = dsl::workloads::adam();
  // A matmul overlap does not apply to Adam: passed over.
  EXPECT_EQ(ProgramRunner(adam, {"ol(MM,AR-C)", "RS-C-AG", "AR-C"}, kRef).schedule_name(),
            "RS-C-AG");
  EXPECT_EQ(ProgramRunner(adam, {"ol(MM,AR-C)"}, kRef).schedule_name(), "AR-C");
  EXPECT_EQ(ProgramRunner(adam, {}, kRef).schedule_name(), "AR-C");
  const ProgramRunner layer(dsl::workloads::megatron_layer(), {"ol[8](MM,fused(AR-C))"}, kRef);
  EXPECT_EQ(layer.schedule_name(), "ol[8](MM,fused(AR-C))");
  ASSERT_EQ(layer.schedule().overlaps().size(), 1u);
  EXPECT_EQ(layer.schedule().overlaps()[0].blocks, 8);
}

TEST(ProgramRunnerSchedule, TheEnvironmentForcesOne) {
  const dsl::Program adam = dsl::workloads::adam();
  ::setenv("TANDEM_SCHEDULE_ADAM", "fused(RS-C-AG)+slice(m,v)", 1);
  EXPECT_EQ(ProgramRunner(adam, {"AR-C"}, kRef).schedule_name(), "fused(RS-C-AG)+slice(m,v)");
  ::setenv("TANDEM_SCHEDULE_ADAM", "ol(MM,AR-C)", 1);
  try {
    ProgramRunner r(adam, {"AR-C"}, kRef);
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()),
              "TANDEM_SCHEDULE_ADAM=ol(MM,AR-C): program 'adam': schedule 'ol(MM,AR-C)', "
              "collective 1 (g_sum): "
              "ol(MM,...) overlaps a collective with the matmul producing its input, but its input "
              "g is computed by "
              "input");
  }
  ::unsetenv("TANDEM_SCHEDULE_ADAM");
}

// A preference that does not parse is an error, not a fall-back to the unscheduled program.
TEST(ProgramRunnerSchedule, AMisspeltNameIsAnError) {
  const dsl::Program adam = dsl::workloads::adam();
  std::string message = "no error";
  try {
    ProgramRunner r(adam, {"RS-C-AG", "fusd(RS-C-AG)", "AR-C"}, kRef);
  } catch (const UserError& e) {
    message = e.what();
  }
  EXPECT_EQ(message.substr(0, message.find("; a schedule name is")),
            "the schedule preferences of program 'adam': schedule 'fusd(RS-C-AG)': 'fusd(RS-C-AG)' "
            "is not a "
            "schedule part");
  ::setenv("TANDEM_SCHEDULE_ADAM", "fusd(RS-C-AG)", 1);
  message = "no error";
  try {
    ProgramRunner r(adam, {"AR-C"}, kRef);
  } catch (const UserError& e) {
    message = e.what();
  }
  ::unsetenv("TANDEM_SCHEDULE_ADAM");
  EXPECT_EQ(message.substr(0, message.find("; a schedule name is")),
            "TANDEM_SCHEDULE_ADAM=fusd(RS-C-AG): program 'adam': schedule 'fusd(RS-C-AG)': "
            "'fusd(RS-C-AG)' is not a "
            "schedule part");
}

TEST(ProgramRunnerSchedule, TheFirstPreferenceCarriesItsChunkSize) {
  const dsl::Program adam = dsl::workloads::adam();
  EXPECT_EQ(ProgramRunner(adam, {"RS-C-AG", "AR-C"}, kRef, 4096).chunk_bytes(), 4096u);
  EXPECT_EQ(ProgramRunner(adam, {"ol(MM,AR-C)", "AR-C"}, kRef, 4096).chunk_bytes(), 0u)
      << "the first preference does not apply: the next runs at the process's size";
  EXPECT_EQ(ProgramRunner(adam, {"RS-C-AG"}, kRef).chunk_bytes(), 0u);
  ::setenv("TANDEM_SCHEDULE_ADAM", "RS-C-AG", 1);
  EXPECT_EQ(ProgramRunner(adam, {"RS-C-AG"}, kRef, 4096).chunk_bytes(), 0u) << "a forced schedule";
  ::unsetenv("TANDEM_SCHEDULE_ADAM");
}

// The runners it prepares run their collectives at that size: ranks given different ones disagree.
TEST(ProgramRunnerSchedule, PreparedRunnersRunAtTheChunkSize) {
  const dsl::Program adam = dsl::workloads::adam();
  std::string message = "no error";
  try {
    comm::run_ranks(2, [&](comm::Communicator& c) {
      const ProgramRunner runner(adam, {"fused(RS-C-AG)"}, exec::RunnerKind::Plan,
                                 c.rank() == 0 ? 64 : 128);
      std::unique_ptr<exec::Runner> run = runner.prepare(c, {{"N", 100}});
      for (int id : adam.scalars()) run->set_scalar(adam.stage(id).name, 0.5);
      run->run();
    });
  } catch (const UserError& e) {
    message = e.what();
  }
  EXPECT_NE(
      message.find(
          "chunk size mismatch across ranks: rank 0 passed 64 bytes, rank 1 passed 128 bytes"),
      std::string::npos)
      << message;
}

}  // namespace
}  // namespace tandem::parallel
