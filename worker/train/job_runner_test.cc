// RunJob end to end in one process: CPU devices from a DeviceManager, real
// parameter servers on loopback, a small ONES job; jobs that cannot run here
// fail with InvalidArgument naming the problem; cancellation.
#include "worker/train/job_runner.h"

#include <sys/stat.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "common/job_spec.h"
#include "common/process_memory.h"
#include "common/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "proto/job_service.pb.h"
#include "worker/device/cpu_gemm.h"
#include "worker/device/cpu_threads.h"
#include "worker/device/device_manager.h"
#include "worker/train/local_ps_cluster.h"

namespace towerps::worker {
namespace {

using ::testing::HasSubstr;

// ONES regression, 4 -> 8 (relu) -> 3, 20 examples in batches of 5: 4 steps
// per epoch.
v1::JobSpec SmallJob() {
  v1::JobSpec job;
  job.set_job_id("small");
  auto* m = job.mutable_model();
  m->set_input_dim(4);
  for (int units : {8, 3}) {
    auto* l = m->add_layers();
    l->set_type(v1::LayerSpec::DENSE);
    l->set_units(units);
    if (units == 8) l->set_activation(v1::RELU);
  }
  m->set_loss(v1::MSE);
  job.mutable_optimizer()->set_learning_rate(0.05f);
  job.mutable_data()->set_source(v1::DataSpec::ONES);
  job.mutable_data()->set_ones_examples(20);
  job.set_global_batch_size(5);
  job.set_epochs(2);
  return JobWithDefaults(job);
}
constexpr int64_t kSmallJobSteps = 2 * 4;

class JobRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DeviceManagerOptions d;
    d.task_name = "/job:worker/replica:0/task:0";
    d.physical = {{"CPU", 0, 0, "host"}};
    d.virtual_devices = "CPU=2";  // CPU:0 and CPU:1
    d.log_sink = [](const std::string&) {};
    auto devices = DeviceManager::Create(d);
    ASSERT_TRUE(devices.ok()) << devices.status();
    devices_ = std::move(*devices);
    env_.cluster.ps = cluster_.addresses();
    env_.cluster.worker = {"127.0.0.1:1"};  // never dialled: the chief alone
    env_.cluster.job_name = "worker";
    env_.cluster.task_index = 0;
    env_.devices = devices_.get();
    hooks_.log = [this](const std::string& line) { log_.push_back(line); };
  }

  LocalPsCluster cluster_{2};
  std::unique_ptr<DeviceManager> devices_;
  WorkerEnv env_;
  JobHooks hooks_;
  std::vector<std::string> log_;
};

TEST_F(JobRunnerTest, SmallJobFinishesWithTheExpectedStepCount) {
  std::atomic<int64_t> last_step{-1}, iterations{-1};
  hooks_.last_step = &last_step;
  hooks_.iterations = &iterations;
  std::vector<int64_t> epoch_steps;
  std::vector<std::string> epoch_vars;
  hooks_.on_epoch = [&](int64_t step, const std::vector<v1::VariableDef>& defs,
                        const std::vector<common::Tensor*>& weights) {
    epoch_steps.push_back(step);
    EXPECT_EQ(defs.size(), weights.size());
    epoch_vars.clear();
    for (const auto& d : defs) epoch_vars.push_back(d.name());
  };
  const v1::JobSpec job = SmallJob();
  auto result = RunJob(env_, job, /*restore_from=*/"", hooks_);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->global_steps, kSmallJobSteps);
  EXPECT_EQ(result->iterations, kSmallJobSteps);
  EXPECT_TRUE(result->evaluated);
  EXPECT_EQ(last_step.load(), kSmallJobSteps);
  EXPECT_EQ(iterations.load(), kSmallJobSteps);
  EXPECT_EQ(epoch_steps, (std::vector<int64_t>{4, 8}));
  // The variables the job registered are JobVariables', in its order.
  auto vars = JobVariables(job);
  ASSERT_TRUE(vars.ok()) << vars.status();
  std::vector<std::string> names;
  for (const auto& v : *vars) names.push_back(v.name());
  EXPECT_EQ(epoch_vars, names);
  EXPECT_EQ(names.size(), 4u);  // two kernels, two biases
  // The chief's summary names the job and the placement over both servers.
  const std::string log = absl::StrJoin(log_, "\n");
  EXPECT_THAT(
      log,
      HasSubstr("Job \"small\": SYNC, 1 workers, global batch 5, 2 epochs, "
                "20 train / 20 test examples"));
  EXPECT_THAT(log, HasSubstr("ps 0:"));
  EXPECT_THAT(log, HasSubstr("ps 1:"));
  // Device memory charged for the job is released at its end.
  for (const auto* d : devices_->devices())
    EXPECT_EQ(d->bytes_in_use(), 0) << d->name();
}

