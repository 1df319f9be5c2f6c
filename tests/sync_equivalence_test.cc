// Sync data parallelism is exact: 2 workers with batch B each, in SYNC mode,
// end with the same weights (float tolerance) as 1 worker with batch 2B on the
// same data order. Real gRPC parameter servers on loopback, real trainers.
// The data set size leaves a short last batch, so the workers' shards differ
// in size (one is empty on that step) and the run must still finish.
#include <cmath>
#include <memory>
#include <random>
#include <thread>

#include "common/job_spec.h"
#include "common/rpc.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "ps/parameter_server.h"
#include "ps/ps_service.h"
#include "worker/device/backend.h"
#include "worker/model/dataset.h"
#include "worker/model/model.h"
#include "worker/train/ps_client.h"
#include "worker/train/trainer.h"

namespace towerps {
namespace {

struct Cluster {
  std::vector<std::unique_ptr<ps::ParameterServer>> servers;
  std::vector<std::unique_ptr<ps::ParameterServiceImpl>> services;
  std::vector<std::unique_ptr<grpc::Server>> grpc_servers;
  std::vector<std::string> addresses;

  explicit Cluster(int n) {
    for (int i = 0; i < n; ++i) {
      servers.push_back(std::make_unique<ps::ParameterServer>(
          ps::ParameterServerOptions{.task_index = i}));
      services.push_back(std::make_unique<ps::ParameterServiceImpl>(*servers.back(), 1 << 16));
      int port = 0;
      auto s = common::StartServer("127.0.0.1:0", {services.back().get()}, &port);
      EXPECT_TRUE(s.ok()) << s.status();
      grpc_servers.push_back(std::move(*s));
      addresses.push_back("127.0.0.1:" + std::to_string(port));
    }
  }
  ~Cluster() {
    for (auto& s : grpc_servers) s->Shutdown();
  }
};

v1::JobSpec SmallJob(v1::Mode mode) {
  v1::JobSpec job;
  job.set_job_id("equiv");
  auto* m = job.mutable_model();
  m->set_input_dim(8);
  for (int units : {16, 4}) {
    auto* l = m->add_layers();
    l->set_type(v1::LayerSpec::DENSE);
    l->set_units(units);
    if (units == 16) l->set_activation(v1::RELU);
  }
  m->set_loss(v1::SOFTMAX_CROSS_ENTROPY);
  job.mutable_optimizer()->set_type(v1::OptimizerSpec::ADAM);
  job.mutable_optimizer()->set_learning_rate(0.01f);
  job.set_mode(mode);
  job.set_global_batch_size(20);
  job.set_epochs(3);
  job.set_skip_eval(true);
  return worker::JobWithDefaults(job);
}

// 101 examples, 4 classes: steps of 20 leave a last batch of 1.
worker::Dataset RandomData() {
  worker::Dataset d;
  d.features = common::Tensor({101, 8});
  std::mt19937 gen(3);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < d.features.num_elements(); ++i) d.features[i] = normal(gen);
  for (int i = 0; i < 101; ++i) d.labels.push_back(i % 4);
  d.num_classes = 4;
  return d;
}

// Trains `num_workers` workers (threads) against a fresh cluster; returns the
// final weights, pulled from the servers.
std::vector<common::Tensor> Train(int num_workers, int num_ps, const worker::Dataset& data,
                                  int64_t* steps, int towers = 1) {
  Cluster cluster(num_ps);
  v1::JobSpec job = SmallJob(v1::SYNC);
  job.set_global_batch_size(20);  // per-worker batch = 20 / num_workers
  std::vector<std::unique_ptr<worker::Towers>> models;
  std::vector<std::unique_ptr<worker::ParameterClient>> clients;
  for (int w = 0; w < num_workers; ++w) {
    auto m = worker::Towers::Create(job.model(), towers, [] { return worker::NewCpuBackend(); });
    EXPECT_TRUE(m.ok()) << m.status();
    models.push_back(std::move(*m));
    worker::ParameterClientOptions o;
    o.ps_addresses = cluster.addresses;
    o.job_id = job.job_id();
    o.worker_task = w;
    o.chunk_bytes = 4096;  // several messages per variable
    auto c = worker::NewGrpcParameterClient(o, models.back()->primary().VariableDefs(), job.placement());
    EXPECT_TRUE(c.ok()) << c.status();
    clients.push_back(std::move(*c));
  }
  std::vector<absl::StatusOr<worker::TrainResult>> results(num_workers);
  std::vector<std::thread> threads;
  for (int w = 0; w < num_workers; ++w) {
    threads.emplace_back([&, w] {
      worker::TrainerOptions opts;
      opts.job = job;
      opts.worker_task = w;
      opts.num_workers = num_workers;
      opts.is_chief = w == 0;
      opts.progress = [](const std::string&) {};
      worker::Trainer t(opts, *models[w], *clients[w], data, data);
      results[w] = t.Run();
    });
  }
  for (auto& t : threads) t.join();
  for (auto& r : results) EXPECT_TRUE(r.ok()) << r.status();
  *steps = results[0].ok() ? results[0]->global_steps : -1;
  std::vector<common::Tensor> out;
  std::vector<common::Tensor*> ptrs;
  for (common::Tensor* w : models[0]->weights()) out.emplace_back(w->shape());
  for (auto& t : out) ptrs.push_back(&t);
  EXPECT_TRUE(clients[0]->Pull(0, 0, ptrs).ok());
  return out;
}

TEST(SyncEquivalenceTest, TwoWorkersMatchOneWorkerWithTheWholeBatch) {
  const worker::Dataset data = RandomData();
  int64_t steps1 = 0, steps2 = 0;
  std::vector<common::Tensor> one = Train(1, 1, data, &steps1);
  std::vector<common::Tensor> two = Train(2, 2, data, &steps2);
  EXPECT_EQ(steps1, 3 * 6);  // ceil(101 / 20) = 6 steps per epoch
  EXPECT_EQ(steps2, steps1);
  ASSERT_EQ(one.size(), two.size());
  double max_rel = 0, moved = 0;
  for (size_t v = 0; v < one.size(); ++v) {
    ASSERT_EQ(one[v].shape(), two[v].shape());
    for (int64_t i = 0; i < one[v].num_elements(); ++i) {
      const double a = one[v][i], b = two[v][i];
      max_rel = std::max(max_rel, std::abs(a - b) / std::max(1e-3, std::abs(a)));
      moved += std::abs(a);
    }
  }
  EXPECT_GT(moved, 0.0);
  EXPECT_LT(max_rel, 1e-4) << "2-worker sync weights differ from 1 worker with 2B";
}

TEST(SyncEquivalenceTest, TowersInsideAWorkerMatchOneDevice) {
  const worker::Dataset data = RandomData();
  int64_t s1 = 0, s4 = 0;
  std::vector<common::Tensor> one = Train(1, 1, data, &s1, /*towers=*/1);
  std::vector<common::Tensor> four = Train(2, 2, data, &s4, /*towers=*/4);
  EXPECT_EQ(s1, s4);
  double max_rel = 0;
  for (size_t v = 0; v < one.size(); ++v) {
    for (int64_t i = 0; i < one[v].num_elements(); ++i) {
      const double a = one[v][i], b = four[v][i];
      max_rel = std::max(max_rel, std::abs(a - b) / std::max(1e-3, std::abs(a)));
    }
  }
  EXPECT_LT(max_rel, 1e-4) << "2 workers x 4 towers differ from 1 device";
}

TEST(SyncEquivalenceTest, DifferentDataOrderGivesDifferentWeights) {
  // Guards the test above against passing trivially.
  const worker::Dataset data = RandomData();
  worker::Dataset shifted = data;
  for (auto& l : shifted.labels) l = (l + 1) % 4;
  int64_t s = 0;
  auto a = Train(1, 1, data, &s);
  auto b = Train(1, 1, shifted, &s);
  double diff = 0;
  for (size_t v = 0; v < a.size(); ++v) {
    for (int64_t i = 0; i < a[v].num_elements(); ++i) diff += std::abs(a[v][i] - b[v][i]);
  }
  EXPECT_GT(diff, 1e-2);
}

}  // namespace
}  // namespace towerps
