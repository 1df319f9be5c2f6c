#include "worker/model/model_limits.h"

#include <algorithm>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "worker/device/backend.h"
#include "worker/device/device_manager.h"
#include "worker/model/dataset.h"
#include "worker/model/model.h"

namespace towerps::worker {
namespace {

constexpr const char* kBuiltinModels[] = {"mlp",   "dense_stack", "cnn_small",
                                          "lenet", "resnet18",    "resnet_cifar"};

v1::ModelSpec Mlp(std::initializer_list<int> units) {
  v1::ModelSpec m;
  m.set_input_dim(784);
  m.set_loss(v1::SOFTMAX_CROSS_ENTROPY);
  for (int u : units) {
    auto* l = m.add_layers();
    l->set_type(v1::LayerSpec::DENSE);
    l->set_units(u);
  }
  return m;
}

TEST(ModelLimitsTest, CountsParametersAndActivationsOfAnMlp) {
  auto size = CheckModelLimits(Mlp({256, 256, 10}));
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(size->parameters, 785 * 256 + 257 * 256 + 257 * 10);  // 269322
  // Each layer's output and its gradient (no activations here).
  EXPECT_EQ(size->activations_per_example, 2 * (256 + 256 + 10));
  // Two towers of 32 examples: (2 x params + 1044 x 32) floats each.
  EXPECT_EQ(WorkerTrainingBytes(*size, 32, 2), (269322 * 2 + 1044 * 32) * 4 * 2);
  // The exact count agrees with the model Create builds.
  std::unique_ptr<Backend> backend = NewCpuBackend();
  auto model = Model::Create(Mlp({256, 256, 10}), *backend);
  ASSERT_TRUE(model.ok()) << model.status();
  int64_t built = 0;
  for (const auto& def : (*model)->VariableDefs()) {
    int64_t n = 1;
    for (int64_t d : def.shape()) n *= d;
    built += n;
  }
  EXPECT_EQ(built, size->parameters);
}

TEST(ModelLimitsTest, CountsConvolutions) {
  v1::ModelSpec m;
  m.set_input_dim(784);
  m.mutable_input_shape()->set_channels(1);
  m.mutable_input_shape()->set_height(28);
  m.mutable_input_shape()->set_width(28);
  auto* c = m.add_layers();
  c->set_type(v1::LayerSpec::CONV2D);
  c->set_filters(32);
  c->set_kernel_size(3);
  m.add_layers()->set_type(v1::LayerSpec::FLATTEN);
  auto size = CheckModelLimits(m);
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(size->parameters, 32 * 9 + 32);
  // A 3x3 window, no padding: 26x26, for the convolution and the flatten.
  EXPECT_EQ(size->activations_per_example, 2 * 32 * 26 * 26 + 2 * 32 * 26 * 26);
  // Strides and pools shrink the image: 28 -> 13 (3x3, stride 2) -> 6 (pool
  // 2); a max pool keeps its workspace and recomputed output too.
  c->set_strides(2);
  m.mutable_layers()->AddAllocated(new v1::LayerSpec(m.layers(1)));  // a second FLATTEN
  m.mutable_layers(1)->Clear();
  m.mutable_layers(1)->set_type(v1::LayerSpec::MAX_POOL2D);
  size = CheckModelLimits(m);
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(size->activations_per_example, 2 * 32 * 169 + 4 * 32 * 36 + 2 * 32 * 36);
  // With SAME padding the side is ceil(28 / 2) = 14, then 7.
  c->set_padding(v1::LayerSpec::PADDING_SAME);
  size = CheckModelLimits(m);
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(size->activations_per_example, 2 * 32 * 196 + 4 * 32 * 49 + 2 * 32 * 49);
  c->set_padding(v1::LayerSpec::PADDING_VALID);
  c->set_strides(0);
  m.mutable_layers()->RemoveLast();
  m.mutable_layers(1)->set_type(v1::LayerSpec::FLATTEN);
  c->set_kernel_size(1000);
  EXPECT_EQ(CheckModelLimits(m).status().message(),
            "model.layers[0].kernel_size = 1000 (limit 64)");
  c->set_kernel_size(3);
  c->set_filters(2000000000);
  EXPECT_EQ(CheckModelLimits(m).status().message(),
            "model.layers[0].filters = 2000000000 (limit 1048576)");
}

// The attacker's spec: a layer of 10^9 units. Refused with the field named,
// by Model::Create too (which the chief and the worker call), before any
// allocation.
TEST(ModelLimitsTest, AGiantLayerIsRefusedWithTheFieldNamed) {
  const v1::ModelSpec spec = Mlp({256, 1000000000, 10});
  const absl::Status st = CheckModelLimits(spec).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "model.layers[1].units = 1000000000 (limit 1048576)");
  std::unique_ptr<Backend> backend = NewCpuBackend();
  const absl::Status created = Model::Create(spec, *backend).status();
  EXPECT_EQ(created.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(created.message().find("model.layers[1].units = 1000000000"), std::string::npos)
      << created;
}

TEST(ModelLimitsTest, TotalParametersAndLayerCountAreBounded) {
  // Each width is allowed; their product is not: 785 x 2^20 > 2^28.
  const absl::Status st = CheckModelLimits(Mlp({1 << 20, 10})).status();
  EXPECT_EQ(st.message(),
            "model: about 823132160 parameters up to model.layers[0] (limit 268435456 for the "
            "whole model)");
  // Widths whose product overflows int64 saturate, never wrap.
  ModelLimits wide;
  wide.max_width = int64_t{1} << 40;
  wide.max_parameters = INT64_MAX - 1;
  v1::ModelSpec m = Mlp({2000000000, 2000000000, 2000000000, 2000000000});
  EXPECT_EQ(CheckModelLimits(m, wide).status().code(), absl::StatusCode::kInvalidArgument);
  v1::ModelSpec many = Mlp({});
  for (int i = 0; i < 1001; ++i) many.add_layers()->set_type(v1::LayerSpec::RELU_LAYER);
  EXPECT_EQ(CheckModelLimits(many).status().message(),
            "model.layers has 1001 layers (limit 1000)");
  v1::ModelSpec in = Mlp({10});
  in.set_input_dim(1 << 21);
  EXPECT_EQ(CheckModelLimits(in).status().message(),
            "model.input_dim = 2097152 (limit 1048576)");
}

// The default budget is half the host's memory: the built-in jobs, on two
// workers, fit a host of 4 GiB (resnet18, the largest, holds 1.08 GB per
// worker at its 128 examples: 28x28 images through 64-channel blocks).
TEST(ModelLimitsTest, TheBuiltInJobsFitInTwoGiBPerWorker) {
  for (const char* name : kBuiltinModels) {
    const v1::JobSpec job = JobWithDefaults(*BuiltinJob(name));
    auto size = CheckModelLimits(job.model());
    ASSERT_TRUE(size.ok()) << name << ": " << size.status();
    const int64_t bytes = WorkerTrainingBytes(*size, job.global_batch_size() / 2, 1);
    EXPECT_LT(bytes, int64_t{1} << 31) << name;  // resnet18: 1078422608
    std::cout << name << ": " << size->parameters << " parameters, " << bytes
              << " bytes per worker\n";
  }
}

// A spec with every layer type: a fused ReLU on each kind that has one,
// pools of both kinds, dropouts on images and rows, residual blocks with
// and without a projection, batch norms on images and rows.
v1::ModelSpec EveryLayerType() {
  v1::ModelSpec m;
  m.set_input_dim(3 * 8 * 8);
  m.set_loss(v1::SOFTMAX_CROSS_ENTROPY);
  m.mutable_input_shape()->set_channels(3);
  m.mutable_input_shape()->set_height(8);
  m.mutable_input_shape()->set_width(8);
  auto add = [&m](v1::LayerSpec::Type type) {
    v1::LayerSpec* l = m.add_layers();
    l->set_type(type);
    return l;
  };
  v1::LayerSpec* l = add(v1::LayerSpec::CONV2D);
  l->set_filters(4);
  l->set_kernel_size(3);
  l->set_padding(v1::LayerSpec::PADDING_SAME);
  l->set_activation(v1::RELU);
  add(v1::LayerSpec::BATCH_NORM)->set_activation(v1::RELU);
  add(v1::LayerSpec::RESIDUAL_BLOCK)->set_filters(4);  // no projection
  add(v1::LayerSpec::RESIDUAL_BLOCK)->set_filters(6);  // channels change: a projection
  add(v1::LayerSpec::MAX_POOL2D)->set_pool_size(2);
  add(v1::LayerSpec::DROPOUT)->set_rate(0.5f);
  l = add(v1::LayerSpec::RESIDUAL_BLOCK);  // strided: a projection
  l->set_filters(8);
  l->set_strides(2);
  l->set_activation(v1::RELU);
  add(v1::LayerSpec::AVG_POOL2D)->set_pool_size(2);
  add(v1::LayerSpec::GLOBAL_AVG_POOL2D);
  l = add(v1::LayerSpec::DENSE);
  l->set_units(16);
  l->set_activation(v1::RELU);
  add(v1::LayerSpec::BATCH_NORM);
  add(v1::LayerSpec::RELU_LAYER);
  add(v1::LayerSpec::DROPOUT)->set_rate(0.25f);
  add(v1::LayerSpec::DENSE)->set_units(10);
  return m;
}

// The estimate against what the layers allocate: a training step and an
// evaluation of a model on a CPU backend whose allocator counts its peak
// (the weights and gradients are the model's host tensors, outside it).
// The same bytes: a budget refuses what would not fit, and only that.
TEST(ModelLimitsTest, TheEstimateIsWhatALayersStepAllocates) {
  std::vector<std::pair<std::string, v1::ModelSpec>> models = {{"every layer type",
                                                                EveryLayerType()}};
  for (const char* name : kBuiltinModels) {
    models.emplace_back(name, JobWithDefaults(*BuiltinJob(name)).model());
  }
  for (const auto& [name, spec] : models) {
    auto size = CheckModelLimits(spec);
    ASSERT_TRUE(size.ok()) << name << ": " << size.status();
    for (int64_t batch : {3, 16}) {
      Allocator allocator("cpu", /*limit_bytes=*/0, NewHostMemoryBackend());
      std::unique_ptr<Backend> backend = NewCpuBackend(&allocator);
      auto model = Model::Create(spec, *backend);
      ASSERT_TRUE(model.ok()) << name << ": " << model.status();
      (*model)->InitializeWeights();
      Batch b;
      b.features = common::Tensor({batch, (*model)->input_dim()});
      for (int64_t i = 0; i < b.features.num_elements(); ++i) {
        b.features.data()[i] = static_cast<float>(i % 7) - 3.0f;
      }
      if (spec.loss() == v1::SOFTMAX_CROSS_ENTROPY) {
        b.labels.assign(batch, 1);
      } else {
        b.targets = common::Tensor({batch, (*model)->output_dim()});
      }
      ASSERT_TRUE((*model)->ComputeGradients(b).ok()) << name;
      ASSERT_TRUE((*model)->Evaluate(b).ok()) << name;
      const int64_t estimate = WorkerTrainingBytes(*size, batch, 1) - 8 * size->parameters;
      EXPECT_EQ(estimate, allocator.peak_bytes_in_use()) << name << " at " << batch
                                                         << " examples";
    }
  }
}

// With micro-batches, a step (and an evaluation, cut alike) holds the same
// activations, each micro-batch its part, and beyond them only what adds
// the micro-batches up: the partial sums of convolutions' kernels and
// layers' biases, and each micro-batch's batch-norm statistics. The
// estimate counts those (WorkerTrainingBytes at `micro_batches`), so it
// bounds the peak; until issue 16 it left them out. And until issue 16 the
// first micro-batch's buffers were sized for the whole batch (reserved,
// and grown by the evaluation), close to twice the activations at 2 or more.
TEST(ModelLimitsTest, MicroBatchesHoldNoMoreActivations) {
  std::vector<std::pair<std::string, v1::ModelSpec>> models = {{"every layer type",
                                                                EveryLayerType()}};
  for (const char* name : {"mlp", "cnn_small", "resnet_cifar"}) {
    models.emplace_back(name, JobWithDefaults(*BuiltinJob(name)).model());
  }
  for (const auto& [name, spec] : models) {
    auto size = CheckModelLimits(spec);
    ASSERT_TRUE(size.ok()) << name << ": " << size.status();
    const int64_t batch = 16;
    int64_t whole = 0;  // the peak of one micro-batch
    for (int m : {1, 2, 3}) {
      Allocator allocator("cpu", /*limit_bytes=*/0, NewHostMemoryBackend());
      std::unique_ptr<Backend> backend = NewCpuBackend(&allocator);
      auto model = Model::Create(spec, *backend);
      ASSERT_TRUE(model.ok()) << name << ": " << model.status();
      (*model)->InitializeWeights();
      (*model)->set_micro_batches(m);
      ASSERT_TRUE((*model)->PrepareBuffers(batch).ok()) << name;
      Batch b;
      b.features = common::Tensor({batch, (*model)->input_dim()});
      b.labels.assign(batch, 1);
      ASSERT_TRUE((*model)->ComputeGradients(b).ok()) << name;
      ASSERT_TRUE((*model)->Evaluate(b).ok()) << name;
      const int64_t peak = allocator.peak_bytes_in_use();
      const int64_t estimate = WorkerTrainingBytes(*size, batch, 1, m) - 8 * size->parameters;
      if (m == 1) {
        whole = peak;
        EXPECT_EQ(peak, estimate) << name;
        continue;
      }
      // What adds them up, at most.
      const int64_t adding = 4 * (size->floats_to_accumulate +
                                  (m - 1) * size->floats_per_micro_batch);
      EXPECT_GT(adding, 0) << name;
      EXPECT_LE(peak, whole + adding) << name << " in " << m << " micro-batches";
      EXPECT_LE(peak, estimate) << name << " in " << m << " micro-batches";
      std::cout << name << " in " << m << " micro-batches: " << peak << " bytes, "
                << whole << " in one, estimate " << estimate << "\n";
    }
  }
}

// TowerBatch is the largest part any tower gets: the largest WorkerSlice of
// a full global batch, cut among the towers with the larger parts first.
TEST(ModelLimitsTest, TowerBatchIsTheLargestPartATowerTrainsOn) {
  for (int64_t global = 1; global <= 40; ++global) {
    std::vector<int64_t> perm(global);
    for (int64_t i = 0; i < global; ++i) perm[i] = i;
    for (int workers = 1; workers <= 5; ++workers) {
      int64_t largest_slice = 0;
      for (int w = 0; w < workers; ++w) {
        largest_slice = std::max<int64_t>(
            largest_slice, static_cast<int64_t>(WorkerSlice(perm, global, 0, workers, w).size()));
      }
      for (int towers = 1; towers <= 4; ++towers) {
        // Towers::ComputeGradients: tower t gets rows / n, one more while
        // t < rows % n, so tower 0 the most.
        const int64_t first_tower = largest_slice / towers + (largest_slice % towers > 0 ? 1 : 0);
        EXPECT_EQ(TowerBatch(global, workers, towers), first_tower)
            << global << " examples, " << workers << " workers, " << towers << " towers";
      }
    }
  }
}

}  // namespace
}  // namespace towerps::worker
