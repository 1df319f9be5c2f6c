// Trainer over real parameter servers on loopback (one worker, the chief):
// step count, metrics, falling loss, cancellation and errors from hooks.
#include "worker/train/trainer.h"

#include <atomic>
#include <cmath>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "common/cancellation.h"
#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "proto/job_service.pb.h"
#include "proto/ps.pb.h"
#include "worker/device/backend.h"
#include "worker/model/dataset.h"
#include "worker/train/local_ps_cluster.h"
#include "worker/train/ps_client.h"
#include "worker/train/towers.h"

namespace towerps::worker {
namespace {

using ::testing::HasSubstr;

constexpr float kLr = 0.05f;

// A linear regression on the ONES data: 4 inputs, 3 outputs, MSE.
v1::JobSpec OnesJob() {
  v1::JobSpec job;
  job.set_job_id("t");
  auto* m = job.mutable_model();
  m->set_input_dim(4);
  auto* l = m->add_layers();
  l->set_type(v1::LayerSpec::DENSE);
  l->set_units(3);
  m->set_loss(v1::MSE);
  job.mutable_optimizer()->set_type(v1::OptimizerSpec::SGD);
  job.mutable_optimizer()->set_learning_rate(kLr);
  job.mutable_data()->set_source(v1::DataSpec::ONES);
  job.set_mode(v1::SYNC);
  job.set_global_batch_size(5);
  job.set_epochs(3);
  return JobWithDefaults(job);
}

// One worker's pieces: a model, a client to the cluster, a trainer.
struct Worker {
  Worker(const LocalPsCluster& cluster, const v1::JobSpec& job,
         int worker_task = 0, int num_workers = 1) {
    auto t = Towers::Create(job.model(), 1, [] { return NewCpuBackend(); });
    EXPECT_TRUE(t.ok()) << t.status();
    towers = std::move(*t);
    ParameterClientOptions o;
    o.ps_addresses = cluster.addresses();
    o.job_id = job.job_id();
    o.worker_task = worker_task;
    o.peer_timeout = absl::Seconds(4);
    o.cancel = &cancel;
    auto c = NewGrpcParameterClient(o, towers->primary().VariableDefs(),
                                    job.placement());
    EXPECT_TRUE(c.ok()) << c.status();
    client = std::move(*c);
    options.job = job;
    options.worker_task = worker_task;
    options.num_workers = num_workers;
    options.is_chief = worker_task == 0;
    options.log_every_steps = 1;
    options.progress = [](const std::string&) {};
    options.on_metrics = [this](const v1::Metrics& m, bool epoch_end) {
      (epoch_end ? epochs : progress).push_back(m);
    };
    options.cancel = &cancel;
    options.last_step = &last_step;
    options.iterations = &iterations;
    options.on_iteration = [this](int64_t examples) {
      ++pushed;
      pushed_examples += examples;
    };
  }

  absl::StatusOr<TrainResult> Run(const Dataset& train, const Dataset& test) {
    Trainer trainer(options, *towers, *client, train, test);
    return trainer.Run();
  }

