#include "worker/model/model_limits.h"

#include <iostream>
#include <memory>

#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "worker/device/backend.h"
#include "worker/model/model.h"

namespace towerps::worker {
namespace {

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
  EXPECT_EQ(size->activations_per_example, 256 + 256 + 10);
  // Two towers of 32 examples: (2 x params + 2 x 522 x 32) floats each.
  EXPECT_EQ(WorkerTrainingBytes(*size, 32, 2), (269322 * 2 + 522 * 2 * 32) * 4 * 2);
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
  EXPECT_EQ(size->activations_per_example, 2 * 32 * 784);  // upper bound: 28x28 kept
  // Strides and pools shrink the image: 28 -> 14 (stride 2) -> 7 (pool 2).
  c->set_strides(2);
  m.mutable_layers()->AddAllocated(new v1::LayerSpec(m.layers(1)));  // a second FLATTEN
  m.mutable_layers(1)->Clear();
  m.mutable_layers(1)->set_type(v1::LayerSpec::MAX_POOL2D);
  size = CheckModelLimits(m);
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(size->activations_per_example, 32 * 196 + 32 * 49 + 32 * 49);
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
// workers, stay far below a small host's.
TEST(ModelLimitsTest, TheBuiltInJobsFitInHalfAGiBPerWorker) {
  for (const char* name : {"mlp", "dense_stack", "cnn_small", "lenet", "resnet18", "resnet_cifar"}) {
    const v1::JobSpec job = JobWithDefaults(*BuiltinJob(name));
    auto size = CheckModelLimits(job.model());
    ASSERT_TRUE(size.ok()) << name << ": " << size.status();
    const int64_t bytes = WorkerTrainingBytes(*size, job.global_batch_size() / 2, 1);
    EXPECT_LT(bytes, int64_t{1} << 29) << name;  // resnet18: 392198224
    std::cout << name << ": " << size->parameters << " parameters, " << bytes
              << " bytes per worker\n";
  }
}

}  // namespace
}  // namespace towerps::worker
