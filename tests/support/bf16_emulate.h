// The suites that CTest runs a second time under TANDEM_BF16=emulate (tests/CMakeLists.txt)
// include this: on a CPU without AVX512_BF16 the emulated path is the only one, so that second
// run would repeat the first test for test; it skips every test, saying why.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "tandem/core/bf16.h"

namespace tandem::testing {

class Bf16EmulateRepeatsThePlainRun : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* forced = std::getenv("TANDEM_BF16");
    if (forced != nullptr && std::string(forced) == "emulate" && !cpu_has_avx512_bf16())
      GTEST_SKIP() << "TANDEM_BF16=emulate on a CPU without AVX512_BF16 is the path the run "
                      "without it took";
  }
};

inline ::testing::Environment* const bf16_emulate_environment =
    ::testing::AddGlobalTestEnvironment(new Bf16EmulateRepeatsThePlainRun);

}  // namespace tandem::testing
