// Model parallelism on CPU virtual devices: a model split layer-wise over 3
// devices gives the same loss and gradients as unsplit; placement is logged;
// a missing device is an error listing the devices; soft placement falls back.
#include "worker/model/device_placer.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "worker/device/fake_device_backend.h"
#include "worker/model/reference_model.h"

namespace towerps::worker {
namespace {

v1::ModelSpec Spec() {
  v1::ModelSpec m;
  m.set_name("split");
  m.set_input_dim(10);
  for (int units : {24, 24, 16, 5}) {
    auto* l = m.add_layers();
    l->set_type(v1::LayerSpec::DENSE);
    l->set_units(units);
    if (units != 5) l->set_activation(v1::RELU);
  }
  m.set_loss(v1::SOFTMAX_CROSS_ENTROPY);
  return m;
}

Batch RandomBatch() {
  Batch b;
  b.features = common::Tensor({9, 10});
  std::mt19937 gen(4);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < b.features.num_elements(); ++i) b.features[i] = normal(gen);
  for (int i = 0; i < 9; ++i) b.labels.push_back(i % 5);
  return b;
}

std::unique_ptr<DeviceManager> Cpus(int n, bool soft, std::vector<std::string>* log) {
  DeviceManagerOptions o;
  o.task_name = "/job:worker/replica:0/task:0";
  o.virtual_devices = "CPU=" + std::to_string(n);
  o.physical = {{"CPU", 0, int64_t{1} << 34, "host"}};
  o.allow_soft_placement = soft;
  o.log_device_placement = true;
  o.log_sink = [log](const std::string& line) { log->push_back(line); };
  auto m = DeviceManager::Create(o);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(*m);
}

// Same loss, predictions and gradients, bit for bit: the same arithmetic
// in the same order, on other devices.
void ExpectIdentical(Model& a, Model& b, const Batch& batch) {
  auto ra = a.ComputeGradients(batch);
  auto rb = b.ComputeGradients(batch);
  ASSERT_TRUE(ra.ok()) << ra.status();
  ASSERT_TRUE(rb.ok()) << rb.status();
  EXPECT_EQ(ra->loss_sum, rb->loss_sum);
  EXPECT_EQ(ra->correct, rb->correct);
  const std::vector<common::Tensor*> ga = a.gradients(), gb = b.gradients();
  ASSERT_EQ(ga.size(), gb.size());
  double norm = 0;
  for (size_t v = 0; v < ga.size(); ++v) {
    for (int64_t i = 0; i < ga[v]->num_elements(); ++i) {
      ASSERT_EQ((*ga[v])[i], (*gb[v])[i]) << "variable " << v << " element " << i;
      norm += std::abs((*gb[v])[i]);
    }
  }
  EXPECT_GT(norm, 1e-3);
}

// Both models' results within the float error bound of the exact (double)
// result for `spec` (see worker/model/reference_model.h): they sum in different
// orders (micro-batches, towers), so they may differ from each other in the
// last bits, but neither may be further from the exact value than its
// roundings allow. `extra_roundings`: the accumulations the split adds.
void ExpectBothExact(Model& a, Model& b, const v1::ModelSpec& spec, const Batch& batch,
                     int64_t extra_roundings) {
  auto ra = a.ComputeGradients(batch);
  auto rb = b.ComputeGradients(batch);
  ASSERT_TRUE(ra.ok()) << ra.status();
  ASSERT_TRUE(rb.ok()) << rb.status();
  auto ref = ComputeReferenceGradients(spec, b.weights(), batch);
  ASSERT_TRUE(ref.ok()) << ref.status();
  ExpectLossWithinFloatBound(ra->loss_sum, *ref, extra_roundings, "split");
  ExpectLossWithinFloatBound(rb->loss_sum, *ref, 0, "whole");
  if (!batch.labels.empty()) {
    EXPECT_EQ(ra->correct, ref->correct);
    EXPECT_EQ(rb->correct, ref->correct);
  }
  ExpectWithinFloatBound(a.gradients(), *ref, extra_roundings, "split");
  ExpectWithinFloatBound(b.gradients(), *ref, 0, "whole");
}

TEST(DevicePlacerTest, ClassicLayoutOverThreeCpusMatchesUnsplit) {
  std::vector<std::string> log;
  auto devices = Cpus(3, false, &log);
  v1::ModelSpec spec = Spec();
  ASSERT_TRUE(ApplyClassicLayout({"CPU:0", "CPU:1", "CPU:2"}, &spec).ok());
  EXPECT_EQ(spec.layers(0).device(), "CPU:0");
  EXPECT_EQ(spec.layers(1).device(), "CPU:1");
  EXPECT_EQ(spec.layers(2).device(), "CPU:2");
  EXPECT_EQ(spec.layers(3).device(), "CPU:2");

  DevicePlacer placer(*devices);
  auto split = Model::Create(spec, placer.Placer());
  ASSERT_TRUE(split.ok()) << split.status();
  auto backend = NewCpuBackend();
  auto whole = Model::Create(Spec(), *backend);
  ASSERT_TRUE(whole.ok());
  (*split)->InitializeWeights();
  (*whole)->InitializeWeights();

  EXPECT_EQ((*split)->layer_devices(),
            (std::vector<std::string>{"/job:worker/replica:0/task:0/device:CPU:0",
                                      "/job:worker/replica:0/task:0/device:CPU:1",
                                      "/job:worker/replica:0/task:0/device:CPU:2",
                                      "/job:worker/replica:0/task:0/device:CPU:2"}));
  ASSERT_EQ(log.size(), 4u);
  EXPECT_EQ(log[1], "layer \"dense_1\": /job:worker/replica:0/task:0/device:CPU:1");

  ExpectIdentical(**split, **whole, RandomBatch());
}

TEST(DevicePlacerTest, SplitOverDeviceMemoryMatchesUnsplit) {
  std::vector<std::string> log, violations;
  auto devices = Cpus(3, false, &log);
  v1::ModelSpec spec = Spec();
  ASSERT_TRUE(ApplyClassicLayout({"CPU:0", "CPU:1", "CPU:2"}, &spec).ok());
  DevicePlacer placer(*devices, [&](VirtualDevice& d)
                                    -> absl::StatusOr<std::unique_ptr<Backend>> {
    return NewFakeDeviceBackend(d.index(), &violations);
  });
  auto split = Model::Create(spec, placer.Placer());
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ((*split)->num_stages(), 3);
  auto backend = NewCpuBackend();
  auto whole = Model::Create(Spec(), *backend);
  ASSERT_TRUE(whole.ok());
  (*split)->InitializeWeights();
  (*whole)->InitializeWeights();
  ExpectIdentical(**split, **whole, RandomBatch());
  EXPECT_TRUE(violations.empty()) << violations[0];
  // Evaluation takes the same path.
  auto ea = (*split)->Evaluate(RandomBatch());
  auto eb = (*whole)->Evaluate(RandomBatch());
  ASSERT_TRUE(ea.ok() && eb.ok());
  EXPECT_DOUBLE_EQ(ea->loss_sum, eb->loss_sum);
  // And with micro-batches: a pipeline of device threads.
  (*split)->set_micro_batches(4);
  ExpectBothExact(**split, **whole, Spec(), RandomBatch(), 4);
  EXPECT_TRUE(violations.empty()) << violations[0];
}

// Micro-batches on a split model run as a pipeline (a thread per device)
// and give the whole batch's gradient, for every loss and for more
// micro-batches than examples.
TEST(DevicePlacerTest, MicroBatchPipelineMatchesNoMicroBatching) {
  std::vector<std::string> log;
  auto devices = Cpus(3, false, &log);
  for (v1::LossType loss : {v1::SOFTMAX_CROSS_ENTROPY, v1::MSE, v1::MAE}) {
    for (int micro : {2, 3, 4, 20}) {
      v1::ModelSpec spec = Spec();
      spec.set_loss(loss);
      ASSERT_TRUE(ApplyClassicLayout({"CPU:0", "CPU:1", "CPU:2"}, &spec).ok());
      DevicePlacer placer(*devices);
      auto split = Model::Create(spec, placer.Placer());
      ASSERT_TRUE(split.ok()) << split.status();
      (*split)->set_micro_batches(micro);
      v1::ModelSpec plain = Spec();
      plain.set_loss(loss);
      auto backend = NewCpuBackend();
      auto whole = Model::Create(plain, *backend);
      ASSERT_TRUE(whole.ok());
      (*split)->InitializeWeights();
      (*whole)->InitializeWeights();
      Batch batch = RandomBatch();
      if (loss != v1::SOFTMAX_CROSS_ENTROPY) {
        batch.labels.clear();
        batch.targets = common::Tensor({9, 5});
        for (int64_t i = 0; i < 45; ++i) batch.targets[i] = std::sin(i * 0.7);
      }
      SCOPED_TRACE(testing::Message() << "loss " << loss << ", " << micro << " micro-batches");
      ExpectBothExact(**split, **whole, plain, batch, micro);
      // A second step reuses the buffers and still agrees.
      ExpectBothExact(**split, **whole, plain, batch, micro);
    }
  }
}

// A stage that fails in the middle of a pipelined step (its device's memory
// runs out) fails the step with the device's error; no stage waits forever,
// and the model works again with a batch that fits.
TEST(DevicePlacerTest, PipelineFailureEndsTheStepWithTheDeviceError) {
  DeviceManagerOptions o;
  o.task_name = "/job:worker/replica:0/task:0";
  o.virtual_devices = "CPU=1x3";  // three devices of 1 MB
  o.physical = {{"CPU", 0, int64_t{1} << 34, "host"}};
  auto devices = DeviceManager::Create(o);
  ASSERT_TRUE(devices.ok()) << devices.status();
  v1::ModelSpec spec = Spec();
  ASSERT_TRUE(ApplyClassicLayout({"CPU:0", "CPU:1", "CPU:2"}, &spec).ok());
  DevicePlacer placer(**devices);
  auto model = Model::Create(spec, placer.Placer());
  ASSERT_TRUE(model.ok()) << model.status();
  (*model)->InitializeWeights();
  (*model)->set_micro_batches(4);
  Batch big;
  big.features = common::Tensor({20000, 10});
  for (int i = 0; i < 20000; ++i) big.labels.push_back(i % 5);
  auto r = (*model)->ComputeGradients(big);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_NE(r.status().message().find("cannot allocate"), std::string::npos) << r.status();
  auto ok = (*model)->ComputeGradients(RandomBatch());
  EXPECT_TRUE(ok.ok()) << ok.status();
}

// A tower's view of the devices: with CPU=6 and 2 towers, each tower gets 3
// devices and layers name tower 0's (worker/train:towers_test runs the towers).
TEST(DevicePlacerTest, TowerDeviceMapsTowerZerosNamesToEachTower) {
  std::vector<std::string> log;
  auto devices = Cpus(6, false, &log);
  EXPECT_EQ(*TowerDevice(*devices, "CPU:1", 1, 2), "CPU:4");
  auto outside = TowerDevice(*devices, "CPU:3", 0, 2);
  ASSERT_FALSE(outside.ok());
  EXPECT_NE(outside.status().message().find("each tower has 3 CPU device(s)"), std::string::npos)
      << outside.status();
  EXPECT_FALSE(TowerDevice(*devices, "CPU:0", 0, 7).ok());
}

TEST(DevicePlacerTest, MissingDeviceIsAnErrorListingDevices) {
  std::vector<std::string> log;
  auto devices = Cpus(2, false, &log);
  v1::ModelSpec spec = Spec();
  spec.mutable_layers(2)->set_device("GPU:7");
  DevicePlacer placer(*devices);
  auto m = Model::Create(spec, placer.Placer());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("no device GPU:7 for layer \"dense_2\"; devices: CPU:0, CPU:1"),
            std::string::npos)
      << m.status();
}

