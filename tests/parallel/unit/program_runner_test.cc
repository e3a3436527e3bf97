// How a ProgramRunner picks its schedule: the first preference the program allows (each parsed as
// a recipe and applied, nothing enumerated), else the unscheduled program;
// TANDEM_SCHEDULE_<PROGRAM> forces one, and a name it cannot use is one error saying why.
#include "tandem/parallel/program_runner.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

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

}  // namespace
}  // namespace tandem::parallel
