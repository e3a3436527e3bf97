// The JIT compile cache: compiles once, then hits memory or disk; concurrent compiles of one key
// compile once; a failed compile reports the command and the compiler's words.
#include "tandem/exec/jit.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <thread>
#include <vector>

#include "tandem/core/error.h"

namespace tandem::exec {
namespace {

namespace fs = std::filesystem;

class JitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        fs::temp_directory_path() / fmt::format("tandem-jit-test-{}-{}", ::getpid(),
                                                ::testing::UnitTest::GetInstance()->random_seed());
    fs::remove_all(dir_);
    options_.cache_dir = dir_.string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A source no other test uses, so the process-wide counters move only because of this test.
  std::string source(int k) const {
    return fmt::format("extern \"C\" int answer_{0}(int x) {{ return x * {0} + {1}; }}\n", k,
                       ::testing::UnitTest::GetInstance()->current_test_info()->line());
  }

  fs::path dir_;
  JitOptions options_;
};

TEST_F(JitTest, CompilesThenHitsMemoryThenDisk) {
  const JitStats before = jit_stats();
  const std::string src = source(3);
  {
    auto m = jit_compile(src, options_);
    EXPECT_TRUE(m->compiled_now());
    auto fn = reinterpret_cast<int (*)(int)>(m->symbol("answer_3"));
    EXPECT_EQ(fn(2), 6 + ::testing::UnitTest::GetInstance()->current_test_info()->line());
    auto again = jit_compile(src, options_);
    EXPECT_EQ(again.get(), m.get());
  }
  // Unloaded now: the next request finds the shared object on disk and compiles nothing.
  auto m = jit_compile(src, options_);
  EXPECT_FALSE(m->compiled_now());
  const JitStats after = jit_stats();
  EXPECT_EQ(after.compiles - before.compiles, 1);
  EXPECT_EQ(after.memory_hits - before.memory_hits, 1);
  EXPECT_EQ(after.disk_hits - before.disk_hits, 1);
  // Sharded: <dir>/<first two digits of the key>/<key>.so
  EXPECT_TRUE(fs::exists(dir_ / m->key().substr(0, 2) / (m->key() + ".so")));
}

TEST_F(JitTest, KeyDependsOnSourceAndFlags) {
  const std::string src = source(5);
  const std::string k1 = jit_cache_key(src, options_);
  EXPECT_EQ(k1.size(), 32u);
  EXPECT_EQ(k1, jit_cache_key(src, options_));
  EXPECT_NE(k1, jit_cache_key(src + " ", options_));
  JitOptions o2 = options_;
  o2.flags = default_jit_flags();
  o2.flags.push_back("-DX=1");
  EXPECT_NE(k1, jit_cache_key(src, o2));
}

TEST_F(JitTest, ConcurrentRequestsCompileOnce) {
  const JitStats before = jit_stats();
  const std::string src = source(7);
  std::vector<std::thread> threads;
  std::vector<std::shared_ptr<JitModule>> modules(4);
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] { modules[i] = jit_compile(src, options_); });
  for (auto& t : threads) t.join();
  EXPECT_EQ(jit_stats().compiles - before.compiles, 1);
  const int line = ::testing::UnitTest::GetInstance()->current_test_info()->line();
  for (auto& m : modules)
    EXPECT_EQ(reinterpret_cast<int (*)(int)>(m->symbol("answer_7"))(1), 7 + line);
}

TEST_F(JitTest, FailedCompileReportsCommandAndCompilerOutput) {
  try {
    jit_compile("extern \"C\" int broken( { return }\n", options_);
    FAIL() << "expected a compile error";
  } catch (const UserError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("JIT compile failed"), std::string::npos) << what;
    EXPECT_NE(what.find("-march=native"), std::string::npos) << what;  // the command
    EXPECT_NE(what.find("error"), std::string::npos) << what;          // the compiler's words
  }
}

TEST_F(JitTest, MissingCompilerIsAClearError) {
  options_.cxx = "/nonexistent/c++";
  EXPECT_THROW(jit_compile(source(9), options_), UserError);
}

}  // namespace
}  // namespace tandem::exec
