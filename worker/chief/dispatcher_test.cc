// One attempt against fake workers and servers: success, a worker's
// failure, a lost worker, a cancel, a busy worker, an unreachable ps.
#include "worker/chief/dispatcher.h"

#include <memory>
#include <thread>

#include "gtest/gtest.h"
#include "worker/chief/fake_ps_control.h"
#include "worker/chief/fake_worker_client.h"

namespace towerps::worker {
namespace {

class DispatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int w = 0; w < 2; ++w) workers_.push_back(std::make_unique<FakeWorkerClient>(w));
    for (int p = 0; p < 2; ++p) ps_.push_back(std::make_unique<FakePsControl>(p));
    options_.poll_interval = absl::Milliseconds(5);
    options_.worker_lost_after = absl::Milliseconds(100);
    options_.control_timeout = absl::Seconds(2);
  }

  Dispatcher Make() {
    std::vector<WorkerClient*> w;
    for (auto& p : workers_) w.push_back(p.get());
    std::vector<PsControl*> s;
    for (auto& p : ps_) s.push_back(p.get());
    return Dispatcher(w, s, options_);
  }

  static v1::StartJobRequest Request(int attempt = 1) {
    v1::StartJobRequest r;
    r.mutable_job()->set_job_id("j");
    r.set_attempt(attempt);
    return r;
  }

  std::vector<std::unique_ptr<FakeWorkerClient>> workers_;
  std::vector<std::unique_ptr<FakePsControl>> ps_;
  DispatcherOptions options_;
  common::CancellationToken cancel_;
};

TEST_F(DispatcherTest, OkWhenEveryWorkerIsDone) {
  for (auto& w : workers_) w->SetOnStart(FakeWorkerClient::OnStart::kFinish);
  ps_[0]->SetJob("j", 3);  // Stale variables of an earlier attempt.
  Dispatcher d = Make();
  absl::Status st = d.RunAttempt(Request(), cancel_);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_FALSE(ps_[0]->holds("j"));  // Freed before the start.
  for (auto& w : workers_) EXPECT_EQ(w->starts(), 1);
}

TEST_F(DispatcherTest, AWorkersFailureIsTheAttemptsWithItsCode) {
  workers_[1]->SetOnStart(FakeWorkerClient::OnStart::kFail,
                          absl::ResourceExhaustedError("GPU:0 out of memory"));
  Dispatcher d = Make();
  absl::Status st = d.RunAttempt(Request(), cancel_);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_EQ(st.message(), "worker 1: GPU:0 out of memory");
  EXPECT_GE(workers_[0]->stops(), 1);  // Everyone told to stop.
  EXPECT_EQ(workers_[0]->status().state(), v1::WORK_STOPPED);
}

TEST_F(DispatcherTest, AWorkersCancelledFailureIsALostPeerNotACancel) {
  workers_[1]->SetOnStart(FakeWorkerClient::OnStart::kFail,
                          absl::CancelledError("pull: ps 0 shutting down"));
  Dispatcher d = Make();
  absl::Status st = d.RunAttempt(Request(), cancel_);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_EQ(st.message(), "worker 1: pull: ps 0 shutting down");
}

TEST_F(DispatcherTest, ALostWorkerIsUnavailable) {
  Dispatcher d = Make();
  std::thread lose([&] {
    workers_[1]->AwaitStarts(1, absl::Seconds(10));
    workers_[1]->SetUnreachable(true);
  });
  absl::Status st = d.RunAttempt(Request(), cancel_);
  lose.join();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find("worker 1 unreachable for "), std::string::npos) << st;
}

TEST_F(DispatcherTest, ARestartedWorkerIsAborted) {
  Dispatcher d = Make();
  std::thread restart([&] {
    workers_[0]->AwaitStarts(1, absl::Seconds(10));
    workers_[0]->StopJob("j").IgnoreError();
  });
  absl::Status st = d.RunAttempt(Request(), cancel_);
  restart.join();
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;
  EXPECT_EQ(st.message(), "worker 0 stopped");
}

TEST_F(DispatcherTest, CancelStopsEveryWorkerAtOnce) {
  options_.poll_interval = absl::Hours(1);  // The cancel must cut the wait short.
  Dispatcher d = Make();
  std::thread canceller([&] {
    workers_[0]->AwaitStarts(1, absl::Seconds(10));
    cancel_.Cancel("cancelled by user");
  });
  absl::Status st = d.RunAttempt(Request(), cancel_);
  canceller.join();
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
  for (auto& w : workers_) EXPECT_EQ(w->status().state(), v1::WORK_STOPPED);
}

TEST_F(DispatcherTest, ABusyWorkerIsStoppedAndStartedAgain) {
  v1::StartJobRequest old = Request();
  old.mutable_job()->set_job_id("old");
  ASSERT_TRUE(workers_[1]->StartJob(old).ok());
  for (auto& w : workers_) w->SetOnStart(FakeWorkerClient::OnStart::kFinish);
  Dispatcher d = Make();
  absl::Status st = d.RunAttempt(Request(), cancel_);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(workers_[1]->status().job_id(), "j");
}

TEST_F(DispatcherTest, TheChiefStartsLastAndIsNamedInErrors) {
  workers_[0]->FailStarts(absl::InvalidArgumentError("no such device"), 100);
  Dispatcher d = Make();
  absl::Status st = d.RunAttempt(Request(), cancel_);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_EQ(st.message(), "chief: no such device");
  EXPECT_EQ(workers_[1]->starts(), 1);  // Started before the chief.
}

TEST_F(DispatcherTest, AnUnreachablePsGivesUpAfterTheControlTimeout) {
  options_.control_timeout = absl::Milliseconds(300);
  ps_[1]->SetUnreachable(true);
  Dispatcher d = Make();
  absl::Status st = d.RunAttempt(Request(), cancel_);
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_NE(st.message().find("ps 1"), std::string::npos) << st;
  EXPECT_NE(st.message().find("ps 1 unreachable"), std::string::npos) << st;
  for (auto& w : workers_) EXPECT_EQ(w->starts(), 0);
}

}  // namespace
}  // namespace towerps::worker
