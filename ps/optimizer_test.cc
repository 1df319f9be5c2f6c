#include "ps/optimizer.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace towerps::ps {
namespace {

std::unique_ptr<Optimizer> Make(v1::OptimizerSpec::Type type, float lr, int64_t n,
                                bool nesterov = false) {
  v1::OptimizerSpec s;
  s.set_type(type);
  s.set_learning_rate(lr);
  s.set_nesterov(nesterov);
  auto o = NewOptimizer(s, n);
  EXPECT_TRUE(o.ok()) << o.status();
  return std::move(o).value();
}

TEST(OptimizerTest, SgdHandComputed) {
  auto o = Make(v1::OptimizerSpec::SGD, 0.1f, 3);
  std::vector<float> w = {1.0f, -2.0f, 0.5f};
  std::vector<float> g = {0.5f, 1.0f, -4.0f};
  o->Apply(absl::MakeSpan(w), g, 1);
  EXPECT_FLOAT_EQ(w[0], 0.95f);
  EXPECT_FLOAT_EQ(w[1], -2.1f);
  EXPECT_FLOAT_EQ(w[2], 0.9f);
  EXPECT_EQ(o->slot_bytes(), 0);
}

TEST(OptimizerTest, MomentumHandComputed) {
  auto o = Make(v1::OptimizerSpec::MOMENTUM, 0.1f, 1);  // momentum 0.9
  std::vector<float> w = {1.0f};
  std::vector<float> g = {1.0f};
  o->Apply(absl::MakeSpan(w), g, 1);  // v = -0.1, w = 0.9
  EXPECT_FLOAT_EQ(w[0], 0.9f);
  o->Apply(absl::MakeSpan(w), g, 2);  // v = -0.09 - 0.1 = -0.19, w = 0.71
  EXPECT_FLOAT_EQ(w[0], 0.71f);
  EXPECT_EQ(o->slot_bytes(), 4);
  auto n = Make(v1::OptimizerSpec::MOMENTUM, 0.1f, 1, /*nesterov=*/true);
  std::vector<float> wn = {1.0f};
  n->Apply(absl::MakeSpan(wn), g, 1);  // v = -0.1; w += 0.9*-0.1 - 0.1 = -0.19
  EXPECT_FLOAT_EQ(wn[0], 0.81f);
}

TEST(OptimizerTest, AdamHandComputed) {
  auto o = Make(v1::OptimizerSpec::ADAM, 0.001f, 2);
  std::vector<float> w = {1.0f, 1.0f};
  std::vector<float> g = {0.2f, -3.0f};
  // Step 1: m = 0.1 g, v = 0.001 g^2, lr_t = 0.001 * sqrt(0.001) / 0.1,
  // update = lr_t * m / (sqrt(v) + 1e-7) = 0.001 * sign(g) (up to epsilon).
  o->Apply(absl::MakeSpan(w), g, 1);
  EXPECT_NEAR(w[0], 0.999f, 1e-6);
  EXPECT_NEAR(w[1], 1.001f, 1e-6);
  // Step 2 with the same gradient: m = 0.19 g, v = 0.001999 g^2,
  // lr_t = 0.001 * sqrt(1 - 0.999^2) / (1 - 0.81).
  o->Apply(absl::MakeSpan(w), g, 2);
  const double lr_t = 0.001 * std::sqrt(1 - 0.999 * 0.999) / (1 - 0.81);
  const double step0 = lr_t * 0.19 * 0.2 / (std::sqrt(0.001999 * 0.04) + 1e-7);
  EXPECT_NEAR(w[0], 0.999 - step0, 1e-6);
  EXPECT_EQ(o->slot_bytes(), 16);
}

TEST(OptimizerTest, DefaultsAndValidation) {
  v1::OptimizerSpec adam;
  adam.set_type(v1::OptimizerSpec::ADAM);
  auto d = OptimizerWithDefaults(adam);
  EXPECT_FLOAT_EQ(d.learning_rate(), 0.001f);
  EXPECT_FLOAT_EQ(d.epsilon(), 1e-7f);
  EXPECT_EQ(OptimizerWithDefaults(v1::OptimizerSpec()).type(), v1::OptimizerSpec::SGD);
  v1::OptimizerSpec bad;
  bad.set_learning_rate(-1.0f);
  auto s = ValidateOptimizer(bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("learning_rate"), std::string::npos);
  v1::OptimizerSpec m;
  m.set_type(v1::OptimizerSpec::MOMENTUM);
  m.set_momentum(1.5f);
  EXPECT_NE(ValidateOptimizer(m).message().find("momentum"), std::string::npos);
  EXPECT_FALSE(NewOptimizer(bad, 3).ok());
}

}  // namespace
}  // namespace towerps::ps
