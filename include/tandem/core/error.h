// Errors: UserError for bad input a user can fix (a bad flag, an ill-typed program), InternalError
// for a broken invariant inside tandem (a bug). Different types, different messages.
#pragma once

#include <fmt/format.h>

#include <source_location>
#include <stdexcept>
#include <string>

namespace tandem {

// A message as an error keeps it: every run of more than 300 characters without a space (a value
// quoted from a hostile file, a long name a check did not abbreviate) shown as abbreviated()
// does, so that an error stays one readable line whatever it quotes.
std::string readable_message(const std::string& what);

// Bad input: the message says what is wrong and what would be right.
class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& what) : std::runtime_error(readable_message(what)) {}
};

// A broken invariant: the message says where, and asks for a bug report.
class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& what) : std::logic_error(what) {}
};

template <typename... Args>
[[noreturn]] void user_error(fmt::format_string<Args...> f, Args&&... args) {
  throw UserError(fmt::format(f, std::forward<Args>(args)...));
}

[[noreturn]] void internal_error(const std::string& what,
                                 std::source_location where = std::source_location::current());

}  // namespace tandem

// Checks an internal invariant; a failure is tandem's bug, never the user's.
#define TANDEM_CHECK(cond, ...)                                           \
  do {                                                                    \
    if (!(cond))                                                          \
      ::tandem::internal_error(std::string("check failed: " #cond ": ") + \
                               fmt::format(__VA_ARGS__));                 \
  } while (0)
