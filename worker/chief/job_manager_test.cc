// JobManager: the queue, restarts, cancels and a
// restart of the chief, against fake workers and servers (the same against
// real processes: tests/service_test.sh).
#include "worker/chief/job_manager.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "worker/chief/fake_ps_control.h"
#include "worker/chief/fake_worker_client.h"
#include "worker/chief/job_store.h"

namespace towerps::worker {
namespace {

// ---------------------------------------------------------------------------

class JobManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::string(getenv("TEST_TMPDIR")) + "/" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
  }

  // A new chief over dir_ with fresh fakes (a restart of the chief).
  std::unique_ptr<JobManager> StartManager(FakeWorkerClient::OnStart on_start,
                                           absl::Status error = absl::OkStatus(),
                                           int max_queued_jobs = 100) {
    workers_.clear();
    ps_.clear();
    JobManagerOptions o;
    o.cluster.ps = {"h:1", "h:2"};
    o.cluster.worker = {"h:3", "h:4"};
    o.cluster.job_name = "worker";
    o.cluster.task_index = 0;
    o.state_dir = dir_;
    o.poll_interval = absl::Milliseconds(5);
    o.worker_lost_after = absl::Milliseconds(200);
    o.control_timeout = absl::Seconds(2);
    o.restart_backoff = absl::Milliseconds(1);
    o.max_queued_jobs = max_queued_jobs;
    o.on_refusal = [this](const std::string& reason) { refusals_.push_back(reason); };
    o.ps_factory = [this](int p) {
      auto fake = std::make_unique<FakePsControl>(p);
      ps_.push_back(fake.get());
      return fake;
    };
    o.worker_factory = [this, on_start, error](int w, JobHooksProvider) {
      auto fake = std::make_unique<FakeWorkerClient>(w);
      fake->SetOnStart(on_start, error);
      workers_.push_back(fake.get());
      return fake;
    };
    auto m = JobManager::Create(o);
    EXPECT_TRUE(m.ok()) << m.status();
    absl::Status st = (*m)->Start();
    EXPECT_TRUE(st.ok()) << st;
    return std::move(*m);
  }

  static v1::SubmitJobRequest Job(const std::string& id, int max_restarts = 2) {
    v1::SubmitJobRequest r;
    *r.mutable_spec() = *BuiltinJob("dense_stack");
    r.mutable_spec()->set_job_id(id);
    r.mutable_spec()->set_max_restarts(max_restarts);
    r.mutable_spec()->mutable_checkpoint()->set_disabled(true);
    return r;
  }

  // Follows the job's events until it ends (or 30 s): its final record.
  static v1::JobRecord AwaitEnd(JobManager& m, const std::string& id) {
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    absl::Status st = m.Watch(
        id, 0, /*follow=*/true, [](const v1::JobEvent&) { return true; },
        [give_up] { return absl::Now() > give_up; });
    EXPECT_TRUE(st.ok()) << st;
    auto got = m.Get(id);
    EXPECT_TRUE(got.ok()) << got.status();
    return got->job();
  }

  static std::vector<std::string> Messages(JobManager& m, const std::string& id) {
    std::vector<std::string> out;
    m.Watch(id, 0, false, [&](const v1::JobEvent& e) {
       out.push_back(e.message());
       return true;
     }, nullptr).IgnoreError();
    return out;
  }

  std::string dir_;
  std::vector<std::string> refusals_;  // on_refusal's reasons
  std::vector<FakeWorkerClient*> workers_;  // Owned by the manager.
  std::vector<FakePsControl*> ps_;          // Owned by the manager.
};