TEST_F(JobRunnerTest, AdaptiveThreadsFollowTheTunerEveryStep) {
  env_.blas_threads = 2;
  env_.adapt_blas_threads = true;
  auto result = RunJob(env_, SmallJob(), /*restore_from=*/"", hooks_);
  ASSERT_TRUE(result.ok()) << result.status();
  // 8 steps: 4 of warm-up at 2 threads, then the first comparison's blocks
  // of two steps, 1 thread first (cpu_thread_tuner.h): 2, 2, 2, 2, 1, 1, 2, 2.
  const std::string log = absl::StrJoin(log_, "\n");
  EXPECT_THAT(log, HasSubstr("worker 0: CPU math threads (--adapt_blas_threads): "
                             "2 threads 6 steps, 1 thread 2 steps"));
  // What the tuner asked for after the last step (its next block: 1 thread)
  // was applied.
  EXPECT_EQ(CpuMathThreads(), 1);
  EXPECT_THAT(log, HasSubstr("2 CPU math thread(s) each (--blas_threads"));
}

// The start line says which math keeps its bits at every thread count: the
// GEMMs (where a row split is exact on this CPU) and batch norm, not
// oneDNN's convolutions (worker/device/thread_bits.cc measures them all).
TEST_F(JobRunnerTest, StartLineSaysWhetherTheModelsBitsFollowTheThreadCount) {
  ASSERT_TRUE(RunJob(env_, SmallJob(), /*restore_from=*/"", hooks_).ok());
  const std::string dense = absl::StrJoin(log_, "\n");
  if (CpuGemmRowGranule() > 0) {
    EXPECT_THAT(dense, HasSubstr(absl::StrCat("GEMMs split by rows at multiples of ",
                                              CpuGemmRowGranule(),
                                              " (the same bits at any thread count)")));
  } else {
    EXPECT_THAT(dense, HasSubstr("GEMMs on OpenBLAS's own threads"));
  }
  EXPECT_THAT(dense, ::testing::Not(HasSubstr("oneDNN")));

  // SmallJob's 4 inputs as a 1x2x2 image: `first`, then Flatten and the
  // dense output layer.
  auto image_job = [](const std::string& id, const v1::LayerSpec& first) {
    v1::JobSpec job = SmallJob();
    job.set_job_id(id);
    v1::ModelSpec* m = job.mutable_model();
    m->mutable_input_shape()->set_channels(1);
    m->mutable_input_shape()->set_height(2);
    m->mutable_input_shape()->set_width(2);
    const v1::LayerSpec output = m->layers(1);
    m->clear_layers();
    *m->add_layers() = first;
    m->add_layers()->set_type(v1::LayerSpec::FLATTEN);
    *m->add_layers() = output;
    return job;
  };

  // Batch norm is the backend's own, exact at any count: no oneDNN sums.
  log_.clear();
  v1::LayerSpec norm;
  norm.set_type(v1::LayerSpec::BATCH_NORM);
  auto normed = RunJob(env_, image_job("small_norm", norm), /*restore_from=*/"", hooks_);
  ASSERT_TRUE(normed.ok()) << normed.status();
  const std::string norm_log = absl::StrJoin(log_, "\n");
  EXPECT_THAT(norm_log, HasSubstr("GEMMs"));
  EXPECT_THAT(norm_log, ::testing::Not(HasSubstr("oneDNN")));

  // A 1x1 convolution of 2 filters.
  log_.clear();
  v1::LayerSpec conv;
  conv.set_type(v1::LayerSpec::CONV2D);
  conv.set_filters(2);
  conv.set_kernel_size(1);
  auto result = RunJob(env_, image_job("small_conv", conv), /*restore_from=*/"", hooks_);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(absl::StrJoin(log_, "\n"),
              HasSubstr("; convolutions (oneDNN) split their sums by the thread count, so this "
                        "model's last bits follow it"));
}

