// Helpers every suite may share: a scratch folder per test, and the message of the UserError a
// call must raise (in this process, or in a child with fewer privileges or a file-size limit),
// to compare with what a user should read.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "tandem/core/error.h"

namespace tandem::testing {

// A fresh folder under the system's temporary folder, removed with everything in it at the end.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "x";
    std::replace(name.begin(), name.end(), '/', '_');  // parameterised tests' names
    root_ = std::filesystem::temp_directory_path() /
            ("tandem-test-" + std::to_string(::getpid()) + "-" + name);
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string path(const std::string& name = "") const {
    return name.empty() ? root_.string() : (root_ / name).string();
  }
  // The names in the folder (or a sub-folder), sorted.
  std::vector<std::string> list(const std::string& sub = "") const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(sub.empty() ? root_ : root_ / sub))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  std::filesystem::path root_;
};

// The message of the UserError `f` throws; a test failure if it throws nothing or anything else.
template <typename F>
std::string user_error_of(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected a UserError, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected a UserError, nothing was thrown";
  return "";
}

// Runs `f` in a child process set up by `prepare` (a file-size limit, or giving up root, which
// writes anywhere) and returns the UserError message it raised, sent back through a pipe. The
// parent stays as it was: privileges and limits cannot be taken back once given up.
inline std::string user_error_in_child(const std::function<void()>& prepare,
                                       const std::function<void()>& f) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    prepare();
    std::string m = "no error";
    try {
      f();
    } catch (const UserError& e) {
      m = e.what();
    } catch (const std::exception& e) {
      m = std::string("not a UserError: ") + e.what();
    }
    if (::write(fds[1], m.data(), m.size()) < 0) ::_exit(4);
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string m;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) m.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  return m;
}

// For user_error_in_child: give up root (which writes anywhere) for user nobody.
inline void drop_root() {
  if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(3);
}

}  // namespace tandem::testing
