#include "common/initializer.h"

#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "proto/tensor.pb.h"

namespace towerps::common {
namespace {

TEST(InitializerTest, GlorotIsBoundedDeterministicAndSpread) {
  v1::Initializer init;
  init.set_type(v1::Initializer::GLOROT_UNIFORM);
  init.set_seed(7);
  init.set_fan_in(784);
  init.set_fan_out(256);
  std::vector<float> a(10000), b(10000);
  InitializeValues(init, absl::MakeSpan(a));
  InitializeValues(init, absl::MakeSpan(b));
  EXPECT_EQ(a, b);
  const float limit = std::sqrt(6.0f / 1040.0f);
  double sum = 0, sq = 0;
  for (float v : a) {
    EXPECT_LE(std::abs(v), limit);
    sum += v;
    sq += v * v;
  }
  EXPECT_NEAR(sum / a.size(), 0.0, 0.01 * limit);
  // Variance of U(-l, l) is l^2 / 3.
  EXPECT_NEAR(sq / a.size(), limit * limit / 3, 0.05 * limit * limit / 3);
  init.set_seed(8);
  InitializeValues(init, absl::MakeSpan(b));
  EXPECT_NE(a, b);
}

// A variable split into parts (PARTITIONED placement) is initialized part by
// part on different servers: the parts must give exactly the whole's values.
TEST(InitializerTest, PartsWithOffsetsConcatenateToTheWhole) {
  v1::Initializer init;
  init.set_type(v1::Initializer::GLOROT_UNIFORM);
  init.set_seed(11);
  init.set_fan_in(300);
  init.set_fan_out(20);
  std::vector<float> whole(6000);
  InitializeValues(init, absl::MakeSpan(whole));
  std::vector<float> joined;
  for (int64_t start : {0, 1, 2500, 4099}) {
    const int64_t end = start == 0 ? 1 : start == 1 ? 2500 : start == 2500 ? 4099 : 6000;
    v1::Initializer part = init;
    part.set_offset(start);
    std::vector<float> v(end - start);
    InitializeValues(part, absl::MakeSpan(v));
    joined.insert(joined.end(), v.begin(), v.end());
  }
  EXPECT_EQ(joined, whole);
}

TEST(InitializerTest, ZerosAndConstant) {
  std::vector<float> v(5, 3.0f);
  InitializeValues(v1::Initializer(), absl::MakeSpan(v));
  EXPECT_EQ(v, std::vector<float>(5, 0.0f));
  v1::Initializer c;
  c.set_type(v1::Initializer::CONSTANT);
  c.set_value(1.5f);
  InitializeValues(c, absl::MakeSpan(v));
  EXPECT_EQ(v, std::vector<float>(5, 1.5f));
}

TEST(InitializerTest, ValidationNamesTheBadField) {
  v1::Initializer init;
  EXPECT_TRUE(ValidateInitializer(init).ok());  // ZEROS
  init.set_type(v1::Initializer::GLOROT_UNIFORM);
  init.set_fan_in(3);
  init.set_fan_out(4);
  init.set_offset(100);
  EXPECT_TRUE(ValidateInitializer(init).ok());
  auto message = [](const v1::Initializer& i) {
    const absl::Status s = ValidateInitializer(i);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    return std::string(s.message());
  };
  v1::Initializer bad = init;
  bad.set_fan_in(-1);
  EXPECT_EQ(message(bad), "initializer.fan_in = -1 (want >= 0)");
  bad = init;
  bad.set_offset(-5);
  EXPECT_EQ(message(bad), "initializer.offset = -5 (want >= 0)");
  bad = init;
  bad.set_type(static_cast<v1::Initializer::Type>(7));
  EXPECT_EQ(message(bad), "initializer.type = 7 is unknown");
  v1::Initializer c;
  c.set_type(v1::Initializer::CONSTANT);
  c.set_value(2.5f);
  EXPECT_TRUE(ValidateInitializer(c).ok());
  c.set_value(NAN);
  EXPECT_EQ(message(c), "initializer.value = nan (want a finite number)");
  c.set_value(1.0f);
  c.set_value(-INFINITY);
  EXPECT_EQ(message(c), "initializer.value = -inf (want a finite number)");
}

}  // namespace
}  // namespace towerps::common