TEST_F(JobRunnerTest, FixedThreadsWithoutTheFlagOrWithOneThread) {
  env_.blas_threads = 2;
  ASSERT_TRUE(RunJob(env_, SmallJob(), /*restore_from=*/"", hooks_).ok());
  EXPECT_EQ(CpuMathThreads(), 2);
  env_.blas_threads = 1;
  env_.adapt_blas_threads = true;  // nothing to compare with one thread
  ASSERT_TRUE(RunJob(env_, SmallJob(), /*restore_from=*/"", hooks_).ok());
  EXPECT_EQ(CpuMathThreads(), 1);
  EXPECT_THAT(absl::StrJoin(log_, "\n"),
              ::testing::Not(HasSubstr("--adapt_blas_threads")));
}

TEST_F(JobRunnerTest, ExamplesPerSecondLeavesEvaluationAndCheckpointsOut) {
  // The first epoch's end (its evaluation and hooks) takes 1.5 s and the
  // chief's hook before step 7 (where checkpoints are written) another
  // 1.5 s, both in the second epoch's window. The window reports the rate of
  // its 4 training steps alone; counted whole, it could not exceed
  // 20 examples / 3 s (6.7 examples/s), or 13.3 with either pause left in.
  constexpr double kPauseS = 1.5;
  hooks_.on_epoch = [&](int64_t step, const std::vector<v1::VariableDef>&,
                        const std::vector<common::Tensor*>&) {
    if (step == 4) absl::SleepFor(absl::Seconds(kPauseS));
  };
  hooks_.after_pull = [&](int64_t step) {
    if (step == 6) absl::SleepFor(absl::Seconds(kPauseS));
    return absl::OkStatus();
  };
  std::vector<double> rates;  // Per window, in step order.
  hooks_.on_metrics = [&](const v1::Metrics& m, bool epoch_end) {
    if (!epoch_end) rates.push_back(m.examples_per_s());
  };
  auto result = RunJob(env_, SmallJob(), "", hooks_);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(rates.size(), 2u);  // steps 4 and 8: one window per epoch
  EXPECT_GE(result->breakdown.eval_s, kPauseS);
  // 20 examples in under 1 s of training: a bound 200x above a tiny model's
  // steps on loopback, and above what either pause would allow.
  EXPECT_GT(rates[1], 20.0) << "the window counted a pause";
}

TEST_F(JobRunnerTest, TwoTowersOnTwoCpuDevicesTakeTheSameSteps) {
  v1::JobSpec job = SmallJob();
  job.add_tower_devices("CPU:0");
  job.add_tower_devices("CPU:1");
  env_.log_device_placement = true;
  auto result = RunJob(env_, job, "", hooks_);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->global_steps, kSmallJobSteps);
  const std::string log = absl::StrJoin(log_, "\n");
  EXPECT_THAT(log,
              HasSubstr("tower 0: /job:worker/replica:0/task:0/device:CPU:0"));
  EXPECT_THAT(log,
              HasSubstr("tower 1: /job:worker/replica:0/task:0/device:CPU:1"));
}

TEST_F(JobRunnerTest, AMissingDeviceIsInvalidArgumentNamingIt) {
  v1::JobSpec job = SmallJob();
  job.add_tower_devices("GPU:7");
  auto result = RunJob(env_, job, "", hooks_);
  ASSERT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument)
      << result.status();
  EXPECT_THAT(
      std::string(result.status().message()),
      HasSubstr(
          "tower_devices: no device GPU:7 for tower 0; devices: CPU:0, CPU:1"));
  // Nothing was registered on the servers.
  EXPECT_FALSE(cluster_.server(0).Variables("small").ok());
}

TEST_F(JobRunnerTest, TargetsWiderThanTheModelOutputAreInvalidArgument) {
  v1::JobSpec job = SmallJob();
  job.mutable_data()->set_ones_target_dim(5);  // the model outputs 3
  auto result = RunJob(env_, job, "", hooks_);
  ASSERT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument)
      << result.status();
  // (Found at the first step, after the job was registered on the servers.)
  EXPECT_THAT(
      std::string(result.status().message()),
      HasSubstr("targets shape [5,5] does not match predictions shape [5,3]"));
}

// Issue 15 (limits): SmallJob's towers hold (67 parameters x 2 + 38 x 5
// examples) floats = 1296 bytes (per example, the 8 units, their ReLU and
// the 3 outputs, each with its gradient); a budget of 1295 refuses it
// before anything is built or registered.
TEST_F(JobRunnerTest, AJobOverTheWorkerBudgetIsResourceExhausted) {
  env_.memory_budget_bytes = 1295;
  auto result = RunJob(env_, SmallJob(), "", hooks_);
  ASSERT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted) << result.status();
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("the model needs about 1296 bytes on this worker (67 parameters, 38 "
                        "activation floats per example x 5 examples x 1 towers"));
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("its budget is 1295 bytes (--memory_budget_bytes)"));
  EXPECT_FALSE(cluster_.server(0).Variables("small").ok());
  EXPECT_FALSE(cluster_.server(1).Variables("small").ok());
}

