// Extents and sizes as the command line writes them: suffixes, NAME=EXTENT, bare extents in
// symbol order, defaults, and the errors a user sees for anything else.
#include <gtest/gtest.h>

#include "tandem/core/error.h"
#include "tandem/dsl/dsl.h"
#include "tandem/tune/tune.h"

namespace tandem::tune {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TuneSizes, Extents) {
  EXPECT_EQ(parse_extent("1024", "x"), 1024);
  EXPECT_EQ(parse_extent("0", "x"), 0);
  EXPECT_EQ(parse_extent("64Mi", "x"), int64_t{64} << 20);
  EXPECT_EQ(parse_extent("16Ki", "x"), 16384);
  EXPECT_EQ(parse_extent("2Gi", "x"), int64_t{2} << 30);
  EXPECT_EQ(parse_extent("4K", "x"), 4000);
  EXPECT_EQ(parse_extent("3M", "x"), 3000000);
  EXPECT_EQ(parse_extent("1G", "x"), 1000000000);
  for (const char* bad : {"", "Mi", "12x", "-4", "1.5Mi", "64 Mi", "99999999999999999999"})
    EXPECT_NE(error_of([&] { parse_extent(bad, "--size N"); }).find("--size N"), std::string::npos)
        << bad;
  EXPECT_NE(error_of([&] { parse_extent("12x", "--size N"); }).find("'12x' is not an extent"),
            std::string::npos);
}

TEST(TuneSizes, NamedBareAndDefaults) {
  const dsl::Program layer = dsl::workloads::megatron_layer();  // symbols B, H, K
  EXPECT_EQ(parse_sizes(layer, {"B=8", "K=4", "H=2"}),
            (dsl::SymbolMap{{"B", 8}, {"H", 2}, {"K", 4}}));
  EXPECT_EQ(parse_sizes(layer, {"8", "2", "4"}),
            (dsl::SymbolMap{{"B", 8}, {"H", 2}, {"K", 4}}));  // sorted order
  EXPECT_EQ(parse_sizes(layer, {"K=4", "8", "2"}), (dsl::SymbolMap{{"B", 8}, {"H", 2}, {"K", 4}}));
  EXPECT_EQ(parse_sizes(layer, {"K=4"}, {{"B", 1}, {"H", 3}, {"K", 99}, {"N", 5}}),
            (dsl::SymbolMap{{"B", 1}, {"H", 3}, {"K", 4}}));
  const dsl::Program adam = dsl::workloads::adam();
  EXPECT_EQ(parse_sizes(adam, {"64Mi"}), (dsl::SymbolMap{{"N", int64_t{64} << 20}}));
}

TEST(TuneSizes, Errors) {
  const dsl::Program layer = dsl::workloads::megatron_layer();
  const dsl::Program adam = dsl::workloads::adam();
  EXPECT_EQ(error_of([&] { parse_sizes(adam, {"M=4"}); }),
            "--size M=4: workload 'adam' has no symbol 'M' (its symbols: N)");
  EXPECT_EQ(error_of([&] {
              parse_sizes(adam, {"N=4", "N=5"});
            }),
            "--size: symbol 'N' is given twice");
  EXPECT_EQ(error_of([&] {
              parse_sizes(adam, {"4", "5"});
            }),
            "--size: 2 bare extent(s) given, but workload 'adam' has 1 symbol(s) left to bind (its "
            "symbols: N)");
  EXPECT_EQ(
      error_of([&] { parse_sizes(layer, {"B=4"}); }),
      "--size: workload 'megatron_layer' needs an extent for symbol 'H' (e.g. --size H=1024)");
  EXPECT_NE(error_of([&] {
              parse_sizes(adam, {"N=lots"});
            }).find("--size N=lots: 'lots' is not an extent"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem::tune
