// Metrics files that cannot be written, and the messages that say why: a missing folder, a folder
// in the file's place, a full disk (simulated by a file size limit).
#include <gtest/gtest.h>

#include "support/files.h"
#include "support/scratch.h"
#include "tandem/io/metrics.h"

namespace tandem::io {
namespace {

using testing::ScratchDir;
using testing::user_error_of;

TEST(MetricsErrors, UnwritablePath) {
  ScratchDir dir;
  EXPECT_EQ(user_error_of([&] { MetricsWriter w(dir.path("no/m.jsonl")); }),
            "cannot write metrics file '" + dir.path("no/m.jsonl") + "': folder '" +
                dir.path("no") + "' does not exist");
  EXPECT_EQ(user_error_of([&] { MetricsWriter w(dir.path()); }),
            "cannot write metrics file '" + dir.path() + "': Is a directory");
}

TEST(MetricsErrors, DiskFull) {
  ScratchDir dir;
  MetricsWriter w(dir.path("m.jsonl"));
  testing::FileSizeLimit limit(100);
  StepMetrics m;
  m.loss = 1.0;
  m.phase_s = {{"forward", 0.5}, {"backward", 0.5}, {"optimizer", 0.25}};
  EXPECT_EQ(user_error_of([&] {
              for (int i = 0; i < 10; ++i) w.write(m);
            }),
            "cannot write metrics file '" + dir.path("m.jsonl") + "': File too large");
}

}  // namespace
}  // namespace tandem::io
