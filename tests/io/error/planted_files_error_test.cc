// What another user may plant in a folder tandem writes: a symbolic link where a file or folder
// will be written is refused with one message and nothing outside is touched; names tandem makes
// there (temporaries) are drawn at random, so nothing planted at a predictable one is followed or
// in the way.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "support/files.h"
#include "support/scratch.h"
#include "tandem/io/atomic_file.h"
#include "tandem/io/checkpoint_series.h"
#include "tandem/io/metrics.h"

namespace tandem::io {
namespace {

using testing::ScratchDir;
using testing::user_error_of;
namespace fs = std::filesystem;

namespace planted_files_error_test {

std::string link_refusal(const std::string& before, const std::string& path) {
  return before + "'" + path +
         "' is a symbolic link: tandem does not write through links (remove it, or give another "
         "path)";
}

}  // namespace planted_files_error_test

using planted_files_error_test::link_refusal;

TEST(PlantedFiles, AFileThatIsALinkIsRefusedAndItsTargetUntouched) {
  ScratchDir dir;
  testing::write_bytes(dir.path("victim"), "precious");
  fs::create_symlink(dir.path("victim"), dir.path("out.json"));
  EXPECT_EQ(user_error_of([&] { write_file_atomic(dir.path("out.json"), "x"); }),
            link_refusal("cannot write: ", dir.path("out.json")));
  EXPECT_EQ(testing::read_bytes(dir.path("victim")), "precious");
  EXPECT_TRUE(fs::is_symlink(dir.path("out.json")));
  EXPECT_EQ(dir.list(), (std::vector<std::string>{"out.json", "victim"}));  // no temporary left
}

TEST(PlantedFiles, PredictableTemporaryNamesAreNotInTheWay) {
  ScratchDir dir;
  testing::write_bytes(dir.path("victim"), "precious");
  // The names the writers used to take: this process's pid and a counter.
  for (int i = 0; i < 4; ++i)
    fs::create_symlink(dir.path("victim"), dir.path(".out.json.tmp-" + std::to_string(::getpid()) +
                                                    "-" + std::to_string(i)));
  fs::create_symlink(dir.path("victim"), dir.path("ck.tmp-" + std::to_string(::getpid())));
  write_file_atomic(dir.path("out.json"), "new");
  EXPECT_EQ(testing::read_bytes(dir.path("out.json")), "new");
  replace_folder_atomic(dir.path("ck"), {{"a", [](AtomicFile& f) { f.write("a"); }}});
  replace_folder_atomic(dir.path("ck"), {{"a", [](AtomicFile& f) { f.write("b"); }}});
  EXPECT_EQ(testing::read_bytes(dir.path("ck/a")), "b");
  EXPECT_EQ(testing::read_bytes(dir.path("victim")), "precious");
}

TEST(PlantedFiles, AFolderThatIsALinkIsRefused) {
  ScratchDir dir;
  fs::create_directories(dir.path("elsewhere"));
  testing::write_bytes(dir.path("elsewhere/keep"), "k");
  fs::create_directory_symlink(dir.path("elsewhere"), dir.path("ck"));
  EXPECT_EQ(user_error_of([&] {
              replace_folder_atomic(dir.path("ck"), {{"a", [](AtomicFile& f) { f.write("a"); }}});
            }),
            link_refusal("cannot write: ", dir.path("ck")));
  EXPECT_EQ(testing::read_bytes(dir.path("elsewhere/keep")), "k");
  EXPECT_EQ(dir.list("elsewhere"), std::vector<std::string>{"keep"});
}

TEST(PlantedFiles, TheLatestPointerThatIsALinkIsRefused) {
  ScratchDir dir;
  testing::write_bytes(dir.path("victim"), "precious");
  fs::create_directories(dir.path("save"));
  fs::create_symlink(dir.path("victim"), dir.path("save/latest"));
  Checkpoint c;
  c.meta.model_config = {{"d_model", 4}};
  c.meta.step = 3;
  c.meta.optimizer = "adamw";
  c.weights = {{"wte", Tensor::zeros(DType::F32, Shape{2, 2})}};
  EXPECT_EQ(user_error_of([&] { save_in_series(dir.path("save"), c, 2); }),
            link_refusal("cannot write: ", dir.path("save/latest")));
  EXPECT_EQ(testing::read_bytes(dir.path("victim")), "precious");
}

TEST(PlantedFiles, AMetricsFileThatIsALinkIsRefused) {
  ScratchDir dir;
  testing::write_bytes(dir.path("victim"), "precious");
  fs::create_symlink(dir.path("victim"), dir.path("m.jsonl"));
  for (bool append : {false, true}) {
    EXPECT_EQ(user_error_of([&] { MetricsWriter w(dir.path("m.jsonl"), append); }),
              link_refusal("cannot write metrics file: ", dir.path("m.jsonl")));
    EXPECT_EQ(testing::read_bytes(dir.path("victim")), "precious");
  }
  ::mkfifo(dir.path("fifo").c_str(), 0600);
  EXPECT_EQ(user_error_of([&] { MetricsWriter w(dir.path("fifo"), true); }),
            "cannot write metrics file '" + dir.path("fifo") + "': it is not a regular file");
}

}  // namespace
}  // namespace tandem::io
