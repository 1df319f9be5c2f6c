#include "worker/train/towers.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "worker/device/fake_device_backend.h"
#include "worker/device/device_manager.h"
#include "worker/model/device_placer.h"
#include "worker/model/reference_model.h"

namespace towerps::worker {
namespace {

v1::ModelSpec Spec(v1::LossType loss) {
  v1::ModelSpec m;
  m.set_name("t");
  m.set_input_dim(12);
  m.set_init_seed(5);
  for (int units : {32, 16, 6}) {
    auto* l = m.add_layers();
    l->set_type(v1::LayerSpec::DENSE);
    l->set_units(units);
    if (units != 6) l->set_activation(v1::RELU);
  }
  m.set_loss(loss);
  return m;
}

Batch RandomBatch(int rows, bool regression) {
  Batch b;
  b.features = common::Tensor({rows, 12});
  std::mt19937 gen(11);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < b.features.num_elements(); ++i) b.features[i] = normal(gen);
  if (regression) {
    b.targets = common::Tensor({rows, 6});
    for (int64_t i = 0; i < b.targets.num_elements(); ++i) b.targets[i] = normal(gen);
  } else {
    for (int i = 0; i < rows; ++i) b.labels.push_back(i % 6);
  }
  return b;
}

std::unique_ptr<Towers> Make(const v1::ModelSpec& spec, int n) {
  auto t = Towers::Create(spec, n, [] { return NewCpuBackend(); });
  EXPECT_TRUE(t.ok()) << t.status();
  (*t)->primary().InitializeWeights();
  return std::move(*t);
}

// One device and `towers` towers both within the float error bound of the
// exact gradient (worker/model/reference_model.h). The towers add, per element,
// each tower's weighting and the sum over towers (2 x towers) and the final
// scale, with one to spare.
int64_t TowerRoundings(int towers) { return 2 * towers + 2; }

void ExpectBothExact(const v1::ModelSpec& spec, const Batch& batch, Towers& one,
                     const LossResult& r1, Towers& many, const LossResult& rn) {
  auto ref = ComputeReferenceGradients(spec, one.weights(), batch);
  ASSERT_TRUE(ref.ok()) << ref.status();
  const int64_t extra = TowerRoundings(many.num_towers());
  ExpectLossWithinFloatBound(r1.loss_sum, *ref, 0, "one device");
  ExpectLossWithinFloatBound(rn.loss_sum, *ref, extra, "towers");
  if (!batch.labels.empty()) {
    EXPECT_EQ(r1.correct, ref->correct);
    EXPECT_EQ(rn.correct, ref->correct);
  }
  ExpectWithinFloatBound(one.gradients(), *ref, 0, "one device");
  ExpectWithinFloatBound(many.gradients(), *ref, extra, "towers");
}

void ExpectSameGradients(v1::LossType loss, int rows, int towers) {
  const v1::ModelSpec spec = Spec(loss);
  const Batch batch = RandomBatch(rows, loss != v1::SOFTMAX_CROSS_ENTROPY);
  auto one = Make(spec, 1);
  auto many = Make(spec, towers);
  auto r1 = one->ComputeGradients(batch);
  auto rn = many->ComputeGradients(batch);
  ASSERT_TRUE(r1.ok()) << r1.status();
  ASSERT_TRUE(rn.ok()) << rn.status();
  ExpectBothExact(spec, batch, *one, *r1, *many, *rn);
}

TEST(TowersTest, FourTowersEqualOneDeviceOnTheWholeBatch) {
  ExpectSameGradients(v1::SOFTMAX_CROSS_ENTROPY, 64, 4);
}

TEST(TowersTest, UnevenSplitsAndRegressionLosses) {
  ExpectSameGradients(v1::SOFTMAX_CROSS_ENTROPY, 37, 4);
  ExpectSameGradients(v1::MSE, 37, 3);
  ExpectSameGradients(v1::MAE, 10, 4);
}

TEST(TowersTest, MoreTowersThanExamplesLeavesSomeIdle) {
  ExpectSameGradients(v1::SOFTMAX_CROSS_ENTROPY, 3, 4);
}

DeviceTensor View(Backend& b, common::Tensor& t) {
  DeviceTensor d(&b);
  d.ViewHost(t.shape(), t.data());
  return d;
}

TEST(TowersTest, HostReducerComputesTheWeightedMean) {
  auto cpu = NewCpuBackend();
  common::Tensor a({2}, {1.0f, 2.0f}), b({2}, {4.0f, 8.0f}), c({2}, {100.0f, 100.0f});
  DeviceTensor da = View(*cpu, a), db = View(*cpu, b), dc = View(*cpu, c);
  auto r = NewReducer({{&da}, {&db}, {&dc}});
  EXPECT_EQ(r->Name(), "host (BLAS) sums (3 on cpu)");
  ASSERT_TRUE(r->Reduce({{&da}, {&db}, {&dc}}, {1, 3, 0}).ok());
  EXPECT_FLOAT_EQ(a[0], (1.0f + 12.0f) / 4.0f);
  EXPECT_FLOAT_EQ(a[1], (2.0f + 24.0f) / 4.0f);
  common::Tensor z({1}, {5.0f}), y({1}, {7.0f});
  DeviceTensor dz = View(*cpu, z), dy = View(*cpu, y);
  ASSERT_TRUE(r->Reduce({{&dz}, {&dy}}, {0, 0}).ok());
  EXPECT_FLOAT_EQ(z[0], 0.0f);
}

// Towers on "devices" with their own memory (two towers per space, like two
// virtual devices on each of two GPUs): sums within a space on that device,
// then a copy across spaces, and only tower 0's result downloaded.
TEST(TowersTest, DeviceMemoryTowersReduceOnTheDevicesAndEqualOneDevice) {
  std::vector<std::string> violations;
  std::vector<std::unique_ptr<Backend>> backends;
  for (int t = 0; t < 4; ++t) backends.push_back(NewFakeDeviceBackend(t / 2, &violations));
  const v1::ModelSpec spec = Spec(v1::SOFTMAX_CROSS_ENTROPY);
  auto many = Towers::Create(spec, 4, [&](int t) -> Model::LayerPlacer {
    Backend* b = backends[t].get();
    return [b](const std::string&, const std::string&) -> absl::StatusOr<Model::LayerPlacement> {
      return Model::LayerPlacement{b, ""};
    };
  });
  ASSERT_TRUE(many.ok()) << many.status();
  EXPECT_EQ((*many)->reducer().Name(),
            "on-device sums (2 on fake:0, 2 on fake:1) + copies to tower 0's device");
  (*many)->primary().InitializeWeights();
  auto one = Make(spec, 1);
  const Batch batch = RandomBatch(37, false);
  auto r1 = one->ComputeGradients(batch);
  const int64_t h2d = FakeHostToDeviceFloats(), d2d = FakeDeviceToDeviceFloats();
  auto rn = (*many)->ComputeGradients(batch);
  // Weights go up once (tower 0) and reach tower 2 (the other space) device
  // to device; towers 1 and 3 read their space leader's in place. Plus the
  // batch: 37 x 12 features and 37 labels.
  int64_t params = 0;
  for (common::Tensor* w : one->weights()) params += w->num_elements();
  EXPECT_EQ(FakeHostToDeviceFloats() - h2d, params + 37 * 12 + 37);
  // Device to device: the weights to tower 2, and its space's gradient sum
  // back to tower 0.
  EXPECT_EQ(FakeDeviceToDeviceFloats() - d2d, 2 * params);
  ASSERT_TRUE(r1.ok()) << r1.status();
  ASSERT_TRUE(rn.ok()) << rn.status();
  EXPECT_TRUE(violations.empty()) << violations[0];
  ExpectBothExact(spec, batch, *one, *r1, **many, *rn);
  // A second step with new weights uploads them again.
  for (common::Tensor* w : (*many)->weights()) w->Fill(0.01f);
  for (common::Tensor* w : one->weights()) w->Fill(0.01f);
  r1 = one->ComputeGradients(batch);
  rn = (*many)->ComputeGradients(batch);
  ASSERT_TRUE(r1.ok()) << r1.status();
  ASSERT_TRUE(rn.ok()) << rn.status();
  auto ref = ComputeReferenceGradients(spec, one->weights(), batch);
  ASSERT_TRUE(ref.ok()) << ref.status();
  ExpectLossWithinFloatBound(rn->loss_sum, *ref, TowerRoundings(4), "towers, second step");
}

TEST(TowersTest, BadArgumentsAreRejected) {
  EXPECT_EQ(Towers::Create(Spec(v1::MSE), 0, [] { return NewCpuBackend(); }).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Towers of models split over devices: with CPU=6 and 2 towers, each tower
// gets 3 devices (layers name tower 0's) and runs 2 micro-batches; the result
// equals one device's within the rounding bound.
TEST(TowersTest, TowersOfSplitModelsMatchOneDevice) {
  v1::ModelSpec spec;
  spec.set_name("split");
  spec.set_input_dim(12);
  for (int units : {24, 24, 16, 6}) {
    auto* l = spec.add_layers();
    l->set_type(v1::LayerSpec::DENSE);
    l->set_units(units);
    if (units != 6) l->set_activation(v1::RELU);
  }
  spec.set_loss(v1::SOFTMAX_CROSS_ENTROPY);
  const v1::ModelSpec whole_spec = spec;
  ASSERT_TRUE(ApplyClassicLayout({"CPU:0", "CPU:1", "CPU:2"}, &spec).ok());
  DeviceManagerOptions o;
  o.task_name = "/job:worker/replica:0/task:0";
  o.virtual_devices = "CPU=6";
  o.physical = {{"CPU", 0, int64_t{1} << 34, "host"}};
  auto devices = DeviceManager::Create(o);
  ASSERT_TRUE(devices.ok()) << devices.status();

  std::vector<std::unique_ptr<DevicePlacer>> placers;
  for (int t = 0; t < 2; ++t) placers.push_back(std::make_unique<DevicePlacer>(**devices));
  auto towers = Towers::Create(spec, 2, [&](int t) { return placers[t]->TowerPlacer(t, 2); });
  ASSERT_TRUE(towers.ok()) << towers.status();
  EXPECT_EQ((*towers)->tower(1).layer_devices()[0], "/job:worker/replica:0/task:0/device:CPU:3");
  EXPECT_EQ((*towers)->tower(1).layer_devices()[3], "/job:worker/replica:0/task:0/device:CPU:5");
  (*towers)->set_micro_batches(2);
  (*towers)->primary().InitializeWeights();
  auto backend = NewCpuBackend();
  auto whole = Model::Create(whole_spec, *backend);
  ASSERT_TRUE(whole.ok());
  (*whole)->InitializeWeights();
  const Batch batch = RandomBatch(9, /*regression=*/false);
  auto rt = (*towers)->ComputeGradients(batch);
  auto rw = (*whole)->ComputeGradients(batch);
  ASSERT_TRUE(rt.ok()) << rt.status();
  ASSERT_TRUE(rw.ok());
  // Two towers of two micro-batches each: the micro-batch sums (2), each
  // tower's weighting and the sum over towers (2 x 2) and the final scale
  // (1), with one to spare: 8 roundings on top of one device's.
  auto ref = ComputeReferenceGradients(whole_spec, (*whole)->weights(), batch);
  ASSERT_TRUE(ref.ok()) << ref.status();
  ExpectLossWithinFloatBound(rt->loss_sum, *ref, 8, "towers");
  ExpectLossWithinFloatBound(rw->loss_sum, *ref, 0, "whole");
  ExpectWithinFloatBound((*towers)->gradients(), *ref, 8, "towers");
  ExpectWithinFloatBound((*whole)->gradients(), *ref, 0, "whole");
}

}  // namespace
}  // namespace towerps::worker