// The chief evaluates in passes of its training batch: a tower that trains
// within its device's limit evaluates within it too, whatever the test set's
// size. A 4 -> 2048 (ReLU) -> 3 model holds 8,198 floats per example in
// training (model_limits.h): 5 examples (164 KB) fit a 1 MB device; a
// forward pass over the 200 test examples at once would not (their 2,051
// outputs alone take 1.6 MB), nor would reserving for 1,000 (until issue
// 16 the chief reserved for, and evaluated in passes of, 1,000 examples).
TEST_F(JobRunnerTest, TheChiefEvaluatesWithinTheMemoryItTrainsIn) {
  DeviceManagerOptions d;
  d.task_name = "/job:worker/replica:0/task:0";
  d.physical = {{"CPU", 0, 0, "host"}};
  d.virtual_devices = "CPU=1x1";  // one CPU device of 1 MB
  d.log_sink = [](const std::string&) {};
  auto devices = DeviceManager::Create(d);
  ASSERT_TRUE(devices.ok()) << devices.status();
  env_.devices = devices->get();
  v1::JobSpec job = SmallJob();
  job.mutable_model()->mutable_layers(0)->set_units(2048);
  job.mutable_data()->set_ones_examples(200);  // the test set: 40 passes of 5
  job.set_epochs(1);
  const int64_t limit = int64_t{1} << 20;
  ASSERT_GT(int64_t{200} * (2048 + 3) * 4, limit);
  auto result = RunJob(env_, job, "", hooks_);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->evaluated);
  EXPECT_TRUE(std::isfinite(result->test_loss));
  const VirtualDevice* device = (*devices)->devices().front();
  EXPECT_GT(device->peak_bytes_in_use(), 0);
  EXPECT_LE(device->peak_bytes_in_use(), limit);
  EXPECT_EQ(device->bytes_in_use(), 0);
}

// The job's end costs no memory: the towers' weights and gradients stay in
// the client's shared memory (where the servers write pulls and read
// pushes) until the towers go, rather than moving back into memory of their
// own, a copy of the whole model twice over while the segment still holds
// the gradients (until issue 16: the dense stack's worker peaked there at
// 158 MB against 110 MB while training). The process's peak resident memory
// is reset after the last evaluation (its epoch hook, the last thing Run
// does before returning) and read when RunJob has returned: the unmapping of
// the segment records the peak then. A 4 -> 2048 -> 2048 -> 3 model holds
// 16.8 MB of weights in one variable; moving the tensors back held 33.6 MB
// more.
TEST_F(JobRunnerTest, TheJobsEndHoldsNoSecondCopyOfTheModel) {
  v1::JobSpec job = SmallJob();
  job.mutable_model()->mutable_layers(0)->set_units(2048);
  auto* l = job.mutable_model()->add_layers();
  *l = job.model().layers(1);
  job.mutable_model()->mutable_layers(1)->set_units(2048);
  job.set_epochs(1);
  const int64_t model_bytes = (4 * 2048 + 2048 + 2048 * 2048 + 2048 + 2048 * 3 + 3) * 4;
  int64_t at_reset = -1;
  hooks_.on_epoch = [&](int64_t, const std::vector<v1::VariableDef>&,
                        const std::vector<common::Tensor*>& weights) {
    ASSERT_TRUE(weights[2]->external()) << "the weights are not in the shared segment";
    std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
    ASSERT_NE(f, nullptr) << "cannot reset the peak resident memory";
    ASSERT_EQ(std::fputs("5", f), 1);
    ASSERT_EQ(std::fclose(f), 0);
    at_reset = common::ResidentBytes();
  };
  auto result = RunJob(env_, job, "", hooks_);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_TRUE(result->evaluated);
  ASSERT_GT(at_reset, 0);
  const int64_t growth = common::PeakResidentBytes() - at_reset;
  EXPECT_LT(growth, model_bytes / 2)
      << "the peak grew by " << growth << " bytes after the last evaluation; the model holds "
      << model_bytes;
}