TEST(DevicePlacerTest, SoftPlacementFallsBackAndSaysSo) {
  std::vector<std::string> log;
  auto devices = Cpus(2, true, &log);
  v1::ModelSpec spec = Spec();
  spec.mutable_layers(2)->set_device("GPU:7");
  DevicePlacer placer(*devices);
  auto m = Model::Create(spec, placer.Placer());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->layer_devices()[2], "/job:worker/replica:0/task:0/device:CPU:0");
  bool fallback_logged = false;
  for (const auto& line : log) {
    if (line.find("no device GPU:7") != std::string::npos &&
        line.find("allow_soft_placement") != std::string::npos) {
      fallback_logged = true;
    }
  }
  EXPECT_TRUE(fallback_logged);
}

TEST(DevicePlacerTest, ClassicLayoutNeedsDevices) {
  v1::ModelSpec spec = Spec();
  EXPECT_EQ(ApplyClassicLayout({}, &spec).code(), absl::StatusCode::kInvalidArgument);
  // More layers than devices: the tail shares the last device.
  ASSERT_TRUE(ApplyClassicLayout({"CPU:0", "CPU:1"}, &spec).ok());
  EXPECT_EQ(spec.layers(2).device(), "CPU:1");
}

}  // namespace
}  // namespace towerps::worker

