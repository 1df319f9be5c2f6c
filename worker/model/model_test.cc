#include "worker/model/model.h"

#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/tensor.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "proto/tensor.pb.h"
#include "worker/device/backend.h"
#include "worker/model/batch.h"

namespace towerps::worker {
namespace {

using common::Tensor;

v1::LayerSpec DenseSpec(int units, bool relu = false) {
  v1::LayerSpec layer;
  layer.set_type(v1::LayerSpec::DENSE);
  layer.set_units(units);
  if (relu) layer.set_activation(v1::RELU);
  return layer;
}

v1::ModelSpec MlpSpec() {
  v1::ModelSpec spec;
  spec.set_name("mlp");
  spec.set_input_dim(784);
  *spec.add_layers() = DenseSpec(256, true);
  *spec.add_layers() = DenseSpec(256, true);
  *spec.add_layers() = DenseSpec(10);
  return spec;
}

void FillRandom(Tensor* t, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  for (int64_t i = 0; i < t->num_elements(); ++i) (*t)[i] = dist(gen);
}

TEST(ModelTest, MlpHas269322ParametersAndKerasSummary) {
  auto backend = NewCpuBackend();
  auto model = Model::Create(MlpSpec(), *backend);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->num_parameters(), 269322);
  EXPECT_EQ((*model)->output_dim(), 10);
  EXPECT_EQ((*model)->input_dim(), 784);
  // Dense+ReLU, Dense+ReLU, Dense.
  ASSERT_EQ((*model)->layers().size(), 5u);
  EXPECT_EQ((*model)->layers()[1]->TypeName(), "ReLU");
  EXPECT_EQ((*model)->layers()[1]->name(), "dense/relu");
  EXPECT_EQ((*model)->layers()[4]->name(), "dense_2");

  const std::string summary = (*model)->Summary();
  EXPECT_NE(summary.find("Model: \"mlp\""), std::string::npos) << summary;
  EXPECT_NE(summary.find(" Layer (type)                Output Shape"),
            std::string::npos)
      << summary;
  EXPECT_NE(summary.find(" dense (Dense)               (None, 256)"
                         "               200960"),
            std::string::npos)
      << summary;
  EXPECT_NE(summary.find(" dense_1 (Dense)             (None, 256)"
                         "               65792"),
            std::string::npos)
      << summary;
  EXPECT_NE(summary.find(" dense_2 (Dense)             (None, 10)"
                         "                2570"),
            std::string::npos)
      << summary;
  EXPECT_NE(summary.find("Total params: 269,322\n"), std::string::npos);
  EXPECT_NE(summary.find("Trainable params: 269,322\n"), std::string::npos);
}

TEST(ModelTest, DenseStackHas10211100Parameters) {
  v1::ModelSpec spec;
  spec.set_input_dim(100);
  *spec.add_layers() = DenseSpec(1000);
  for (int i = 0; i < 10; ++i) *spec.add_layers() = DenseSpec(1000);
  *spec.add_layers() = DenseSpec(100);
  spec.set_loss(v1::MSE);
  auto backend = NewCpuBackend();
  auto model = Model::Create(spec, *backend);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->num_parameters(), 10211100);
  EXPECT_NE((*model)->Summary().find("Total params: 10,211,100"),
            std::string::npos);
  int64_t total = 0;
  for (const auto& def : (*model)->VariableDefs()) {
    int64_t n = 1;
    for (int64_t d : def.shape()) n *= d;
    total += n;
  }
  EXPECT_EQ(total, 10211100);
  EXPECT_EQ((*model)->VariableDefs().size(), 24u);
}

