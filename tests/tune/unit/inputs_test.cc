// The tuner's inputs and its check: values are a pure function of (name, rank, index), pieces of
// sliced inputs are pieces of the whole, scalars get their standard values, and the comparison
// catches a single wrong element, a missing result and a misshapen one.
#include "tandem/tune/inputs.h"

#include <gtest/gtest.h>

#include "tandem/comm/thread.h"
#include "tandem/core/error.h"
#include "tandem/dsl/dsl.h"

namespace tandem::tune {
namespace {

TEST(TuneInputs, ValuesArePositiveDeterministicAndDistinct) {
  for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{12345}, (int64_t{1} << 32) + 7}) {
    const float v = input_value("w", 0, i);
    EXPECT_GE(v, 0.25f);
    EXPECT_LT(v, 1.25f);
    EXPECT_EQ(v, input_value("w", 0, i));
  }
  int same_name = 0, same_rank = 0, same_index = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    same_name += input_value("w", 0, i) == input_value("m", 0, i);
    same_rank += input_value("g", 0, i) == input_value("g", 1, i);
    same_index += input_value("g", 0, i) == input_value("g", 0, i + 1);
  }
  EXPECT_LT(same_name, 5);
  EXPECT_LT(same_rank, 5);
  EXPECT_LT(same_index, 5);
}

dsl::Program sliced_program() {
  dsl::Program p("sliced");
  auto x = p.input(DType::F32, {"R", 3}, dsl::Layout::sliced(0), "x");
  auto y = p.input(DType::BF16, {"R", 3}, dsl::Layout::replicated(), "y");
  auto g = p.input(DType::F32, {"R", 3}, dsl::Layout::local(), "g");
  auto lr = p.scalar("lr");
  auto scale = p.scalar("grad_scale");
  auto other = p.scalar("alpha");
  p.output(x * lr + dsl::cast(y, DType::F32) * other + dsl::AllReduce(dsl::Sum, g) * scale, "out");
  return p;
}

TEST(TuneInputs, SlicedInputsArePiecesOfTheWhole) {
  const dsl::Program p = sliced_program();
  const dsl::SymbolMap sym = {{"R", 7}};
  for (int rank = 0; rank < 3; ++rank) {
    const exec::Placement place{1, 3, 0, rank};
    const exec::RunArgs a = make_args(p, place, sym, {});
    const Tensor& x = a.inputs.at("x");
    EXPECT_EQ(x.shape(), Shape({dsl::part_count(7, 3, rank), 3}));
    const int64_t off = dsl::part_offset(7, 3, rank) * 3;
    for (int64_t i = 0; i < x.numel(); ++i)
      EXPECT_EQ(x.get(i), input_value("x", 0, off + i)) << rank << " " << i;
    // Replicated: the same whole on every rank; Local: each rank its own.
    const Tensor& y = a.inputs.at("y");
    EXPECT_EQ(y.dtype(), DType::BF16);
    EXPECT_EQ(y.get(4), bf16_to_f32(f32_to_bf16(input_value("y", 0, 4))));
    EXPECT_EQ(a.inputs.at("g").get(4), input_value("g", rank, 4));
  }
}

TEST(TuneInputs, FillInputMatchesMakeArgs) {
  const dsl::Program p = sliced_program();
  const dsl::SymbolMap sym = {{"R", 5}};
  const exec::Placement place{1, 2, 0, 1};
  const exec::RunArgs a = make_args(p, place, sym, {});
  const std::vector<Shape> global = p.resolve_shapes(sym);
  for (int id : p.inputs()) {
    const std::string& name = p.stage(id).name;
    Tensor t = Tensor::zeros(a.inputs.at(name).dtype(), a.inputs.at(name).shape());
    fill_input(t, p, id, global[static_cast<size_t>(id)], place);
    for (int64_t i = 0; i < t.numel(); ++i)
      EXPECT_EQ(t.get(i), a.inputs.at(name).get(i)) << name << " " << i;
  }
  // A tensor of the wrong shape is tandem's bug, not the user's.
  EXPECT_THROW(fill_input(Tensor::zeros(DType::F32, Shape{2}), p, p.inputs()[0],
                          global[static_cast<size_t>(p.inputs()[0])], place),
               InternalError);
}