TEST_F(JobManagerTest, RunsJobsOneAtATimeInSubmissionOrder) {
  auto m = StartManager(FakeWorkerClient::OnStart::kRun);
  ASSERT_TRUE(m->Submit(Job("a")).ok());
  ASSERT_TRUE(m->Submit(Job("b")).ok());
  ASSERT_TRUE(workers_[0]->AwaitStarts(1, absl::Seconds(30)));
  EXPECT_EQ(workers_[0]->status().job_id(), "a");
  EXPECT_EQ(m->Get("b")->job().state(), v1::QUEUED);
  for (auto* w : workers_) w->Finish();
  v1::JobRecord a = AwaitEnd(*m, "a");
  EXPECT_EQ(a.state(), v1::SUCCEEDED) << a.error();
  EXPECT_EQ(a.attempts(), 1);
  // The chief's own worker (0) starts last.
  ASSERT_TRUE(workers_[0]->AwaitStarts(2, absl::Seconds(30)));
  EXPECT_EQ(workers_[1]->status().job_id(), "b");
  for (auto* w : workers_) w->Finish();
  EXPECT_EQ(AwaitEnd(*m, "b").state(), v1::SUCCEEDED);
  for (auto* p : ps_) EXPECT_FALSE(p->holds("b"));
}

// Issue 15 (limits): --max_queued_jobs bounds the queue; the running job
// does not count; a cancelled one frees its place.
TEST_F(JobManagerTest, SubmitBeyondMaxQueuedJobsIsResourceExhausted) {
  auto m = StartManager(FakeWorkerClient::OnStart::kRun, absl::OkStatus(), /*max_queued_jobs=*/2);
  ASSERT_TRUE(m->Submit(Job("a")).ok());
  ASSERT_TRUE(workers_[0]->AwaitStarts(1, absl::Seconds(30)));
  ASSERT_TRUE(m->Submit(Job("b")).ok());
  ASSERT_TRUE(m->Submit(Job("c")).ok());
  const absl::Status refused = m->Submit(Job("d")).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_EQ(refused.message(),
            "submit: 2 jobs are queued on this chief (limit --max_queued_jobs=2); wait for some "
            "to run, or cancel some");
  EXPECT_FALSE(m->Get("d").ok());
  // A spec over a size bound is refused and counted too.
  v1::SubmitJobRequest huge = Job("huge");
  huge.mutable_spec()->set_epochs(1000000000);
  EXPECT_EQ(m->Submit(huge).status().message(), "job spec: epochs = 1000000000 (limit 100000)");
  EXPECT_EQ(refusals_, (std::vector<std::string>{"max_queued_jobs", "spec_limits"}));
  ASSERT_TRUE(m->Cancel("b").ok());
  EXPECT_TRUE(m->Submit(Job("d")).ok());
  for (auto* w : workers_) w->Finish();
  EXPECT_EQ(AwaitEnd(*m, "a").state(), v1::SUCCEEDED);
}

TEST_F(JobManagerTest, JobsSurviveARestartOfTheChief) {
  {
    auto m = StartManager(FakeWorkerClient::OnStart::kRun);
    ASSERT_TRUE(m->Submit(Job("a")).ok());
    ASSERT_TRUE(m->Submit(Job("b")).ok());
    ASSERT_TRUE(workers_[0]->AwaitStarts(1, absl::Seconds(30)));
  }  // The chief stops while "a" runs (a crash is job_store_test's).
  auto m = StartManager(FakeWorkerClient::OnStart::kFinish);
  std::vector<v1::JobRecord> jobs = m->List();
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(jobs[0].job_id(), "a");
  EXPECT_EQ(jobs[1].job_id(), "b");
  v1::JobRecord a = AwaitEnd(*m, "a");
  EXPECT_EQ(a.state(), v1::SUCCEEDED) << a.error();
  EXPECT_TRUE(a.spec().resume());
  EXPECT_EQ(AwaitEnd(*m, "b").state(), v1::SUCCEEDED);
  std::vector<std::string> events = Messages(*m, "a");
  EXPECT_NE(std::find(events.begin(), events.end(),
                      "the chief shut down while this job ran: queued again, resumes from its "
                      "latest checkpoint (it reached no step boundary in time)"),
            events.end());
}