namespace towerps::worker {
namespace {

TEST(MemoryReservationTest, ChargesEachLayerToItsDeviceAndReleases) {
  std::vector<std::string> log;
  DeviceManagerOptions o;
  o.task_name = "/job:worker/replica:0/task:0";
  o.virtual_devices = "CPU=1x2";  // two devices of 1 MB
  o.physical = {{"CPU", 0, int64_t{1} << 34, "host"}};
  auto devices = DeviceManager::Create(o);
  ASSERT_TRUE(devices.ok()) << devices.status();
  v1::ModelSpec spec = Spec();  // 10-24(relu)-24(relu)-16(relu)-5
  ASSERT_TRUE(ApplyClassicLayout({"CPU:0", "CPU:1"}, &spec).ok());
  DevicePlacer placer(**devices);
  auto model = Model::Create(spec, placer.Placer());
  ASSERT_TRUE(model.ok()) << model.status();
  // Layer 0 on CPU:0: weights 10*24+24 = 264 floats, x2 for gradients; batch 8:
  // outputs and deltas of Dense and ReLU, 2*2*8*24 floats.
  const int64_t params0 = 2 * 264 * 4;
  const int64_t layer0 = params0 + 2 * 2 * 8 * 24 * 4;
  {
    auto r = MemoryReservation::Reserve(**model, **devices, /*max_batch=*/8);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ((*devices)->devices()[0]->bytes_in_use(), layer0);
    EXPECT_GT((*devices)->devices()[1]->bytes_in_use(), 0);
  }
  // The weights' reservation ends with it; the activation buffers belong to
  // the model and are charged while it lives.
  EXPECT_EQ((*devices)->devices()[0]->bytes_in_use(), layer0 - params0);
  model->reset();
  EXPECT_EQ((*devices)->devices()[0]->bytes_in_use(), 0);
  EXPECT_EQ((*devices)->devices()[1]->bytes_in_use(), 0);

  // A batch too large for 1 MB devices: the error names layer, device and bytes.
  model = Model::Create(spec, placer.Placer());
  ASSERT_TRUE(model.ok()) << model.status();
  auto too_big = MemoryReservation::Reserve(**model, **devices, /*max_batch=*/100000);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(too_big.status().message().find("layer \"dense\": /job:worker/replica:0/task:0/device:CPU:0: cannot allocate"),
            std::string::npos)
      << too_big.status();
  EXPECT_NE(too_big.status().message().find("bytes left"), std::string::npos);
  // Nothing stays allocated once the failed job's model is gone.
  model->reset();
  EXPECT_EQ((*devices)->devices()[0]->bytes_in_use(), 0);
  EXPECT_EQ((*devices)->devices()[1]->bytes_in_use(), 0);
}

}  // namespace
}  // namespace towerps::worker