  common::CancellationToken cancel;
  std::unique_ptr<Towers> towers;
  std::unique_ptr<ParameterClient> client;
  TrainerOptions options;
  std::vector<v1::Metrics> progress;  // on_metrics(epoch_end = false)
  std::vector<v1::Metrics> epochs;    // on_metrics(epoch_end = true)
  std::atomic<int64_t> last_step{-1};
  std::atomic<int64_t> iterations{-1};
  int64_t pushed = 0;           // on_iteration calls (the training thread only)
  int64_t pushed_examples = 0;  // and their examples
};

int64_t ServerStep(LocalPsCluster& cluster, int s, const std::string& job) {
  v1::StatusRequest req;
  req.set_job_id(job);
  const v1::StatusResponse resp = cluster.server(s).Status(req);
  return resp.jobs_size() == 1 ? resp.jobs(0).global_step() : -1;
}

TEST(TrainerTest, RunsEpochsTimesStepsPerEpochWithSaneMetricsAndFallingLoss) {
  LocalPsCluster cluster(2);
  const v1::JobSpec job = OnesJob();
  const Dataset data = MakeOnes(/*n=*/18, /*input_dim=*/4, /*target_dim=*/3);
  const int64_t steps_per_epoch = 4;  // ceil(18 / 5): the last batch has 3
  const int64_t total = job.epochs() * steps_per_epoch;
  Worker w(cluster, job);
  auto result = w.Run(data, data);
  ASSERT_TRUE(result.ok()) << result.status();

  EXPECT_EQ(result->global_steps, total);
  EXPECT_EQ(result->iterations, total);
  EXPECT_EQ(result->stale_pushes, 0);
  EXPECT_TRUE(result->evaluated);
  EXPECT_TRUE(std::isnan(result->test_accuracy));  // regression
  EXPECT_EQ(w.last_step.load(), total);
  EXPECT_EQ(w.iterations.load(), total);
  EXPECT_EQ(w.pushed, total);
  EXPECT_EQ(w.pushed_examples, job.epochs() * 18);  // every example once per epoch
  for (int s = 0; s < 2; ++s)
    EXPECT_EQ(ServerStep(cluster, s, "t"), total) << "ps " << s;

  // One progress report per step (log_every_steps = 1), in order.
  ASSERT_EQ(static_cast<int64_t>(w.progress.size()), total);
  for (int64_t i = 0; i < total; ++i) {
    const v1::Metrics& m = w.progress[i];
    EXPECT_EQ(m.step(), i + 1);
    EXPECT_EQ(m.total_steps(), total);
    EXPECT_EQ(m.epoch(), i / steps_per_epoch + 1);
    EXPECT_EQ(m.epochs(), job.epochs());
    EXPECT_FALSE(m.has_accuracy());
    EXPECT_TRUE(std::isfinite(m.loss()) && m.loss() >= 0) << m.loss();
    EXPECT_GT(m.examples_per_s(), 0);
    EXPECT_EQ(m.job_examples_per_s(), m.examples_per_s());  // the job is this worker
    EXPECT_EQ(m.learning_rate(),
              static_cast<double>(kLr));  // constant schedule
    EXPECT_GE(m.wall_s(), 0);
  }
  // The loss falls. Every window is one batch of identical examples (all
  // ones), so each step's loss is the loss at the weights it pulled; the loss
  // is a convex quadratic whose curvature is at most 2 * (4 inputs + bias) =
  // 10, and gradient descent with lr 0.05 < 2 / 10 never raises it.
  for (int64_t i = 1; i < total; ++i) {
    EXPECT_LE(w.progress[i].loss(), w.progress[i - 1].loss())
        << "step " << i + 1;
  }
  EXPECT_LT(w.progress.back().loss(), 0.5 * w.progress.front().loss());

  // One evaluation per epoch, at the epoch's end, on the falling loss.
  ASSERT_EQ(w.epochs.size(), static_cast<size_t>(job.epochs()));
  for (int e = 0; e < job.epochs(); ++e) {
    const v1::Metrics& m = w.epochs[e];
    EXPECT_EQ(m.epoch(), e + 1);
    EXPECT_EQ(m.step(), (e + 1) * steps_per_epoch);
    EXPECT_TRUE(m.has_test());
    EXPECT_FALSE(m.has_accuracy());
    EXPECT_TRUE(std::isfinite(m.test_loss()));
    if (e > 0) {
      EXPECT_LT(m.test_loss(), w.epochs[e - 1].test_loss());
    }
  }
  EXPECT_EQ(result->test_loss, w.epochs.back().test_loss());

  // The step breakdown: every phase was timed, the parts add up to the loop
  // (other is the remainder, never negative), and the loop ran inside Run.
  const StepBreakdown& bd = result->breakdown;
  EXPECT_EQ(bd.steps, total);
  EXPECT_GT(bd.compute_s, 0);
  EXPECT_GT(bd.pull_s, 0);
  EXPECT_GT(bd.push_s, 0);
  EXPECT_GE(bd.other_s, 0);
  // Evaluations inside the loop (every epoch's but the last, which comes
  // after it) are part of other.
  EXPECT_GT(bd.eval_s, 0);
  // So is every step's batch, gathered apart from the evaluations.
  EXPECT_GT(bd.batches_s, 0);
  EXPECT_LE(bd.eval_s + bd.batches_s, bd.other_s);
  // The servers' holds overlap the compute (pulls go out before the step):
  // bounded by the loop, not by what the loop was blocked on.
  EXPECT_GE(bd.pull_wait_s, 0);
  EXPECT_LE(bd.pull_wait_s, bd.loop_s);
  EXPECT_GT(bd.cpu_s, 0);
  EXPECT_LE(bd.pull_s + bd.compute_s + bd.push_s, bd.loop_s);
  EXPECT_LE(bd.loop_s, result->wall_s);
  EXPECT_NE(bd.Describe().find(absl::StrCat(total, " steps, per step")), std::string::npos)
      << bd.Describe();
}

TEST(TrainerTest, LearnsASliceOfFashionMnist) {
  LocalPsCluster cluster(1);
  v1::JobSpec job = OnesJob();
  auto* m = job.mutable_model();
  m->set_input_dim(784);
  m->mutable_layers(0)->set_units(10);
  m->set_loss(v1::SOFTMAX_CROSS_ENTROPY);
  job.mutable_optimizer()->set_learning_rate(0.1f);
  job.set_global_batch_size(50);
  job.set_epochs(4);
  auto train = LoadFashionMnist("/usr/share/datasets/fashion-mnist", true, 200);
  ASSERT_TRUE(train.ok()) << train.status();
  Worker w(cluster, job);
  auto result = w.Run(*train, *train);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->global_steps, 4 * 4);
  ASSERT_EQ(w.epochs.size(), 4u);
  for (const v1::Metrics& e : w.epochs) {
    EXPECT_TRUE(e.has_accuracy());
    EXPECT_GE(e.test_accuracy(), 0.0);
    EXPECT_LE(e.test_accuracy(), 1.0);
  }
  for (const v1::Metrics& p : w.progress) {
    EXPECT_TRUE(p.has_accuracy());
    EXPECT_GE(p.accuracy(), 0.0);
    EXPECT_LE(p.accuracy(), 1.0);
  }
  // Full-batch-ish gradient descent on the 200 examples it is evaluated on:
  // the loss falls from epoch to epoch and ends well below chance (ln 10).
  for (size_t e = 1; e < w.epochs.size(); ++e) {
    EXPECT_LT(w.epochs[e].test_loss(), w.epochs[e - 1].test_loss())
        << "epoch " << e + 1;
  }
  EXPECT_LT(result->test_loss, std::log(10.0));
  EXPECT_GT(result->test_accuracy, 0.1);  // better than chance
}

TEST(TrainerTest, AsyncWorkersEachRunEveryIterationAndTheChiefSeesAll) {
  LocalPsCluster cluster(2);
  v1::JobSpec job = OnesJob();
  job.set_mode(v1::ASYNC);
  const Dataset data = MakeOnes(18, 4, 3);
  const int64_t total = job.epochs() * 4;  // iterations per worker
  Worker chief(cluster, job, 0, 2);
  Worker other(cluster, job, 1, 2);
  auto other_result =
      std::async(std::launch::async, [&] { return other.Run(data, data); });
  auto chief_result = chief.Run(data, data);
  ASSERT_TRUE(chief_result.ok()) << chief_result.status();
  const auto other_done = other_result.get();
  ASSERT_TRUE(other_done.ok()) << other_done.status();
  EXPECT_EQ(other_done->iterations, total);
  EXPECT_EQ(chief.iterations.load(), total);
  EXPECT_EQ(other.iterations.load(), total);
  // Every push of both is applied; the chief's final pull waits for all.
  EXPECT_EQ(chief_result->global_steps, 2 * total);
  EXPECT_TRUE(chief_result->evaluated);
  for (int s = 0; s < 2; ++s) EXPECT_EQ(ServerStep(cluster, s, "t"), 2 * total);
  EXPECT_TRUE(other.epochs.empty());  // only the chief reports
  EXPECT_TRUE(other.progress.empty());
}

// The job's examples in a window over the chief's, from the two rates of the
// same window (the seconds cancel, up to rounding).
double JobOverChief(const v1::Metrics& m) { return m.job_examples_per_s() / m.examples_per_s(); }

// 18 examples, global batch 5 over 2 workers: batches of 5, 5, 5, 3, of
// which the chief takes 3, 3, 3, 2 (the larger part first). Each window (one
// chief step) holds the global steps since the chief's last one, each of
// them `share` of its batch.
void ExpectSyncJobRates(const std::vector<v1::Metrics>& progress, double share) {
  auto global_batch = [](int64_t p) { return p % 4 == 3 ? 3.0 : 5.0; };
  int64_t prev = 0;
  for (const v1::Metrics& m : progress) {
    double job = 0;
    for (int64_t p = prev; p < m.step(); ++p) job += share * global_batch(p);
    const double chief = (m.step() - 1) % 4 == 3 ? 2.0 : 3.0;
    EXPECT_NEAR(JobOverChief(m), job / chief, 1e-12 * job / chief) << "step " << m.step();
    prev = m.step();
  }
}

// Trains `job` on `data` with two workers on a fresh 2-server cluster;
// returns the chief's progress reports (empty, after a failure, if either
// worker failed).
std::vector<v1::Metrics> ChiefProgressOfTwoWorkers(const v1::JobSpec& job, const Dataset& data) {
  LocalPsCluster cluster(2);
  Worker chief(cluster, job, 0, 2);
  Worker other(cluster, job, 1, 2);
  auto other_result = std::async(std::launch::async, [&] { return other.Run(data, data); });
  const auto chief_result = chief.Run(data, data);
  const auto other_done = other_result.get();
  EXPECT_TRUE(chief_result.ok()) << chief_result.status();
  EXPECT_TRUE(other_done.ok()) << other_done.status();
  if (!chief_result.ok() || !other_done.ok()) return {};
  return chief.progress;
}

TEST(TrainerTest, SyncChiefReportsTheWholeJobsExamplesPerSecond) {
  const Dataset data = MakeOnes(18, 4, 3);
  const std::vector<v1::Metrics> progress = ChiefProgressOfTwoWorkers(OnesJob(), data);
  ASSERT_EQ(progress.size(), 12u);  // one window per step
  ExpectSyncJobRates(progress, 1.0);

  // Backup workers (replicas_to_aggregate 1 of 2): a step applies one
  // worker's gradient, half of each global batch on average; steps the
  // chief sat out count too.
  v1::JobSpec backup = OnesJob();
  backup.set_replicas_to_aggregate(1);
  const std::vector<v1::Metrics> solo = ChiefProgressOfTwoWorkers(backup, data);
  ASSERT_FALSE(solo.empty());
  ExpectSyncJobRates(solo, 0.5);
}

TEST(TrainerTest, AsyncChiefCountsEveryWorkersPushesFromTheServersStep) {
  // Each window holds whole servers' steps of 5 / 2 examples each: together
  // at least the chief's own pushes (one may be answered before its update)
  // and at most both workers'.
  v1::JobSpec job = OnesJob();
  job.set_mode(v1::ASYNC);
  const int64_t total = job.epochs() * 4;
  const std::vector<v1::Metrics> progress = ChiefProgressOfTwoWorkers(job, MakeOnes(18, 4, 3));
  ASSERT_EQ(static_cast<int64_t>(progress.size()), total);
  double steps = 0;
  for (int64_t i = 0; i < total; ++i) {
    const double chief_examples = i % 4 == 3 ? 2 : 3;
    const double window_steps = JobOverChief(progress[i]) * chief_examples / 2.5;
    EXPECT_NEAR(window_steps, std::round(window_steps), 1e-9) << "step " << i + 1;
    EXPECT_GE(window_steps, -1e-9);
    steps += std::round(window_steps);
  }
  EXPECT_GE(steps, total - 1);
  EXPECT_LE(steps, 2 * total);
}

TEST(TrainerTest, CancelledTokenStopsAtTheNextStep) {
  LocalPsCluster cluster(2);
  const v1::JobSpec job = OnesJob();
  const Dataset data = MakeOnes(18, 4, 3);
  Worker w(cluster, job);
  // Cancel from inside the loop, after the third push: deterministic.
  w.options.on_metrics = [&w](const v1::Metrics& m, bool epoch_end) {
    if (!epoch_end && m.step() == 3) w.cancel.Cancel("user stopped it");
  };
  auto result = w.Run(data, data);
  ASSERT_EQ(result.status().code(), absl::StatusCode::kCancelled)
      << result.status();
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("user stopped it"));
  EXPECT_EQ(w.iterations.load(), 3);
  EXPECT_EQ(ServerStep(cluster, 0, "t"), 3);
}

TEST(TrainerTest, AnAfterPullErrorStopsTraining) {
  LocalPsCluster cluster(1);
  const Dataset data = MakeOnes(18, 4, 3);
  Worker w(cluster, OnesJob());
  w.options.after_pull = [](int64_t step) {
    return step == 2 ? absl::DataLossError("checkpoint at step 2 failed")
                     : absl::OkStatus();
  };
  auto result = w.Run(data, data);
  ASSERT_EQ(result.status().code(), absl::StatusCode::kDataLoss)
      << result.status();
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("checkpoint at step 2"));
  EXPECT_EQ(w.iterations.load(), 2);  // steps 0 and 1 pushed, not step 2
}

TEST(TrainerTest, AnEmptyTrainSetIsInvalidArgument) {
  LocalPsCluster cluster(1);
  Worker w(cluster, OnesJob());
  const Dataset empty = MakeOnes(0, 4, 3);
  auto result = w.Run(empty, empty);
  ASSERT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument)
      << result.status();
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("train set is empty"));
}

}  // namespace
}  // namespace towerps::worker
