#include "worker/device/loss_kernels.h"

#include <cmath>
#include <string>

#include "gtest/gtest.h"

namespace towerps::worker {
namespace {

TEST(HostLossTest, SoftmaxCrossEntropyOfTwoRows) {
  const float logits[4] = {0.0f, 0.0f, 2.0f, 0.0f};
  const float labels[2] = {1.0f, 0.0f};
  float grad[4];
  LossResult r;
  ASSERT_TRUE(HostLoss(LossKind::kSoftmaxCrossEntropy, 2, 2, logits, labels,
                       nullptr, grad, 2, &r)
                  .ok());
  const double want = std::log(2.0) + std::log1p(std::exp(-2.0));
  EXPECT_NEAR(r.loss_sum, want, 1e-12);
  EXPECT_EQ(r.correct, 1);  // row 0 ties: the lowest index (0) is not label 1
  EXPECT_FLOAT_EQ(grad[0], 0.25f);
  EXPECT_FLOAT_EQ(grad[1], -0.25f);
}

TEST(HostLossTest, MseAndMaeAreMeansOverTheRow) {
  const float pred[2] = {1.0f, 3.0f};
  const float targets[2] = {0.0f, 1.0f};
  LossResult mse, mae;
  ASSERT_TRUE(HostLoss(LossKind::kMse, 1, 2, pred, nullptr, targets, nullptr, 1, &mse).ok());
  ASSERT_TRUE(HostLoss(LossKind::kMae, 1, 2, pred, nullptr, targets, nullptr, 1, &mae).ok());
  EXPECT_DOUBLE_EQ(mse.loss_sum, 2.5);
  EXPECT_DOUBLE_EQ(mae.loss_sum, 1.5);
  EXPECT_EQ(mse.correct, 0);
}

TEST(HostLossTest, UnknownKindIsInvalidArgument) {
  LossResult r;
  const absl::Status s = HostLoss(static_cast<LossKind>(42), 0, 0, nullptr,
                                  nullptr, nullptr, nullptr, 0, &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "loss: unknown loss kind 42");
}

TEST(HostLossTest, SoftmaxCrossEntropyOverNoClassesIsInvalidArgument) {
  const float labels[1] = {0.0f};
  LossResult r;
  EXPECT_EQ(HostLoss(LossKind::kSoftmaxCrossEntropy, 1, 0, nullptr, labels,
                     nullptr, nullptr, 1, &r)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LossKindTest, Names) {
  EXPECT_EQ(std::string(LossKindName(LossKind::kSoftmaxCrossEntropy)), "softmax_cross_entropy");
  EXPECT_EQ(std::string(LossKindName(LossKind::kMse)), "mse");
  EXPECT_EQ(std::string(LossKindName(LossKind::kMae)), "mae");
  EXPECT_EQ(std::string(LossKindName(static_cast<LossKind>(9))), "unknown");
}

}  // namespace
}  // namespace towerps::worker