// A chief that dies while a job runs (its record left RUNNING on disk) uses
// one of the job's restarts; attempt numbers go on across chiefs. A chief in
// a crash loop therefore fails the job once max_restarts is used up, instead
// of retrying it forever.
TEST_F(JobManagerTest, ChiefCrashesUseTheJobsRestarts) {
  // Chief crashes, simulated with the store alone: take the job (RUNNING on
  // disk) and vanish without ending it.
  auto crash_while_running = [&](const std::string& id) {
    auto store = JobStore::Open(dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    common::CancellationToken stop;
    auto run = (*store)->TakeNext(stop);
    ASSERT_TRUE(run.ok()) << run.status();
    ASSERT_EQ(run->record.job_id(), id);
    ASSERT_TRUE((*store)->Update(id, [](v1::JobRecord& r) {
                  r.set_attempts(r.attempts() + 1);
                }).ok());
  };
  {
    auto store = JobStore::Open(dir_);
    ASSERT_TRUE(store.ok());
    v1::JobSpec spec = Job("a", /*max_restarts=*/2).spec();
    ASSERT_TRUE((*store)->Add(JobWithDefaults(spec)).ok());
  }
  crash_while_running("a");  // restart 1 of 2
  crash_while_running("a");  // restart 2 of 2
  {
    auto m = StartManager(FakeWorkerClient::OnStart::kFinish);
    v1::JobRecord a = AwaitEnd(*m, "a");
    // One attempt left, and it runs as attempt 3.
    EXPECT_EQ(a.state(), v1::SUCCEEDED) << a.error();
    EXPECT_EQ(a.attempts(), 3);
    EXPECT_EQ(a.restarts(), 2);
  }
  // Three crashes of a job with max_restarts 2: the next chief fails it
  // without starting it, and says why.
  {
    auto store = JobStore::Open(dir_);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->Add(JobWithDefaults(Job("b", /*max_restarts=*/2).spec())).ok());
  }
  for (int i = 0; i < 3; ++i) crash_while_running("b");
  auto m = StartManager(FakeWorkerClient::OnStart::kFinish);
  v1::JobRecord b = AwaitEnd(*m, "b");
  EXPECT_EQ(b.state(), v1::FAILED);
  EXPECT_NE(b.error().find("max_restarts (2) used up"), std::string::npos) << b.error();
  EXPECT_EQ(b.restarts(), 3);
  for (auto* w : workers_) EXPECT_EQ(w->starts(), 0);
}

// SIGTERM on the chief: Shutdown() puts the running job back in the queue
// (on disk, before any restart), first in line, and the next chief resumes it.
TEST_F(JobManagerTest, ShutdownQueuesTheRunningJobAgainAndTheNextChiefResumesIt) {
  {
    auto m = StartManager(FakeWorkerClient::OnStart::kRun);
    ASSERT_TRUE(m->Submit(Job("a")).ok());
    ASSERT_TRUE(m->Submit(Job("b")).ok());
    ASSERT_TRUE(workers_[0]->AwaitStarts(1, absl::Seconds(30)));
    // The fakes never pull, so no step boundary comes: the wait ends at its
    // bound and the job is queued again all the same.
    m->Shutdown(absl::Milliseconds(20));
    EXPECT_GE(workers_[1]->stops(), 1);  // Its workers were stopped.
    std::vector<v1::JobRecord> jobs = m->List();
    ASSERT_EQ(jobs.size(), 2u);
    EXPECT_EQ(jobs[0].state(), v1::QUEUED);
    EXPECT_TRUE(jobs[0].spec().resume());
    EXPECT_EQ(jobs[1].state(), v1::QUEUED);
    EXPECT_FALSE(jobs[1].spec().resume());
    std::vector<std::string> events = Messages(*m, "a");
    EXPECT_NE(std::find(events.begin(), events.end(),
                        "the chief shut down while this job ran: queued again, resumes from its "
                        "latest checkpoint (it reached no step boundary in time)"),
              events.end());
    // Nothing more is taken after a shutdown.
    ASSERT_TRUE(m->Submit(Job("c")).ok());
    EXPECT_EQ(workers_[0]->starts(), 1);
  }
  auto m = StartManager(FakeWorkerClient::OnStart::kFinish);
  v1::JobRecord a = AwaitEnd(*m, "a");
  EXPECT_EQ(a.state(), v1::SUCCEEDED) << a.error();
  EXPECT_TRUE(a.spec().resume());
  EXPECT_EQ(AwaitEnd(*m, "b").state(), v1::SUCCEEDED);
  EXPECT_EQ(AwaitEnd(*m, "c").state(), v1::SUCCEEDED);
}