TEST_F(JobRunnerTest, ABadModelIsInvalidArgumentNamingTheModel) {
  v1::JobSpec job = SmallJob();
  job.mutable_model()->mutable_layers(1)->set_units(0);
  auto result = RunJob(env_, job, "", hooks_);
  ASSERT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument)
      << result.status();
  EXPECT_THAT(
      std::string(result.status().message()),
      HasSubstr(
          "model: model 'small': layer 1: DENSE units must be > 0, got 0"));
}

TEST_F(JobRunnerTest, AnUnknownLayoutIsInvalidArgument) {
  env_.layout = "diagonal";
  auto result = RunJob(env_, SmallJob(), "", hooks_);
  ASSERT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument)
      << result.status();
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("--layout"));
}

TEST_F(JobRunnerTest, MissingDataIsNotFoundNamingTheSet) {
  v1::JobSpec job = SmallJob();
  job.mutable_data()->set_source(v1::DataSpec::FASHION_MNIST);
  job.mutable_data()->set_dir("/nonexistent/fashion");
  auto result = RunJob(env_, job, "", hooks_);
  ASSERT_EQ(result.status().code(), absl::StatusCode::kNotFound)
      << result.status();
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("train data"));
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("/nonexistent/fashion"));
}

// Issue 15: with data roots set (--serve), data.dir outside them is refused
// before anything is read.
TEST_F(JobRunnerTest, DataOutsideTheDataRootsIsInvalidArgumentNamingTheField) {
  auto roots = common::PathRoots::Create("--data_root", {"/usr/share/datasets"});
  ASSERT_TRUE(roots.ok());
  env_.data_roots = &*roots;
  v1::JobSpec job = SmallJob();
  job.mutable_data()->set_source(v1::DataSpec::FASHION_MNIST);
  job.mutable_data()->set_dir("/etc");
  auto result = RunJob(env_, job, "", hooks_);
  ASSERT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("data.dir \"/etc\" is outside --data_root \"/usr/share/datasets\""));
  env_.data_roots = nullptr;
}

TEST_F(JobRunnerTest, Cifar10JobTrainsOnItsFiles) {
  // A tiny CIFAR-10 set: 2 records in each of the six batch files.
  const std::string dir = testing::TempDir() + "/cifar";
  ::mkdir(dir.c_str(), 0755);
  for (const char* name : {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                           "data_batch_4.bin", "data_batch_5.bin", "test_batch.bin"}) {
    std::string records;
    for (int r = 0; r < 2; ++r) {
      records.push_back(static_cast<char>(r * 7));  // labels 0 and 7
      for (int p = 0; p < 3072; ++p) records.push_back(static_cast<char>(p + r));
    }
    FILE* f = std::fopen((dir + "/" + name).c_str(), "wb");
    ASSERT_NE(f, nullptr) << name;
    std::fwrite(records.data(), 1, records.size(), f);
    std::fclose(f);
  }
  v1::JobSpec job = SmallJob();
  job.mutable_model()->set_input_dim(3072);
  job.mutable_model()->mutable_layers(1)->set_units(10);
  job.mutable_model()->set_loss(v1::SOFTMAX_CROSS_ENTROPY);
  job.mutable_data()->set_source(v1::DataSpec::CIFAR10);
  job.mutable_data()->set_dir(dir);
  job.mutable_data()->set_max_train_examples(7);
  job.set_epochs(1);
  auto result = RunJob(env_, job, "", hooks_);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->global_steps, 2);  // ceil(7 / 5)
  EXPECT_THAT(absl::StrJoin(log_, "\n"), HasSubstr("7 train / 2 test examples"));

  job.mutable_data()->set_dir("/nonexistent/cifar");
  auto missing = RunJob(env_, job, "", hooks_);
  ASSERT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("/nonexistent/cifar/data_batch_1.bin"));
}

TEST_F(JobRunnerTest, CancellationReturnsCancelled) {
  common::CancellationToken cancel;
  std::atomic<int64_t> iterations{-1};
  hooks_.cancel = &cancel;
  hooks_.iterations = &iterations;
  hooks_.log_every_steps = 1;
  hooks_.on_metrics = [&](const v1::Metrics& m, bool epoch_end) {
    if (!epoch_end && m.step() == 2) cancel.Cancel("job cancelled by test");
  };
  auto result = RunJob(env_, SmallJob(), "", hooks_);
  ASSERT_EQ(result.status().code(), absl::StatusCode::kCancelled)
      << result.status();
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("job cancelled by test"));
  EXPECT_EQ(iterations.load(), 2);
}

}  // namespace
}  // namespace towerps::worker
