// Tensor storage: alignment, views sharing storage, conversions, and allocator accounting.
#include "tandem/core/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "tandem/core/error.h"

namespace tandem {
namespace {

TEST(Tensor, StorageIs64ByteAligned) {
  for (int64_t n : {0, 1, 7, 1000}) {
    Tensor t = Tensor::empty(DType::F32, {n});
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u) << n;
    EXPECT_EQ(t.numel(), n);
  }
}

TEST(Tensor, SliceSharesStorage) {
  Tensor t = Tensor::zeros(DType::F32, {2, 5});
  Tensor s = t.flat_slice(3, 4);
  s.set(0, 7.0f);
  EXPECT_EQ(t.get(3), 7.0f);
  EXPECT_EQ(s.shape(), Shape({4}));
  EXPECT_EQ(t.str(), "f32[2, 5]");
}

TEST(Tensor, ViewOfForeignMemoryDoesNotOwn) {
  float buf[4] = {1, 2, 3, 4};
  Tensor t = Tensor::view_of(buf, DType::F32, {4});
  EXPECT_FALSE(t.owning());
  EXPECT_EQ(t.get(2), 3.0f);
}

TEST(Tensor, ConvertsBetweenDTypes) {
  Tensor t = Tensor::empty(DType::F32, {3});
  t.set(0, 1.0f);
  t.set(1, -2.5f);
  t.set(2, 1.0f + 0x1p-12f);
  Tensor b = t.to(DType::BF16);
  EXPECT_EQ(b.get(0), 1.0f);
  EXPECT_EQ(b.get(1), -2.5f);
  EXPECT_EQ(b.get(2), 1.0f);  // below bf16's resolution
  EXPECT_EQ(t.to(DType::F16).get(2), 1.0f);
}

// Every element takes the value, rounded to the dtype as set() rounds it, and nothing past the
// end is written (the element after a view is left alone).
TEST(Tensor, FillSetsEveryElementAsSetWould) {
  for (DType d : {DType::F32, DType::BF16, DType::F16})
    for (int64_t n : {0, 1, 2, 1001}) {
      Tensor whole = Tensor::zeros(d, {n + 1});
      whole.set(n, 9.0f);
      const Tensor t = whole.flat_slice(0, n);
      const float v = 1.0f + 0x1p-12f;
      t.fill(v);
      Tensor one = Tensor::empty(d, {1});
      one.set(0, v);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(t.get(i), one.get(0)) << dtype_name(d) << " " << i;
      EXPECT_EQ(whole.get(n), 9.0f) << dtype_name(d);
    }
}

TEST(Tensor, TypedAccessChecksTheDType) {
  Tensor t = Tensor::empty(DType::BF16, {2});
  EXPECT_NO_THROW(t.data_as<uint16_t>());
  EXPECT_THROW(t.data_as<float>(), InternalError);
}

TEST(Tensor, BadSlicesAndShapesAreUserErrors) {
  Tensor t = Tensor::empty(DType::F32, {10});
  try {
    t.flat_slice(8, 3);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(), "slice [8, 11) is out of range for tensor f32[10]");
  }
  EXPECT_THROW(t.reshape({3, 3}), UserError);
  EXPECT_THROW(Shape({2, -1}), UserError);
}

TEST(Allocator, CountingAllocatorTracksLiveAndPeak) {
  CountingAllocator counter;
  {
    Tensor a = Tensor::empty(DType::F32, {100}, counter);
    {
      Tensor b = Tensor::empty(DType::BF16, {50}, counter);
      EXPECT_EQ(counter.live_bytes(), 500u);
    }
    EXPECT_EQ(counter.live_bytes(), 400u);
  }
  EXPECT_EQ(counter.live_bytes(), 0u);
  EXPECT_EQ(counter.peak_bytes(), 500u);
}

}  // namespace
}  // namespace tandem
