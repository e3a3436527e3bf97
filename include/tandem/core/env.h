// Settings read from the environment (TANDEM_*), each declared once where it is used, with a
// default, in the manner of NCCL_PARAM.
#pragma once

#include <cstdint>
#include <string>

namespace tandem {

// The integer value of environment variable `name`, or `fallback` when unset or empty.
// A value that is not an integer, or not one of 64 bits, is a UserError naming the variable.
int64_t env_int(const char* name, int64_t fallback);

// The string value of environment variable `name`, or `fallback` when unset.
std::string env_str(const char* name, const std::string& fallback);

}  // namespace tandem
