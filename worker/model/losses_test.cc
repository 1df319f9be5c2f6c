#include "worker/model/losses.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/tensor.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "worker/model/batch.h"

namespace towerps::worker {
namespace {

using common::Tensor;

void FillRandom(Tensor* t, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  for (int64_t i = 0; i < t->num_elements(); ++i) (*t)[i] = dist(gen);
}

// Mean per-example loss, the quantity whose gradient ComputeLoss returns.
double MeanLoss(v1::LossType type, const Tensor& pred, const Batch& batch) {
  LossResult r;
  EXPECT_TRUE(ComputeLoss(type, pred, batch, nullptr, &r).ok());
  return r.loss_sum / pred.dim(0);
}

void ExpectGradientMatchesFiniteDifferences(v1::LossType type, Tensor pred,
                                            const Batch& batch) {
  Tensor grad;
  LossResult r;
  ASSERT_TRUE(ComputeLoss(type, pred, batch, &grad, &r).ok());
  ASSERT_EQ(grad.shape(), pred.shape());
  const float eps = 1e-3f;
  for (int64_t i = 0; i < pred.num_elements(); ++i) {
    const float saved = pred[i];
    pred[i] = saved + eps;
    const double plus = MeanLoss(type, pred, batch);
    pred[i] = saved - eps;
    const double minus = MeanLoss(type, pred, batch);
    pred[i] = saved;
    const double numeric = (plus - minus) / (2.0 * eps);
    EXPECT_NEAR(grad[i], numeric, 1e-2 * std::max(std::fabs(numeric), 1e-2))
        << v1::LossType_Name(type) << " element " << i;
  }
}

TEST(SoftmaxCrossEntropyTest, ExactValue) {
  Tensor logits({2, 3}, {1, 2, 3, 3, 2, 1});
  Batch batch;
  batch.labels = {2, 1};
  LossResult r;
  Tensor grad;
  ASSERT_TRUE(
      ComputeLoss(v1::SOFTMAX_CROSS_ENTROPY, logits, batch, &grad, &r).ok());
  // Both rows: log(e^1 + e^2 + e^3) - z[label]. lse = 3.40760596.
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  EXPECT_NEAR(r.loss_sum, (lse - 3) + (lse - 2), 1e-6);
  EXPECT_EQ(r.correct, 1);  // Row 0 argmax 2 == 2; row 1 argmax 0 != 1.
  // grad = (softmax - onehot) / n.
  EXPECT_NEAR(grad[2], (std::exp(3 - lse) - 1) / 2, 1e-6);
  EXPECT_NEAR(grad[3], std::exp(3 - lse) / 2, 1e-6);
}

TEST(SoftmaxCrossEntropyTest, UnspecifiedMeansCrossEntropy) {
  Tensor logits({1, 2}, {0, 0});
  Batch batch;
  batch.labels = {0};
  LossResult r;
  ASSERT_TRUE(
      ComputeLoss(v1::LOSS_UNSPECIFIED, logits, batch, nullptr, &r).ok());
  EXPECT_NEAR(r.loss_sum, std::log(2.0), 1e-7);
}

TEST(SoftmaxCrossEntropyTest, StableForHugeLogits) {
  Tensor logits({1, 2}, {1000, 0});
  Batch batch;
  batch.labels = {1};
  LossResult r;
  Tensor grad;
  ASSERT_TRUE(
      ComputeLoss(v1::SOFTMAX_CROSS_ENTROPY, logits, batch, &grad, &r).ok());
  EXPECT_NEAR(r.loss_sum, 1000.0, 1e-3);
  EXPECT_NEAR(grad[0], 1.0f, 1e-6);
  EXPECT_NEAR(grad[1], -1.0f, 1e-6);
}

TEST(SoftmaxCrossEntropyTest, GradientMatchesFiniteDifferences) {
  Tensor logits({4, 5});
  FillRandom(&logits, 1);
  Batch batch;
  batch.labels = {0, 4, 2, 2};
  ExpectGradientMatchesFiniteDifferences(v1::SOFTMAX_CROSS_ENTROPY, logits,
                                         batch);
}

TEST(SoftmaxCrossEntropyTest, RejectsBadLabels) {
  Tensor logits({2, 3});
  Batch batch;
  batch.labels = {0, 3};
  LossResult r;
  absl::Status s =
      ComputeLoss(v1::SOFTMAX_CROSS_ENTROPY, logits, batch, nullptr, &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("label 3"), std::string::npos) << s;
  batch.labels = {0, -1};
  EXPECT_EQ(
      ComputeLoss(v1::SOFTMAX_CROSS_ENTROPY, logits, batch, nullptr, &r).code(),
      absl::StatusCode::kInvalidArgument);
  batch.labels = {0};
  s = ComputeLoss(v1::SOFTMAX_CROSS_ENTROPY, logits, batch, nullptr, &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("1 labels for 2 rows"), std::string::npos) << s;
}

TEST(RegressionLossTest, MseExactValue) {
  Tensor pred({2, 2}, {1, 2, 3, 5});
  Batch batch;
  batch.targets = Tensor({2, 2}, {0, 0, 3, 3});
  LossResult r;
  Tensor grad;
  ASSERT_TRUE(ComputeLoss(v1::MSE, pred, batch, &grad, &r).ok());
  // Example 0: (1 + 4) / 2 = 2.5; example 1: (0 + 4) / 2 = 2.
  EXPECT_DOUBLE_EQ(r.loss_sum, 4.5);
  EXPECT_EQ(r.correct, 0);
  // d/dp of mean over 2 examples of mean over 2 outputs: 2 * diff / 4.
  EXPECT_FLOAT_EQ(grad[0], 0.5f);
  EXPECT_FLOAT_EQ(grad[1], 1.0f);
  EXPECT_FLOAT_EQ(grad[2], 0.0f);
  EXPECT_FLOAT_EQ(grad[3], 1.0f);
}

TEST(RegressionLossTest, MaeExactValue) {
  Tensor pred({2, 2}, {1, -2, 3, 5});
  Batch batch;
  batch.targets = Tensor({2, 2}, {0, 0, 3, 3});
  LossResult r;
  Tensor grad;
  ASSERT_TRUE(ComputeLoss(v1::MAE, pred, batch, &grad, &r).ok());
  // Example 0: (1 + 2) / 2 = 1.5; example 1: (0 + 2) / 2 = 1.
  EXPECT_DOUBLE_EQ(r.loss_sum, 2.5);
  EXPECT_FLOAT_EQ(grad[0], 0.25f);
  EXPECT_FLOAT_EQ(grad[1], -0.25f);
  EXPECT_FLOAT_EQ(grad[2], 0.0f);
  EXPECT_FLOAT_EQ(grad[3], 0.25f);
}

TEST(RegressionLossTest, GradientsMatchFiniteDifferences) {
  Tensor pred({3, 4});
  FillRandom(&pred, 2);
  Batch batch;
  batch.targets = Tensor({3, 4});
  FillRandom(&batch.targets, 3);
  ExpectGradientMatchesFiniteDifferences(v1::MSE, pred, batch);
  ExpectGradientMatchesFiniteDifferences(v1::MAE, pred, batch);
}

TEST(RegressionLossTest, RejectsTargetShapeMismatch) {
  Tensor pred({2, 3});
  Batch batch;
  batch.targets = Tensor({2, 2});
  LossResult r;
  const absl::Status s = ComputeLoss(v1::MSE, pred, batch, nullptr, &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("targets shape [2,2]"), std::string::npos) << s;
}

TEST(LossTest, RejectsRank1PredictionsAndUnknownType) {
  Tensor pred({4});
  Batch batch;
  LossResult r;
  EXPECT_EQ(ComputeLoss(v1::MSE, pred, batch, nullptr, &r).code(),
            absl::StatusCode::kInvalidArgument);
  Tensor good({1, 1});
  batch.targets = Tensor({1, 1});
  EXPECT_EQ(ComputeLoss(static_cast<v1::LossType>(42), good, batch, nullptr, &r)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LossTest, EmptyBatchGivesZero) {
  Tensor pred({0, 3});
  Batch batch;
  batch.targets = Tensor({0, 3});
  LossResult r{5.0, 5};
  Tensor grad;
  ASSERT_TRUE(ComputeLoss(v1::MSE, pred, batch, &grad, &r).ok());
  EXPECT_EQ(r.loss_sum, 0.0);
  EXPECT_EQ(r.correct, 0);
  EXPECT_EQ(grad.num_elements(), 0);
  ASSERT_TRUE(
      ComputeLoss(v1::SOFTMAX_CROSS_ENTROPY, pred, batch, &grad, &r).ok());
  EXPECT_EQ(r.loss_sum, 0.0);
}

}  // namespace
}  // namespace towerps::worker