TEST(TuneInputs, ShrinkSizes) {
  const dsl::Program layer = dsl::workloads::megatron_layer();
  const dsl::SymbolMap big = {{"B", 4096}, {"K", 2048}, {"H", 1027}};
  // Small enough already: unchanged.
  EXPECT_EQ(shrink_sizes(layer, big, int64_t{1} << 23, 8), big);
  EXPECT_EQ(shrink_sizes(layer, big, 0, 8), big);
  const dsl::SymbolMap s = shrink_sizes(layer, big, int64_t{1} << 16, 8);
  int64_t most = 0;
  for (const Shape& sh : layer.resolve_shapes(s)) most = std::max(most, sh.numel());
  EXPECT_LE(most, int64_t{1} << 16);
  for (const auto& [name, e] : big) {
    EXPECT_EQ(s.at(name) % 8, e % 8) << name;  // remainders kept
    EXPECT_GE(s.at(name), 8) << name;
  }
  // Extents at or below twice the modulus stay as they are.
  const dsl::Program adam = dsl::workloads::adam();
  EXPECT_EQ(shrink_sizes(adam, {{"N", 12}}, 4, 8).at("N"), 12);
}

TEST(TuneInputs, StandardScalars) {
  const dsl::Program p = sliced_program();
  const exec::ScalarMap s = standard_scalars(p, 4, {{"alpha", 2.5}});
  EXPECT_DOUBLE_EQ(s.at("lr"), 1e-3);
  EXPECT_DOUBLE_EQ(s.at("grad_scale"), 0.25);
  EXPECT_DOUBLE_EQ(s.at("alpha"), 2.5);
  EXPECT_EQ(s.size(), 3u);
  EXPECT_DOUBLE_EQ(standard_scalars(p, 4).at("alpha"), 0.5);
  try {
    standard_scalars(p, 4, {{"beta", 1.0}});
    FAIL() << "an unknown scalar was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("no scalar 'beta'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(its scalars: lr, grad_scale, alpha)"), std::string::npos)
        << e.what();
  }
  // A scalar that keys a dropout mask gets an integer.
  const exec::ScalarMap d = standard_scalars(dsl::workloads::megatron_layer(), 2);
  EXPECT_DOUBLE_EQ(d.at("seed"), 1234.0);
}

TEST(TuneInputs, ReferenceResultsHoldOutputsAndUpdatedInputs) {
  const dsl::Program p = dsl::workloads::adam(DType::F32);
  comm::run_ranks(2, [&](comm::Communicator& comm) {
    const dsl::SymbolMap sym = {{"N", 33}};
    const Expected e = reference_results(p, comm, sym, standard_scalars(p, 2));
    ASSERT_EQ(e.values.size(), 3u);  // adam has no outputs; w, m and v are updated in place
    for (const char* n : {"w", "m", "v"}) {
      ASSERT_TRUE(e.values.count(n)) << n;
      EXPECT_EQ(e.values.at(n).numel(), 33);
    }
    // The weights moved from their initial values.
    EXPECT_NE(e.values.at("w").get(0), input_value("w", 0, 0));
  });
}

TEST(TuneInputs, CompareCatchesWrongMissingAndMisshapen) {
  const dsl::Program p = dsl::workloads::adam(DType::F32);
  const exec::Placement place{1, 2, 0, 1};
  Expected want;
  Tensor w = Tensor::empty(DType::F32, Shape{10});
  for (int64_t i = 0; i < 10; ++i) w.set(i, 1.0f + static_cast<float>(i));
  want.values["w"] = w;

  Check same = compare_results(p, place, want, {{"w", w.clone()}});
  EXPECT_TRUE(same.ok) << same.message;
  EXPECT_EQ(same.max_error, 0.0);

  Tensor close = w.clone();
  close.set(3, close.get(3) * (1 + 1e-6f));  // a rounding away: within tolerance
  EXPECT_TRUE(compare_results(p, place, want, {{"w", close}}).ok);

  Tensor wrong = w.clone();
  wrong.set(7, 8.5f);
  const Check c = compare_results(p, place, want, {{"w", wrong}});
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.message.find("'w' differs from the reference in 1 of 10 elements"), std::string::npos)
      << c.message;
  EXPECT_NE(c.message.find("[7] got 8.5 want 8"), std::string::npos) << c.message;
  EXPECT_GT(c.max_error, 0.0);

  const Check missing = compare_results(p, place, want, {});
  EXPECT_FALSE(missing.ok);
  EXPECT_NE(missing.message.find("'w' is missing"), std::string::npos) << missing.message;

  const Check shape = compare_results(p, place, want, {{"w", Tensor::zeros(DType::F32, Shape{4})}});
  EXPECT_FALSE(shape.ok);
  EXPECT_NE(shape.message.find("f32[4] in the schedule's results, f32[10]"), std::string::npos)
      << shape.message;

  Tensor nan = w.clone();
  nan.set(0, std::nanf(""));
  EXPECT_FALSE(compare_results(p, place, want, {{"w", nan}}).ok);
}

}  // namespace
}  // namespace tandem::tune