TEST(ModelTest, VariableDefsInFixedOrderWithSeedsAndInitializers) {
  v1::ModelSpec spec;
  spec.set_input_dim(3);
  *spec.add_layers() = DenseSpec(4, true);
  v1::LayerSpec no_bias = DenseSpec(2);
  no_bias.set_no_bias(true);
  no_bias.set_name("head");
  *spec.add_layers() = no_bias;
  auto backend = NewCpuBackend();
  auto model = Model::Create(spec, *backend);
  ASSERT_TRUE(model.ok()) << model.status();
  const auto defs = (*model)->VariableDefs();
  ASSERT_EQ(defs.size(), 3u);
  EXPECT_EQ(defs[0].name(), "dense/kernel");
  EXPECT_EQ(defs[1].name(), "dense/bias");
  EXPECT_EQ(defs[2].name(), "head/kernel");
  EXPECT_EQ(
      std::vector<int64_t>(defs[0].shape().begin(), defs[0].shape().end()),
      (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(
      std::vector<int64_t>(defs[1].shape().begin(), defs[1].shape().end()),
      (std::vector<int64_t>{4}));
  EXPECT_EQ(defs[0].dtype(), v1::DT_FLOAT32);
  EXPECT_EQ(defs[0].initializer().type(), v1::Initializer::GLOROT_UNIFORM);
  EXPECT_EQ(defs[0].initializer().fan_in(), 3);
  EXPECT_EQ(defs[0].initializer().fan_out(), 4);
  EXPECT_EQ(defs[0].initializer().seed(), VariableSeed(1, 0));
  EXPECT_EQ(defs[2].initializer().seed(), VariableSeed(1, 2));
  EXPECT_NE(defs[0].initializer().seed(), defs[2].initializer().seed());
  EXPECT_EQ(defs[1].initializer().type(), v1::Initializer::ZEROS);
  EXPECT_EQ(defs[2].initializer().fan_in(), 4);

  // Same order and shapes for weights() and gradients().
  const auto w = (*model)->weights();
  const auto g = (*model)->gradients();
  ASSERT_EQ(w.size(), 3u);
  ASSERT_EQ(g.size(), 3u);
  for (size_t i = 0; i < defs.size(); ++i) {
    const std::vector<int64_t> shape(defs[i].shape().begin(),
                                     defs[i].shape().end());
    EXPECT_EQ(w[i]->shape(), shape) << i;
    EXPECT_EQ(g[i]->shape(), shape) << i;
  }

  // Another init_seed changes the seeds deterministically.
  spec.set_init_seed(7);
  auto other = Model::Create(spec, *backend);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*other)->VariableDefs()[0].initializer().seed(),
            VariableSeed(7, 0));
  EXPECT_NE(VariableSeed(7, 0), VariableSeed(1, 0));
}

TEST(ModelTest, InitializeWeightsFollowsGlorotAndIsDeterministic) {
  v1::ModelSpec spec;
  spec.set_input_dim(50);
  *spec.add_layers() = DenseSpec(30);
  auto backend = NewCpuBackend();
  auto a = Model::Create(spec, *backend);
  auto b = Model::Create(spec, *backend);
  ASSERT_TRUE(a.ok() && b.ok());
  (*a)->InitializeWeights();
  (*b)->InitializeWeights();
  const Tensor& kernel = *(*a)->weights()[0];
  const double limit = std::sqrt(6.0 / 80.0);
  double sum = 0, max_abs = 0;
  for (int64_t i = 0; i < kernel.num_elements(); ++i) {
    EXPECT_LE(std::fabs(kernel[i]), limit);
    EXPECT_EQ(kernel[i], (*(*b)->weights()[0])[i]);
    sum += kernel[i];
    max_abs = std::max(max_abs, std::fabs(double{kernel[i]}));
  }
  EXPECT_NEAR(sum / kernel.num_elements(), 0.0, 0.02);
  EXPECT_GT(max_abs, 0.9 * limit);
  for (float v : (*(*a)->weights()[1]).span()) EXPECT_EQ(v, 0.0f);
}

TEST(ModelTest, DefaultNamesSkipExplicitOnes) {
  v1::ModelSpec spec;
  spec.set_input_dim(2);
  *spec.add_layers() = DenseSpec(2);
  v1::LayerSpec named = DenseSpec(2);
  named.set_name("dense_1");
  *spec.add_layers() = named;
  *spec.add_layers() = DenseSpec(2);
  v1::LayerSpec relu;
  relu.set_type(v1::LayerSpec::RELU_LAYER);
  *spec.add_layers() = relu;
  *spec.add_layers() = relu;
  auto backend = NewCpuBackend();
  auto model = Model::Create(spec, *backend);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<std::string> names;
  for (const auto& layer : (*model)->layers()) names.push_back(layer->name());
  EXPECT_EQ(names, (std::vector<std::string>{"dense", "dense_1", "dense_2",
                                             "re_lu", "re_lu_1"}));
  EXPECT_NE((*model)->Summary().find(" re_lu (ReLU)                (None, 2)"),
            std::string::npos)
      << (*model)->Summary();
}

struct BadSpecCase {
  const char* what;
  v1::ModelSpec spec;
  const char* message;
};

