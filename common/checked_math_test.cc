#include "common/checked_math.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace towerps::common {
namespace {

TEST(CheckedMathTest, MulAndAddFitOrSayNot) {
  EXPECT_EQ(CheckedMul(3, 4), 12);
  EXPECT_EQ(CheckedMul(int64_t{1} << 31, (int64_t{1} << 31) - 1),
            (int64_t{1} << 62) - (int64_t{1} << 31));
  // The shape the attacker sent: [2^31, 2^33 - 1].
  EXPECT_FALSE(CheckedMul(int64_t{1} << 31, (int64_t{1} << 33) - 1).has_value());
  EXPECT_FALSE(CheckedMul(-(int64_t{1} << 62), 4).has_value());
  EXPECT_EQ(CheckedAdd(INT64_MAX - 1, 1), INT64_MAX);
  EXPECT_FALSE(CheckedAdd(INT64_MAX, 1).has_value());
}

TEST(CheckedMathTest, SaturatingStopsAtMax) {
  EXPECT_EQ(SaturatingMul(1000, 1000), 1000000);
  EXPECT_EQ(SaturatingMul(int64_t{1} << 40, int64_t{1} << 40), INT64_MAX);
  EXPECT_EQ(SaturatingAdd(INT64_MAX, INT64_MAX), INT64_MAX);
  EXPECT_EQ(SaturatingAdd(2, 3), 5);
}

}  // namespace
}  // namespace towerps::common
