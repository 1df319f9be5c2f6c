#include "common/tensor.h"

#include "gtest/gtest.h"

namespace towerps::common {
namespace {

TEST(TensorTest, ShapeAndZeroFill) {
  Tensor t({2, 3});
  EXPECT_EQ(t.rank(), 2);
  EXPECT_EQ(t.num_elements(), 6);
  EXPECT_EQ(t.num_bytes(), 24);
  EXPECT_EQ(t.ShapeString(), "[2,3]");
  for (int i = 0; i < 6; ++i) EXPECT_EQ(t[i], 0.0f);
}

TEST(TensorTest, ResizeKeepsAllocationWhenItFits) {
  Tensor t({4, 4});
  const float* before = t.data();
  t.Resize({2, 8});
  EXPECT_EQ(t.data(), before);
  EXPECT_EQ(t.ShapeString(), "[2,8]");
  t.Resize({3});
  EXPECT_EQ(t.num_elements(), 3);
}

TEST(TensorTest, ValuesConstructorPadsOrTruncatesToShape) {
  Tensor t({2}, {1.0f, 2.0f, 3.0f});
  EXPECT_EQ(t.num_elements(), 2);
  EXPECT_EQ(t[1], 2.0f);
  EXPECT_EQ(NumElements({}), 1);
}

}  // namespace
}  // namespace towerps::common