TEST_F(JobManagerTest, SubmitFailsWhenTheRecordCannotBeWritten) {
  auto m = StartManager(FakeWorkerClient::OnStart::kRun);
  std::ofstream(dir_ + "/jobs/x") << "a file where the job's directory goes";
  auto r = m->Submit(Job("x"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal) << r.status();
  EXPECT_NE(r.status().message().find(dir_ + "/jobs/x"), std::string::npos) << r.status();
  EXPECT_TRUE(m->List().empty());
  EXPECT_EQ(m->Get("x").status().code(), absl::StatusCode::kNotFound);
  // Nor does a restarted chief know it.
  m.reset();
  m = StartManager(FakeWorkerClient::OnStart::kRun);
  EXPECT_TRUE(m->List().empty());
}

TEST_F(JobManagerTest, ARetryableFailureRestartsUpToMaxRestartsThenFails) {
  auto m = StartManager(FakeWorkerClient::OnStart::kFail,
                        absl::UnavailableError("ps 1 went away"));
  ASSERT_TRUE(m->Submit(Job("a", /*max_restarts=*/2)).ok());
  v1::JobRecord a = AwaitEnd(*m, "a");
  EXPECT_EQ(a.state(), v1::FAILED);
  EXPECT_EQ(a.attempts(), 3);
  EXPECT_EQ(a.error(), "worker 0: ps 1 went away");
  std::vector<std::string> events = Messages(*m, "a");
  EXPECT_NE(std::find(events.begin(), events.end(),
                      "attempt 2 failed: worker 0: ps 1 went away; restarting from the latest "
                      "checkpoint (restart 2 of 2)"),
            events.end());
}

TEST_F(JobManagerTest, ANonRetryableFailureFailsAtOnce) {
  auto m = StartManager(FakeWorkerClient::OnStart::kFail,
                        absl::ResourceExhaustedError("GPU:0: out of memory"));
  ASSERT_TRUE(m->Submit(Job("a", 5)).ok());
  v1::JobRecord a = AwaitEnd(*m, "a");
  EXPECT_EQ(a.state(), v1::FAILED);
  EXPECT_EQ(a.attempts(), 1);
  EXPECT_EQ(a.error(), "worker 0: GPU:0: out of memory");
}

// A stopping ps cancels the workers' calls: a CANCELLED that the job's own
// token did not cause is a lost peer (restart), never "cancelled by user".
TEST_F(JobManagerTest, ACancelFromAPeerRestartsAndIsNeverAUserCancel) {
  auto m = StartManager(FakeWorkerClient::OnStart::kFail,
                        absl::CancelledError("pull: ps 1 shutting down"));
  ASSERT_TRUE(m->Submit(Job("a", /*max_restarts=*/1)).ok());
  v1::JobRecord a = AwaitEnd(*m, "a");
  EXPECT_EQ(a.state(), v1::FAILED) << a.error();
  EXPECT_EQ(a.attempts(), 2);
  EXPECT_EQ(a.error().find("cancelled by user"), std::string::npos) << a.error();
  EXPECT_NE(a.error().find("pull: ps 1 shutting down"), std::string::npos) << a.error();
}

TEST_F(JobManagerTest, CancelQueuedAndRunningJobs) {
  auto m = StartManager(FakeWorkerClient::OnStart::kRun);
  ASSERT_TRUE(m->Submit(Job("a")).ok());
  ASSERT_TRUE(m->Submit(Job("b")).ok());
  ASSERT_TRUE(workers_[0]->AwaitStarts(1, absl::Seconds(30)));
  auto b = m->Cancel("b");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->state(), v1::CANCELLED);
  EXPECT_EQ(b->error(), "cancelled while queued");
  auto a = m->Cancel("a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->state(), v1::CANCELLED);
  EXPECT_EQ(a->error(), "cancelled by user");
  for (auto* w : workers_) EXPECT_EQ(w->status().state(), v1::WORK_STOPPED);
  for (auto* p : ps_) EXPECT_FALSE(p->holds("a"));
  absl::Status again = m->Cancel("a").status();
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(again.message(), "job \"a\" has already ended (CANCELLED)");
  EXPECT_EQ(m->Cancel("zzz").status().code(), absl::StatusCode::kNotFound);
}

// Variable updates a server did not apply (values not finite) end the job
// with an event naming the server and the count; a job with none has no
// such event.
TEST_F(JobManagerTest, SkippedUpdatesAreAnEventOfTheJob) {
  auto m = StartManager(FakeWorkerClient::OnStart::kRun);
  for (const std::string id : {"s", "t"}) {
    ASSERT_TRUE(m->Submit(Job(id)).ok());
    ASSERT_TRUE(workers_[0]->AwaitStarts(id == "s" ? 1 : 2, absl::Seconds(30)));
    for (auto* p : ps_) p->SetJob(id, 10);
    if (id == "s") ps_[1]->SetUpdatesSkipped(id, 3);
    for (auto* w : workers_) w->Finish();
    EXPECT_EQ(AwaitEnd(*m, id).state(), v1::SUCCEEDED);
    const std::vector<std::string> events = Messages(*m, id);
    const bool named = std::any_of(events.begin(), events.end(), [](const std::string& e) {
      return e.find("Variable updates not applied") != std::string::npos &&
             e.find("ps 1 skipped 3") != std::string::npos &&
             e.find("ps 0 skipped") == std::string::npos;
    });
    EXPECT_EQ(named, id == "s") << id;
  }
}

TEST_F(JobManagerTest, AFailedFinalCheckpointFailsTheJobNamingThePath) {
  auto m = StartManager(FakeWorkerClient::OnStart::kRun);
  std::filesystem::create_directories(dir_);
  std::ofstream(dir_ + "/blocker") << "a file where the checkpoint directory goes";
  v1::SubmitJobRequest job = Job("c", /*max_restarts=*/2);
  job.mutable_spec()->mutable_checkpoint()->set_disabled(false);
  job.mutable_spec()->mutable_checkpoint()->set_dir(dir_ + "/blocker/ckpt");
  ASSERT_TRUE(m->Submit(job).ok());
  ASSERT_TRUE(workers_[0]->AwaitStarts(1, absl::Seconds(30)));
  for (auto* p : ps_) p->SetJob("c", 10);  // what the workers' registration did
  for (auto* w : workers_) w->Finish();
  v1::JobRecord c = AwaitEnd(*m, "c");
  EXPECT_EQ(c.state(), v1::FAILED);
  EXPECT_EQ(c.attempts(), 1);  // not a cause a restart cures
  EXPECT_NE(c.error().find("final checkpoint"), std::string::npos) << c.error();
  EXPECT_NE(c.error().find(dir_ + "/blocker/ckpt"), std::string::npos) << c.error();
  EXPECT_EQ(c.checkpoint_step(), -1);
  for (auto* p : ps_) EXPECT_FALSE(p->holds("c"));  // freed all the same
}

}  // namespace
}  // namespace towerps::worker
