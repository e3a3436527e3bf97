// The autotuner under mpirun (2 and 3 processes): every rank takes the same path, every schedule
// passes its check on the MPI backend, the ranks agree on the record, and the second tune reads
// rank 0's cache file and compiles nothing.
#include <gtest/gtest.h>
#include <mpi.h>

#include <filesystem>

#include "tandem/comm/mpi.h"
#include "tandem/dsl/dsl.h"
#include "tandem/exec/jit.h"
#include "tandem/schedule/enumerate.h"
#include "tandem/tune/tune.h"

namespace tandem::tune {
namespace {

// A cache folder named by rank 0 and shared by all ranks; removed at the end.
class SharedCacheDir {
 public:
  SharedCacheDir() {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    char name[256] = {};
    if (rank == 0)
      std::snprintf(name, sizeof(name), "%s/tandem-tune-mpi-test-%d",
                    std::filesystem::temp_directory_path().c_str(), static_cast<int>(::getpid()));
    MPI_Bcast(name, sizeof(name), MPI_CHAR, 0, MPI_COMM_WORLD);
    path_ = name;
    if (rank == 0) std::filesystem::create_directories(path_);
    MPI_Barrier(MPI_COMM_WORLD);
    ::setenv("TANDEM_CACHE_DIR", path_.c_str(), 1);
    rank_ = rank;
  }
  ~SharedCacheDir() {
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank_ == 0) std::filesystem::remove_all(path_);
    ::unsetenv("TANDEM_CACHE_DIR");
  }
  const std::string& str() const { return path_; }

 private:
  std::string path_;
  int rank_ = 0;
};

TEST(TuneMpi, EveryScheduleChecksAndTheCacheIsShared) {
  SharedCacheDir dir;
  auto world = comm::mpi_wrap(MPI_COMM_WORLD);
  const dsl::Program adam = dsl::workloads::adam(DType::BF16);
  TuneOptions o;
  o.sizes = {{"N", 2003}};
  o.reps = 2;
  o.warmup = 1;
  o.executor = executor_of(exec::RunnerKind::Plan);
  const TuneResult first = tune(adam, *world, o);
  EXPECT_FALSE(first.from_cache);
  EXPECT_EQ(first.record.key.backend, "mpi");
  EXPECT_EQ(first.record.key.ranks, world->size());
  EXPECT_EQ(first.record.candidates.size(), schedule::enumerate_schedules(adam).size());
  for (const auto& c : first.record.candidates) EXPECT_TRUE(c.ok) << c.name << ": " << c.error;
  const TuneResult second = tune(adam, *world, o);
  EXPECT_TRUE(second.from_cache);
  EXPECT_EQ(second.record.winner, first.record.winner);
}

TEST(TuneMpi, CompiledFusedScheduleChecksAndCachesWithoutCompiling) {
  SharedCacheDir dir;
  auto world = comm::mpi_wrap(MPI_COMM_WORLD);
  const dsl::Program adam = dsl::workloads::adam(DType::F32);
  std::string fused;
  for (const auto& s : schedule::enumerate_schedules(adam))
    if (s.name.rfind("fused(RS-C-AG)", 0) == 0) fused = s.name;
  ASSERT_FALSE(fused.empty());
  TuneOptions o;
  o.sizes = {{"N", 1001}};
  o.reps = 2;
  o.only = {fused};
  const TuneResult first = tune(adam, *world, o);
  ASSERT_EQ(first.record.candidates.size(), 2u);
  for (const auto& c : first.record.candidates) EXPECT_TRUE(c.ok) << c.name << ": " << c.error;
  const exec::JitStats before = exec::jit_stats();
  const TuneResult second = tune(adam, *world, o);
  EXPECT_TRUE(second.from_cache);
  EXPECT_EQ(exec::jit_stats().compiles, before.compiles);
  EXPECT_EQ(exec::jit_stats().disk_hits, before.disk_hits);
}

}  // namespace
}  // namespace tandem::tune
