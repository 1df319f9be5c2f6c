// The reference itself: it agrees with finite differences of its own loss,
// a float model on one device lies within its bound, and the bound is tight
// enough to mean something, and an error just past it is caught.
#include "worker/model/reference_model.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "worker/device/backend.h"
#include "worker/model/model.h"

namespace towerps::worker {
namespace {

v1::ModelSpec Spec(v1::LossType loss) {
  v1::ModelSpec m;
  m.set_name("ref");
  m.set_input_dim(7);
  m.set_init_seed(3);
  for (int units : {16, 12, 4}) {
    auto* l = m.add_layers();
    l->set_type(v1::LayerSpec::DENSE);
    l->set_units(units);
    if (units != 4) l->set_activation(v1::RELU);
  }
  m.mutable_layers(1)->set_no_bias(true);
  m.set_loss(loss);
  return m;
}

Batch RandomBatch(int rows, v1::LossType loss) {
  Batch b;
  b.features = common::Tensor({rows, 7});
  std::mt19937 gen(21);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < b.features.num_elements(); ++i) b.features[i] = normal(gen);
  if (loss == v1::SOFTMAX_CROSS_ENTROPY) {
    for (int i = 0; i < rows; ++i) b.labels.push_back(i % 4);
  } else {
    b.targets = common::Tensor({rows, 4});
    for (int64_t i = 0; i < b.targets.num_elements(); ++i) b.targets[i] = normal(gen);
  }
  return b;
}

// A float model of Spec(loss) on the CPU with initialized weights, and a
// batch of 13 examples.
class ReferenceModelTest : public testing::TestWithParam<v1::LossType> {
 protected:
  void SetUp() override {
    auto m = Model::Create(spec_, *backend_);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    model_->InitializeWeights();
  }

  const v1::ModelSpec spec_ = Spec(GetParam());
  const Batch batch_ = RandomBatch(13, GetParam());
  std::unique_ptr<Backend> backend_ = NewCpuBackend();
  std::unique_ptr<Model> model_;
};

TEST_P(ReferenceModelTest, FloatModelLiesWithinTheBound) {
  const v1::ModelSpec& spec = spec_;
  const Batch& batch = batch_;
  auto r = model_->ComputeGradients(batch);
  ASSERT_TRUE(r.ok()) << r.status();
  auto ref = ComputeReferenceGradients(spec, model_->weights(), batch);
  ASSERT_TRUE(ref.ok()) << ref.status();
  // 7+16+1 + 16+12+1 + 12+4+1 forward and backward, 13 rows, 4.
  EXPECT_EQ(ref->roundings, 24 + 29 + 17 + 13 + 4);
  ExpectWithinFloatBound(model_->gradients(), *ref, 0, "one device");
  ExpectLossWithinFloatBound(r->loss_sum, *ref, 0, "one device");
  if (GetParam() == v1::SOFTMAX_CROSS_ENTROPY) {
    EXPECT_EQ(r->correct, ref->correct);
  }

  // The bound is meaningful (well below 1e-3 of the largest element: about
  // 87 roundings x 6e-8 x its magnitude), and an error just past it is
  // caught, naming the element.
  std::vector<common::Tensor*> grads = model_->gradients();
  int64_t big = 0;
  for (int64_t i = 0; i < grads[0]->num_elements(); ++i) {
    if (std::fabs((*grads[0])[i]) > std::fabs((*grads[0])[big])) big = i;
  }
  const double bound = FloatGamma(ref->roundings) * ref->magnitude[0][big];
  EXPECT_LT(bound, 1e-3 * std::fabs(ref->value[0][big]));
  (*grads[0])[big] = static_cast<float>(ref->value[0][big] + 2 * bound);
  const absl::Status s = CheckWithinFloatBound(grads, *ref, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_NE(s.message().find(absl::StrCat("variable 0 element ", big, " ")), std::string::npos)
      << s;
}

// The reference's gradient is the derivative of its loss: central
// differences in double on a few weights of every variable.
TEST_P(ReferenceModelTest, GradientMatchesFiniteDifferencesOfTheLoss) {
  const v1::ModelSpec& spec = spec_;
  const Batch& batch = batch_;
  std::vector<common::Tensor*> w = model_->weights();
  auto ref = ComputeReferenceGradients(spec, w, batch);
  ASSERT_TRUE(ref.ok()) << ref.status();
  for (size_t v = 0; v < w.size(); ++v) {
    for (int64_t i = 0; i < w[v]->num_elements(); i += 5) {
      // Weights are floats: step by a power of two so that w +- h is exact.
      const float h = 1.0f / 1024, saved = (*w[v])[i];
      (*w[v])[i] = saved + h;
      const double plus = ComputeReferenceGradients(spec, w, batch)->loss_sum;
      (*w[v])[i] = saved - h;
      const double minus = ComputeReferenceGradients(spec, w, batch)->loss_sum;
      (*w[v])[i] = saved;
      const double numeric = (plus - minus) / (2.0 * h) / batch.size();
      // Central differences err by O(h^2 f''') ~ 1e-6 here; MAE and ReLU
      // kinks within h of a weight would break it, and are counted.
      EXPECT_NEAR(ref->value[v][i], numeric, 1e-5 + 1e-4 * std::fabs(numeric))
          << "variable " << v << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Losses, ReferenceModelTest,
                         testing::Values(v1::SOFTMAX_CROSS_ENTROPY, v1::MSE, v1::MAE));

TEST(ReferenceModelTest, RejectsWhatItDoesNotModel) {
  v1::ModelSpec spec = Spec(v1::MSE);
  const Batch batch = RandomBatch(3, v1::MSE);
  std::vector<common::Tensor*> none;
  EXPECT_EQ(ComputeReferenceGradients(spec, none, batch).status().code(),
            absl::StatusCode::kInvalidArgument);
  spec.mutable_layers(0)->set_type(v1::LayerSpec::LAYER_UNSPECIFIED);
  EXPECT_EQ(ComputeReferenceGradients(spec, none, batch).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace towerps::worker
