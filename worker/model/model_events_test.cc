// Model::ComputeGradients with StepEvents (the hooks that let worker/train
// overlap pulls and pushes with the compute): every variable is announced
// exactly once to each callback; no weight is read before its announcement
// and no gradient changes after it; the result is the step without events,
// bit for bit; on one device, on a two-stage pipeline with micro-batches
// (callbacks on the stages' threads), and for an empty batch.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/tensor.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "worker/device/backend.h"
#include "worker/model/batch.h"
#include "worker/model/model.h"

namespace towerps::worker {
namespace {

// Dense layers of 16, 12 and 4 units on `input_dim` inputs.
v1::ModelSpec Mlp(int input_dim = 20) {
  v1::ModelSpec spec;
  spec.set_name("mlp");
  spec.set_input_dim(input_dim);
  for (int units : {16, 12, 4}) {
    v1::LayerSpec* l = spec.add_layers();
    l->set_type(v1::LayerSpec::DENSE);
    l->set_units(units);
    if (units != 4) l->set_activation(v1::RELU);
  }
  return spec;
}

Batch RandomBatch(int64_t rows, uint64_t seed, int input_dim = 20) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> x(-1, 1);
  Batch b;
  b.features.Resize({rows, input_dim});
  for (int64_t i = 0; i < b.features.num_elements(); ++i) b.features[i] = x(gen);
  for (int64_t r = 0; r < rows; ++r) b.labels.push_back(static_cast<float>(r % 4));
  return b;
}

// `layers_per_stage` > 0: the model's layers alternate over two backends in
// runs of that many spec layers (a two-stage pipeline for Mlp() at 2).
struct Fixture {
  explicit Fixture(int layers_per_stage = 0, int input_dim = 20) {
    backends.push_back(NewCpuBackend());
    backends.push_back(NewCpuBackend());
    int layer = 0;
    auto m = Model::Create(Mlp(input_dim), [&](const std::string&, const std::string&)
                                      -> absl::StatusOr<Model::LayerPlacement> {
      const int b = layers_per_stage > 0 ? (layer++ / layers_per_stage) % 2 : 0;
      return Model::LayerPlacement{backends[b].get(), b == 0 ? "CPU:0" : "CPU:1"};
    });
    EXPECT_TRUE(m.ok()) << m.status();
    model = std::move(*m);
    model->InitializeWeights();
  }
  std::vector<std::unique_ptr<Backend>> backends;
  std::unique_ptr<Model> model;
};

// Runs a step with events on `f` whose weights start as NaN: each
// weights_needed fills its variables from `truth` (so a weight read before
// its announcement poisons the result), each gradients_ready copies its
// gradients out (so a later change shows) and fills its weights with NaN
// (so a weight read after its gradients' announcement poisons the rest).
// Checks the announcements; with `ready_in`, that the gradients came in that
// order of variables.
void CheckEvents(Fixture& f, const std::vector<common::Tensor>& truth, const Batch& batch,
                 bool layer_by_layer, std::vector<int> ready_in = {}) {
  const std::vector<common::Tensor*> w = f.model->weights();
  const std::vector<common::Tensor*> g = f.model->gradients();
  const int n = static_cast<int>(w.size());
  for (common::Tensor* t : w) t->Fill(std::numeric_limits<float>::quiet_NaN());
  absl::Mutex mu;
  std::vector<int> needed_order, ready_order;
  std::vector<int> needed(n, 0), ready(n, 0);
  std::vector<std::vector<float>> announced(n);
  Model::StepEvents events;
  events.weights_needed = [&](int first, int count) {
    absl::MutexLock lock(&mu);
    for (int v = first; v < first + count; ++v) {
      ++needed[v];
      needed_order.push_back(v);
      std::copy(truth[v].data(), truth[v].data() + truth[v].num_elements(), w[v]->data());
    }
    return absl::OkStatus();
  };
  events.gradients_ready = [&](int first, int count) {
    absl::MutexLock lock(&mu);
    for (int v = first; v < first + count; ++v) {
      ++ready[v];
      ready_order.push_back(v);
      announced[v].assign(g[v]->data(), g[v]->data() + g[v]->num_elements());
      // From here a server may write the next step's values there (one
      // worker, same host: ps/push_session.h), so nothing reads them
      // again this step: NaN would reach the gradients still to come.
      w[v]->Fill(std::numeric_limits<float>::quiet_NaN());
    }
    return absl::OkStatus();
  };
  auto r = f.model->ComputeGradients(batch, events);
  ASSERT_TRUE(r.ok()) << r.status();
  for (int v = 0; v < n; ++v) {
    EXPECT_EQ(needed[v], 1) << "variable " << v;
    EXPECT_EQ(ready[v], 1) << "variable " << v;
    ASSERT_EQ(announced[v].size(), static_cast<size_t>(g[v]->num_elements()));
    for (int64_t i = 0; i < g[v]->num_elements(); ++i) {
      ASSERT_EQ(announced[v][i], (*g[v])[i]) << "gradient " << v << " changed after it was final";
    }
  }
  if (layer_by_layer) {
    // Forward order for weights.
    EXPECT_TRUE(std::is_sorted(needed_order.begin(), needed_order.end()));
    ASSERT_EQ(ready_order.size(), static_cast<size_t>(n));
  }
  if (!ready_in.empty()) {
    EXPECT_EQ(ready_order, ready_in);
  }
}

void ExpectSameGradients(Model& a, Model& b) {
  const std::vector<common::Tensor*> ga = a.gradients(), gb = b.gradients();
  ASSERT_EQ(ga.size(), gb.size());
  for (size_t v = 0; v < ga.size(); ++v) {
    for (int64_t i = 0; i < ga[v]->num_elements(); ++i) {
      ASSERT_EQ((*ga[v])[i], (*gb[v])[i]) << "variable " << v << " element " << i;
    }
  }
}

std::vector<common::Tensor> Copy(const std::vector<common::Tensor*>& ts) {
  std::vector<common::Tensor> out;
  for (const common::Tensor* t : ts) out.push_back(*t);
  return out;
}

// Gradients in backward order (kernel and bias of the third dense layer,
// variables 4 and 5, first), except that the first layer's come before the
// second's when it is the larger: 20 x 16 + 16 elements against 16 x 12 +
// 12; with 4 inputs, 4 x 16 + 16 is not.
TEST(ModelEventsTest, OneDeviceAnnouncesLayerByLayerAndMatchesThePlainStep) {
  for (int input_dim : {20, 4}) {
    SCOPED_TRACE(absl::StrCat(input_dim, " inputs"));
    Fixture f(0, input_dim), plain(0, input_dim);
    const Batch batch = RandomBatch(32, 1, input_dim);
    auto expected = plain.model->ComputeGradients(batch);
    ASSERT_TRUE(expected.ok()) << expected.status();
    CheckEvents(f, Copy(plain.model->weights()), batch, /*layer_by_layer=*/true,
                input_dim == 20 ? std::vector<int>{4, 5, 0, 1, 2, 3}
                                : std::vector<int>{4, 5, 2, 3, 0, 1});
    ExpectSameGradients(*f.model, *plain.model);
  }
}

TEST(ModelEventsTest, PipelineStagesAnnounceFromTheirThreadsAndMatchThePlainStep) {
  Fixture f(/*layers_per_stage=*/2), plain(2);
  ASSERT_EQ(f.model->num_stages(), 2);
  f.model->set_micro_batches(4);
  plain.model->set_micro_batches(4);
  const Batch batch = RandomBatch(30, 2);
  auto expected = plain.model->ComputeGradients(batch);
  ASSERT_TRUE(expected.ok()) << expected.status();
  CheckEvents(f, Copy(plain.model->weights()), batch, /*layer_by_layer=*/false);
  ExpectSameGradients(*f.model, *plain.model);
}

TEST(ModelEventsTest, EmptyBatchAnnouncesEveryVariableWithZeroGradients) {
  Fixture f;
  Batch empty;
  empty.features.Resize({0, 20});
  CheckEvents(f, Copy(f.model->weights()), empty, /*layer_by_layer=*/false);
  for (common::Tensor* g : f.model->gradients()) {
    for (int64_t i = 0; i < g->num_elements(); ++i) ASSERT_EQ((*g)[i], 0.0f);
  }
}

TEST(ModelEventsTest, AnErrorFromACallbackStopsTheStep) {
  Fixture f;
  Model::StepEvents events;
  int ready = 0;
  events.weights_needed = [](int first, int) {
    return first == 2 ? absl::UnavailableError("ps 1 lost") : absl::OkStatus();
  };
  events.gradients_ready = [&](int, int) {
    ++ready;
    return absl::OkStatus();
  };
  auto r = f.model->ComputeGradients(RandomBatch(8, 3), events);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_EQ(ready, 0) << "no gradient is final when forward stopped";
}

}  // namespace
}  // namespace towerps::worker
