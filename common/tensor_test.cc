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

TEST(TensorTest, MoveToLivesInTheGivenMemoryAndCopiesOwnTheirs) {
  Tensor t({2, 3}, {1, 2, 3, 4, 5, 6});
  std::vector<float> memory(8, -1.0f);
  t.MoveTo(memory.data() + 1);
  EXPECT_TRUE(t.external());
  EXPECT_EQ(t.data(), memory.data() + 1);
  EXPECT_EQ(memory, (std::vector<float>{-1, 1, 2, 3, 4, 5, 6, -1}));
  memory[2] = 20.0f;  // the memory is the tensor
  EXPECT_EQ(t[1], 20.0f);
  t.Fill(0.5f);
  EXPECT_EQ(memory, (std::vector<float>{-1, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, -1}));

  Tensor copy = t;  // owns its own
  EXPECT_FALSE(copy.external());
  EXPECT_NE(copy.data(), t.data());
  EXPECT_EQ(std::vector<float>(copy.span().begin(), copy.span().end()),
            std::vector<float>(6, 0.5f));
  Tensor assigned;
  assigned = t;
  EXPECT_FALSE(assigned.external());
  EXPECT_EQ(assigned.num_elements(), 6);

  Tensor moved = std::move(t);  // takes the memory along
  EXPECT_TRUE(moved.external());
  EXPECT_EQ(moved.data(), memory.data() + 1);
  moved.MoveTo(nullptr);  // back into its own allocation
  EXPECT_FALSE(moved.external());
  EXPECT_NE(moved.data(), memory.data() + 1);
  EXPECT_EQ(moved[5], 0.5f);
  moved.MoveTo(memory.data() + 1);
  moved.Resize({3, 2});  // same elements: stays
  EXPECT_EQ(moved.data(), memory.data() + 1);
  moved.Resize({4, 2});  // more: its own allocation, the memory left alone
  EXPECT_FALSE(moved.external());
  EXPECT_EQ(moved.num_elements(), 8);
  moved.Fill(9.0f);
  EXPECT_EQ(memory, (std::vector<float>{-1, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, -1}));
}

// LiveAt takes the memory as it is: nothing is written there (a copy of
// the old values would be), and the old values are gone with its allocation.
TEST(TensorTest, LiveAtTakesTheValuesThereWithoutWritingThem) {
  Tensor t({2, 2}, {1, 2, 3, 4});
  std::vector<float> memory = {-1, 7, 8, 9, 10, -1};
  t.LiveAt(memory.data() + 1);
  EXPECT_TRUE(t.external());
  EXPECT_EQ(t.data(), memory.data() + 1);
  EXPECT_EQ(t.num_elements(), 4);
  EXPECT_EQ(std::vector<float>(t.span().begin(), t.span().end()),
            (std::vector<float>{7, 8, 9, 10}));
  EXPECT_EQ(memory, (std::vector<float>{-1, 7, 8, 9, 10, -1}));
  t.Fill(0.5f);  // the memory is the tensor
  EXPECT_EQ(memory, (std::vector<float>{-1, 0.5, 0.5, 0.5, 0.5, -1}));
  t.MoveTo(nullptr);  // back, with the values it has there
  EXPECT_FALSE(t.external());
  EXPECT_EQ(t[3], 0.5f);
}

}  // namespace
}  // namespace towerps::common