TEST(ModelTest, RejectsInvalidSpecsNamingTheProblem) {
  std::vector<BadSpecCase> cases;
  {
    v1::ModelSpec s = MlpSpec();
    s.set_input_dim(0);
    cases.push_back({"input_dim", s, "input_dim must be > 0, got 0"});
  }
  {
    v1::ModelSpec s;
    s.set_input_dim(4);
    cases.push_back({"no layers", s, "layers is empty"});
  }
  {
    v1::ModelSpec s = MlpSpec();
    s.mutable_layers(1)->set_units(0);
    cases.push_back({"units", s, "layer 1: DENSE units must be > 0, got 0"});
  }
  {
    v1::ModelSpec s = MlpSpec();
    s.mutable_layers(2)->set_units(-3);
    s.mutable_layers(2)->set_name("out");
    cases.push_back({"named units", s, "layer 2 ('out'): DENSE units"});
  }
  {
    v1::ModelSpec s = MlpSpec();
    s.mutable_layers(0)->set_type(v1::LayerSpec::LAYER_UNSPECIFIED);
    cases.push_back({"unset type", s, "layer 0: type is unset"});
  }
  {
    v1::ModelSpec s = MlpSpec();
    s.mutable_layers(2)->set_type(static_cast<v1::LayerSpec::Type>(99));
    cases.push_back({"unknown type", s, "layer 2: unknown layer type 99"});
  }
  {
    v1::ModelSpec s = MlpSpec();
    s.mutable_layers(0)->set_activation(static_cast<v1::Activation>(5));
    cases.push_back({"activation", s, "layer 0: unknown activation 5"});
  }
  {
    v1::ModelSpec s = MlpSpec();
    s.mutable_layers(0)->set_name("x");
    s.mutable_layers(2)->set_name("x");
    cases.push_back({"duplicate", s, "layer 2 ('x'): name is used"});
  }
  {
    v1::ModelSpec s = MlpSpec();
    s.mutable_layers(0)->set_name("a/b");
    cases.push_back({"slash", s, "must not contain '/'"});
  }
  {
    v1::ModelSpec s = MlpSpec();
    s.set_loss(static_cast<v1::LossType>(17));
    cases.push_back({"loss", s, "unknown loss 17"});
  }
  auto backend = NewCpuBackend();
  for (const BadSpecCase& c : cases) {
    auto model = Model::Create(c.spec, *backend);
    ASSERT_FALSE(model.ok()) << c.what;
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument)
        << c.what;
    EXPECT_NE(model.status().message().find(c.message), std::string::npos)
        << c.what << ": " << model.status();
  }
}

// A small model and batch for gradient checks.
struct Fixture {
  std::unique_ptr<Backend> backend = NewCpuBackend();
  std::unique_ptr<Model> model;
  Batch batch;
};

Fixture MakeFixture(v1::LossType loss) {
  v1::ModelSpec spec;
  spec.set_input_dim(4);
  *spec.add_layers() = DenseSpec(5, true);
  *spec.add_layers() = DenseSpec(3);
  spec.set_loss(loss);
  Fixture f;
  auto model = Model::Create(spec, *f.backend);
  EXPECT_TRUE(model.ok()) << model.status();
  f.model = std::move(*model);
  f.model->InitializeWeights();
  // Non-zero biases so that the bias path is exercised.
  FillRandom(f.model->weights()[1], 11, 0.3f);
  FillRandom(f.model->weights()[3], 12, 0.3f);
  f.batch.features = Tensor({6, 4});
  FillRandom(&f.batch.features, 13);
  if (loss == v1::SOFTMAX_CROSS_ENTROPY) {
    f.batch.labels = {0, 1, 2, 2, 1, 0};
  } else {
    f.batch.targets = Tensor({6, 3});
    FillRandom(&f.batch.targets, 14);
  }
  return f;
}

