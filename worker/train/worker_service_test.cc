// WorkerRuntime's job lifecycle (IDLE -> RUNNING -> DONE | FAILED | STOPPED)
// with real jobs on CPU devices and in-process parameter servers, directly
// and through WorkerServiceImpl over a real gRPC channel on loopback.
#include "worker/train/worker_service.h"

#include <chrono>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/job_spec.h"
#include "common/rpc.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "proto/worker.grpc.pb.h"
#include "proto/worker.pb.h"
#include "worker/device/device_manager.h"
#include "worker/train/local_ps_cluster.h"

namespace towerps::worker {
namespace {

using ::testing::HasSubstr;

// A small ONES job: 20 examples in batches of 5 for 2 epochs, 8 steps.
v1::StartJobRequest SmallJob(const std::string& id) {
  v1::JobSpec job;
  job.set_job_id(id);
  auto* m = job.mutable_model();
  m->set_input_dim(4);
  auto* l = m->add_layers();
  l->set_type(v1::LayerSpec::DENSE);
  l->set_units(3);
  m->set_loss(v1::MSE);
  job.mutable_optimizer()->set_learning_rate(0.05f);
  job.mutable_data()->set_source(v1::DataSpec::ONES);
  job.mutable_data()->set_ones_examples(20);
  job.set_global_batch_size(5);
  job.set_epochs(2);
  v1::StartJobRequest r;
  *r.mutable_job() = JobWithDefaults(job);
  r.set_attempt(1);
  return r;
}
constexpr int64_t kSmallJobSteps = 8;

// Runs until stopped: far more steps than a test waits for.
v1::StartJobRequest EndlessJob(const std::string& id) {
  v1::StartJobRequest r = SmallJob(id);
  r.mutable_job()->set_max_steps(1000000000);
  r.mutable_job()->set_skip_eval(true);
  return r;
}

class WorkerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DeviceManagerOptions d;
    d.task_name = "/job:worker/replica:0/task:0";
    d.physical = {{"CPU", 0, 0, "host"}};
    d.virtual_devices = "CPU=2";
    d.log_sink = [](const std::string&) {};
    auto devices = DeviceManager::Create(d);
    ASSERT_TRUE(devices.ok()) << devices.status();
    devices_ = std::move(*devices);
    WorkerEnv env;
    env.cluster.ps = cluster_.addresses();
    env.cluster.worker = {"127.0.0.1:1"};
    env.cluster.job_name = "worker";
    env.cluster.task_index = 0;
    env.devices = devices_.get();
    runtime_ = std::make_unique<WorkerRuntime>(env);
  }

  // Polls Status() until `done` holds; fails the test after a generous
  // deadline (only reached when something is broken).
  template <typename Fn>
  v1::WorkerStatus WaitUntil(Fn done) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    v1::WorkerStatus s = runtime_->Status();
    while (!done(s) && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
      s = runtime_->Status();
    }
    EXPECT_TRUE(done(s)) << s.DebugString();
    return s;
  }
  v1::WorkerStatus WaitUntilNotRunning() {
    return WaitUntil([](const v1::WorkerStatus& s) {
      return s.state() != v1::WORK_RUNNING;
    });
  }

  LocalPsCluster cluster_{2};
  std::unique_ptr<DeviceManager> devices_;
  std::unique_ptr<WorkerRuntime>
      runtime_;  // Destroyed first: its job uses the rest.
};

TEST_F(WorkerServiceTest, IdleThenRunningThenDone) {
  v1::WorkerStatus s = runtime_->Status();
  EXPECT_EQ(s.state(), v1::WORK_IDLE);
  EXPECT_EQ(s.task_index(), 0);
  ASSERT_EQ(s.devices_size(), 2);
  EXPECT_EQ(s.devices(0).name(), "/job:worker/replica:0/task:0/device:CPU:0");
  EXPECT_EQ(s.devices(1).type(), "CPU");

  ASSERT_TRUE(runtime_->Start(SmallJob("a")).ok());
  s = runtime_->Status();
  EXPECT_EQ(s.job_id(), "a");
  EXPECT_EQ(s.attempt(), 1);
  // RUNNING from Start on, unless the 8 steps are already done.
  EXPECT_THAT(s.state(), ::testing::AnyOf(v1::WORK_RUNNING, v1::WORK_DONE));

  s = WaitUntilNotRunning();
  EXPECT_EQ(s.state(), v1::WORK_DONE) << s.error();
  EXPECT_EQ(s.iterations(), kSmallJobSteps);
  EXPECT_EQ(s.last_step(), kSmallJobSteps);
  EXPECT_EQ(s.error(), "");

  // DONE -> RUNNING again with the next job; the counters start over.
  ASSERT_TRUE(runtime_->Start(SmallJob("b")).ok());
  s = WaitUntilNotRunning();
  EXPECT_EQ(s.state(), v1::WORK_DONE) << s.error();
  EXPECT_EQ(s.job_id(), "b");
  EXPECT_EQ(s.iterations(), kSmallJobSteps);
}

