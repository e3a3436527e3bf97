// A TANDEM_MPI_THREADS that names no level mpi_world() can ask for is one clear error: from the
// function, and from the tandem command before MPI starts.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "support/cli.h"
#include "tandem/comm/mpi.h"
#include "tandem/core/error.h"

namespace tandem::comm::testing {
namespace {

const char* const kThreadsChoices =
    "give multiple (MPI_THREAD_MULTIPLE, the default: communication threads call MPI beside the "
    "caller) or serialized (MPI_THREAD_SERIALIZED: one thread at a time, the exchanges beside a "
    "communicating caller run on it instead)";

std::string threads_from(const char* value) {
  setenv("TANDEM_MPI_THREADS", value, 1);
  std::string got;
  try {
    got = mpi_threads_from_env() == MpiThreads::Multiple ? "multiple" : "serialized";
  } catch (const UserError& e) {
    got = e.what();
  }
  unsetenv("TANDEM_MPI_THREADS");
  return got;
}

TEST(MpiThreadsSetting, NamesALevelOrIsRefused) {
  EXPECT_EQ(mpi_threads_from_env(), MpiThreads::Multiple);  // unset
  EXPECT_EQ(threads_from("multiple"), "multiple");
  EXPECT_EQ(threads_from("serialized"), "serialized");
  for (const char* bad : {"funneled", "Multiple", "1"})
    EXPECT_EQ(threads_from(bad), fmt::format("TANDEM_MPI_THREADS={}: {}", bad, kThreadsChoices));
}

TEST(MpiThreadsSetting, TheCommandRefusesABadValue) {
  const auto r = tandem::testing::run_command(
      fmt::format("TANDEM_MPI_THREADS=single '{}' train --backend mpi --model tiny --dp 1 --tp 1 "
                  "--steps 1 --eval-every 0",
                  tandem::testing::tandem_binary()));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(r.output,
            fmt::format("tandem: error: TANDEM_MPI_THREADS=single: {}\n", kThreadsChoices));
}

}  // namespace
}  // namespace tandem::comm::testing