void ExpectModelGradientsMatchFiniteDifferences(v1::LossType loss) {
  Fixture f = MakeFixture(loss);
  auto result = f.model->ComputeGradients(f.batch);
  ASSERT_TRUE(result.ok()) << result.status();
  std::vector<Tensor> grads;
  for (Tensor* g : f.model->gradients()) grads.push_back(*g);
  const double n = f.batch.size();
  const float eps = 1e-3f;
  const auto weights = f.model->weights();
  int checked = 0;
  for (size_t v = 0; v < weights.size(); ++v) {
    Tensor& w = *weights[v];
    for (int64_t i = 0; i < w.num_elements(); ++i) {
      const float saved = w[i];
      w[i] = saved + eps;
      const double plus = f.model->Evaluate(f.batch)->loss_sum / n;
      w[i] = saved - eps;
      const double minus = f.model->Evaluate(f.batch)->loss_sum / n;
      w[i] = saved;
      const double numeric = (plus - minus) / (2.0 * eps);
      EXPECT_NEAR(grads[v][i], numeric,
                  2e-2 * std::max(std::fabs(numeric), 0.05))
          << v1::LossType_Name(loss) << " variable " << v << " element " << i;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 4 * 5 + 5 + 5 * 3 + 3);
}

TEST(ModelTest, GradientsMatchFiniteDifferencesCrossEntropy) {
  ExpectModelGradientsMatchFiniteDifferences(v1::SOFTMAX_CROSS_ENTROPY);
}

TEST(ModelTest, GradientsMatchFiniteDifferencesMse) {
  ExpectModelGradientsMatchFiniteDifferences(v1::MSE);
}

TEST(ModelTest, GradientsMatchFiniteDifferencesMae) {
  ExpectModelGradientsMatchFiniteDifferences(v1::MAE);
}

TEST(ModelTest, EvaluateMatchesComputeGradientsAndLeavesGradients) {
  Fixture f = MakeFixture(v1::SOFTMAX_CROSS_ENTROPY);
  auto train = f.model->ComputeGradients(f.batch);
  ASSERT_TRUE(train.ok());
  const Tensor grad0 = *f.model->gradients()[0];
  Batch other = f.batch;
  FillRandom(&other.features, 99);
  ASSERT_TRUE(f.model->Evaluate(other).ok());
  for (int64_t i = 0; i < grad0.num_elements(); ++i) {
    EXPECT_EQ((*f.model->gradients()[0])[i], grad0[i]);
  }
  auto eval = f.model->Evaluate(f.batch);
  ASSERT_TRUE(eval.ok());
  EXPECT_DOUBLE_EQ(eval->loss_sum, train->loss_sum);
  EXPECT_EQ(eval->correct, train->correct);
  EXPECT_GT(eval->loss_sum, 0.0);
}

TEST(ModelTest, EmptyBatchGivesZeroGradients) {
  Fixture f = MakeFixture(v1::MSE);
  ASSERT_TRUE(f.model->ComputeGradients(f.batch).ok());
  double norm = 0;
  for (Tensor* g : f.model->gradients()) {
    for (float v : g->span()) norm += std::fabs(v);
  }
  ASSERT_GT(norm, 0.0);
  Batch empty;
  empty.features = Tensor({0, 4});
  empty.targets = Tensor({0, 3});
  auto result = f.model->ComputeGradients(empty);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->loss_sum, 0.0);
  EXPECT_EQ(result->correct, 0);
  for (Tensor* g : f.model->gradients()) {
    for (float v : g->span()) EXPECT_EQ(v, 0.0f);
  }
  EXPECT_EQ(f.model->Evaluate(Batch())->loss_sum, 0.0);
}

TEST(ModelTest, RejectsBadBatches) {
  Fixture f = MakeFixture(v1::SOFTMAX_CROSS_ENTROPY);
  Batch wrong_width;
  wrong_width.features = Tensor({2, 5});
  wrong_width.labels = {0, 1};
  auto result = f.model->ComputeGradients(wrong_width);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find("want [n,4]"), std::string::npos)
      << result.status();
  Batch bad_label = f.batch;
  bad_label.labels[3] = 3;
  EXPECT_EQ(f.model->Evaluate(bad_label).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ModelTest, SgdStepsReduceLoss) {
  Fixture f = MakeFixture(v1::SOFTMAX_CROSS_ENTROPY);
  const double before = f.model->Evaluate(f.batch)->loss_sum;
  for (int step = 0; step < 50; ++step) {
    ASSERT_TRUE(f.model->ComputeGradients(f.batch).ok());
    const auto w = f.model->weights();
    const auto g = f.model->gradients();
    for (size_t i = 0; i < w.size(); ++i) {
      f.backend->Axpy(w[i]->num_elements(), -0.5f, g[i]->data(), w[i]->data());
    }
  }
  const auto after = f.model->Evaluate(f.batch);
  EXPECT_LT(after->loss_sum, 0.5 * before);
  EXPECT_GE(after->correct, 5);
}

}  // namespace
}  // namespace towerps::worker