TEST_F(WorkerServiceTest, StartWhileRunningIsFailedPreconditionNamingTheJob) {
  ASSERT_TRUE(runtime_->Start(EndlessJob("long")).ok());
  const absl::Status again = runtime_->Start(SmallJob("other"));
  ASSERT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
  EXPECT_THAT(std::string(again.message()),
              HasSubstr("worker 0 is running job \"long\" (attempt 1)"));
  EXPECT_EQ(runtime_->Status().job_id(), "long");  // untouched
}

TEST_F(WorkerServiceTest, StopMakesARunningJobStopped) {
  ASSERT_TRUE(runtime_->Start(EndlessJob("long")).ok());
  // It is training: steps are being pushed.
  WaitUntil([](const v1::WorkerStatus& s) { return s.iterations() >= 2; });
  EXPECT_FALSE(runtime_->Stop("another-job"));  // not the one running
  EXPECT_EQ(runtime_->Status().state(), v1::WORK_RUNNING);

  EXPECT_TRUE(runtime_->Stop("long"));
  // Stop waits for the job's thread to report.
  v1::WorkerStatus s = runtime_->Status();
  EXPECT_EQ(s.state(), v1::WORK_STOPPED);
  EXPECT_EQ(s.error(), "");
  EXPECT_GE(s.iterations(), 2);
  EXPECT_FALSE(runtime_->Stop(""));  // nothing runs any more

  // STOPPED -> RUNNING: a new job may start.
  ASSERT_TRUE(runtime_->Start(SmallJob("after")).ok());
  EXPECT_EQ(WaitUntilNotRunning().state(), v1::WORK_DONE);
}

TEST_F(WorkerServiceTest, AJobThatCannotRunEndsFailedWithItsError) {
  v1::StartJobRequest r = SmallJob("bad");
  r.mutable_job()->add_tower_devices("GPU:7");
  ASSERT_TRUE(
      runtime_->Start(r).ok());  // the job's errors come from its thread
  const v1::WorkerStatus s = WaitUntilNotRunning();
  EXPECT_EQ(s.state(), v1::WORK_FAILED);
  EXPECT_EQ(s.error_code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(s.error(), HasSubstr("no device GPU:7"));
}

TEST_F(WorkerServiceTest, StartWithoutJobIdIsInvalidArgument) {
  v1::StartJobRequest r = SmallJob("x");
  r.mutable_job()->clear_job_id();
  const absl::Status st = runtime_->Start(r);
  ASSERT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("no job_id"));
  EXPECT_EQ(runtime_->Status().state(), v1::WORK_IDLE);
}

TEST_F(WorkerServiceTest, TheSameLifecycleOverGrpc) {
  WorkerServiceImpl service(*runtime_);
  int port = 0;
  auto server = common::StartServer("127.0.0.1:0", {&service}, &port);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::WorkerService::NewStub(
      common::NewChannel(absl::StrCat("127.0.0.1:", port)));
  auto deadline = [] {
    return std::chrono::system_clock::now() + std::chrono::seconds(30);
  };

  v1::WorkerStatus status;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    ASSERT_TRUE(stub->GetStatus(&ctx, v1::WorkerStatusRequest(), &status).ok());
    EXPECT_EQ(status.state(), v1::WORK_IDLE);
    EXPECT_EQ(status.devices_size(), 2);
  }
  v1::StartJobResponse started;
  {
    v1::StartJobRequest r = SmallJob("x");
    r.mutable_job()->clear_job_id();
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    const grpc::Status st = stub->StartJob(&ctx, r, &started);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(st.error_message(), HasSubstr("no job_id"));
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    const grpc::Status st = stub->StartJob(&ctx, EndlessJob("long"), &started);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    const grpc::Status st = stub->StartJob(&ctx, SmallJob("other"), &started);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(st.error_message(), HasSubstr("is running job \"long\""));
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    ASSERT_TRUE(stub->GetStatus(&ctx, v1::WorkerStatusRequest(), &status).ok());
    EXPECT_EQ(status.state(), v1::WORK_RUNNING);
    EXPECT_EQ(status.job_id(), "long");
  }
  v1::StopJobResponse stopped;
  {
    v1::StopJobRequest r;
    r.set_job_id("other");
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    ASSERT_TRUE(stub->StopJob(&ctx, r, &stopped).ok());
    EXPECT_FALSE(stopped.was_running());
  }
  {
    v1::StopJobRequest r;
    r.set_job_id("long");
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    ASSERT_TRUE(stub->StopJob(&ctx, r, &stopped).ok());
    EXPECT_TRUE(stopped.was_running());
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    ASSERT_TRUE(stub->GetStatus(&ctx, v1::WorkerStatusRequest(), &status).ok());
    EXPECT_EQ(status.state(), v1::WORK_STOPPED);
  }
  (*server)->Shutdown();
}

}  // namespace
}  // namespace towerps::worker
