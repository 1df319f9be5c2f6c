// The job store: queue order, persistence across a restart of the chief
// (a new store over the same state_dir), a record that cannot be written
// refusing the job, and progress written by the store's writer thread.
#include "worker/chief/job_store.h"

#include <filesystem>
#include <fstream>
#include <thread>

#include "common/job_spec.h"
#include "gtest/gtest.h"

namespace towerps::worker {
namespace {

std::string FreshDir(const std::string& name) {
  const std::string dir = std::string(getenv("TEST_TMPDIR")) + "/" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

v1::JobSpec Spec(const std::string& id) {
  v1::JobSpec spec = JobWithDefaults(*BuiltinJob("dense_stack"));
  spec.set_job_id(id);
  return spec;
}

std::unique_ptr<JobStore> Open(const std::string& dir) {
  auto store = JobStore::Open(dir);
  EXPECT_TRUE(store.ok()) << store.status();
  return std::move(*store);
}

TEST(JobStoreTest, QueueTakesJobsInSubmissionOrder) {
  auto store = Open(FreshDir("order"));
  ASSERT_TRUE(store->Add(Spec("b")).ok());
  ASSERT_TRUE(store->Add(Spec("a")).ok());
  auto unnamed = store->Add(Spec(""));
  ASSERT_TRUE(unnamed.ok()) << unnamed.status();
  EXPECT_EQ(unnamed->job_id(), "job-1");
  common::CancellationToken stop;
  for (const char* want : {"b", "a", "job-1"}) {
    auto next = store->TakeNext(stop);
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_EQ(next->record.job_id(), want);
    EXPECT_EQ(next->record.state(), v1::RUNNING);
    EXPECT_FALSE(next->cancel->cancelled());
  }
  stop.Cancel("shutting down");
  EXPECT_EQ(store->TakeNext(stop).status().code(), absl::StatusCode::kCancelled);
}

TEST(JobStoreTest, TakeNextWakesOnCancel) {
  auto store = Open(FreshDir("wake"));
  common::CancellationToken stop;
  std::thread canceller([&] { stop.Cancel("bye"); });
  EXPECT_EQ(store->TakeNext(stop).status().code(), absl::StatusCode::kCancelled);
  canceller.join();
}

TEST(JobStoreTest, RecordsSurviveARestart) {
  const std::string dir = FreshDir("restart");
  {
    auto store = Open(dir);
    ASSERT_TRUE(store->Add(Spec("first")).ok());
    ASSERT_TRUE(store->Add(Spec("")).ok());  // job-1
    ASSERT_TRUE(store->Add(Spec("third")).ok());
    common::CancellationToken stop;
    ASSERT_EQ(store->TakeNext(stop)->record.job_id(), "first");  // RUNNING when the chief stops.
  }
  auto store = Open(dir);
  std::vector<v1::JobRecord> jobs = store->List();
  ASSERT_EQ(jobs.size(), 3u);
  EXPECT_EQ(jobs[0].job_id(), "first");
  EXPECT_EQ(jobs[1].job_id(), "job-1");
  EXPECT_EQ(jobs[2].job_id(), "third");
  EXPECT_EQ(jobs[0].state(), v1::QUEUED);
  EXPECT_TRUE(jobs[0].spec().resume());
  auto events = store->EventsAfter("first", 0, absl::ZeroDuration());
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->events.size(), 3u);  // QUEUED, RUNNING, queued again.
  EXPECT_EQ(events->events[2].seq(), 3);
  EXPECT_NE(events->events[2].message().find("the chief restarted while this job ran"),
            std::string::npos);
  // The attempt that died with the chief counts as a restart; the queued
  // ones used none.
  EXPECT_EQ(jobs[0].restarts(), 1);
  EXPECT_NE(events->events[2].message().find("(restart 1 of "), std::string::npos)
      << events->events[2].message();
  EXPECT_EQ(jobs[1].restarts(), 0);
  // Generated ids go on after the loaded ones.
  EXPECT_EQ(store->Add(Spec(""))->job_id(), "job-2");
}

TEST(JobStoreTest, UnwritableJobDirectoryRefusesTheJob) {
  const std::string dir = FreshDir("unwritable");
  auto store = Open(dir);
  // A regular file where the job's directory should be (tests run as root:
  // permissions would not stop the write).
  std::ofstream(dir + "/jobs/blocked") << "not a directory";
  auto added = store->Add(Spec("blocked"));
  ASSERT_FALSE(added.ok());
  EXPECT_EQ(added.status().code(), absl::StatusCode::kInternal) << added.status();
  EXPECT_NE(added.status().message().find(dir + "/jobs/blocked"), std::string::npos)
      << added.status();
  EXPECT_TRUE(store->List().empty());
  EXPECT_EQ(store->Get("blocked").status().code(), absl::StatusCode::kNotFound);
}

TEST(JobStoreTest, UnwritableRecordRefusesTheJob) {
  const std::string dir = FreshDir("record");
  auto store = Open(dir);
  // A directory where the record file should be: the rename onto it fails.
  std::filesystem::create_directories(dir + "/jobs/r/record/x");
  auto added = store->Add(Spec("r"));
  ASSERT_FALSE(added.ok());
  EXPECT_NE(added.status().message().find("cannot save job record " + dir + "/jobs/r/record"),
            std::string::npos)
      << added.status();
  EXPECT_TRUE(store->List().empty());
  // Nothing was kept: a fixed directory takes the same id.
  std::filesystem::remove_all(dir + "/jobs/r/record");
  EXPECT_TRUE(store->Add(Spec("r")).ok());
}

v1::Metrics StepMetrics(int64_t step) {
  v1::Metrics m;
  m.set_step(step);
  return m;
}

// UpdateSoon's change is seen at once and on disk once the store is gone,
// with every other change, whichever came last: a write of the record
// never undoes a later one.
TEST(JobStoreTest, ProgressUpdatedSoonIsSeenAtOnceAndWritten) {
  const std::string dir = FreshDir("soon");
  {
    auto store = Open(dir);
    ASSERT_TRUE(store->Add(Spec("a")).ok());
    ASSERT_TRUE(store->Add(Spec("b")).ok());
    for (int64_t step = 1; step <= 50; ++step) {
      ASSERT_TRUE(store->UpdateSoon("a", [&](v1::JobRecord& r) {
        *r.mutable_metrics() = StepMetrics(step);
      }).ok());
      EXPECT_EQ(store->Get("a")->metrics().step(), step);
      if (step % 10 == 0) {  // a change written by the caller, in between
        ASSERT_TRUE(store->Update("a", [&](v1::JobRecord& r) {
          r.set_restored_step(step);
        }).ok());
      }
    }
    ASSERT_TRUE(store->UpdateSoon("b", [](v1::JobRecord& r) {
      *r.mutable_metrics() = StepMetrics(7);
    }).ok());
    EXPECT_EQ(store->UpdateSoon("nope", [](v1::JobRecord&) {}).code(),
              absl::StatusCode::kNotFound);
  }
  auto store = Open(dir);
  EXPECT_EQ(store->Get("a")->metrics().step(), 50);
  EXPECT_EQ(store->Get("a")->restored_step(), 50);
  EXPECT_EQ(store->Get("b")->metrics().step(), 7);
}

// The caller of UpdateSoon never writes: a record that cannot be written
// fails Update, not UpdateSoon, whose change stays in memory and reaches
// the disk with the next write that can.
TEST(JobStoreTest, UpdateSoonLeavesTheWriteToTheStore) {
  const std::string dir = FreshDir("soon_unwritable");
  auto store = Open(dir);
  ASSERT_TRUE(store->Add(Spec("r")).ok());
  std::filesystem::remove(dir + "/jobs/r/record");
  std::filesystem::create_directories(dir + "/jobs/r/record/x");  // the rename onto it fails
  ASSERT_TRUE(store->UpdateSoon("r", [](v1::JobRecord& r) {
    *r.mutable_metrics() = StepMetrics(3);
  }).ok());
  EXPECT_EQ(store->Get("r")->metrics().step(), 3);
  const absl::Status s = store->Update("r", [](v1::JobRecord&) {});
  EXPECT_NE(s.message().find("cannot save job record " + dir + "/jobs/r/record"),
            std::string::npos)
      << s;
  std::filesystem::remove_all(dir + "/jobs/r/record");
  ASSERT_TRUE(store->Update("r", [](v1::JobRecord& r) { r.set_restored_step(4); }).ok());
  store.reset();
  auto reopened = Open(dir);
  EXPECT_EQ(reopened->Get("r")->metrics().step(), 3);
  EXPECT_EQ(reopened->Get("r")->restored_step(), 4);
}

TEST(JobStoreTest, CancelFiresTheRunningJobsToken) {
  auto store = Open(FreshDir("token"));
  ASSERT_TRUE(store->Add(Spec("a")).ok());
  common::CancellationToken stop;
  auto run = store->TakeNext(stop);
  ASSERT_TRUE(run.ok()) << run.status();
  auto record = store->RequestCancel("a");
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(record->state(), v1::RUNNING);  // Until the manager ends it.
  EXPECT_TRUE(run->cancel->cancelled());
  EXPECT_EQ(run->cancel->Check().message(), "cancelled by user");
  store->CancelRunning("the chief shut down");  // The first reason stays.
  EXPECT_EQ(run->cancel->Check().message(), "cancelled by user");
}

TEST(JobStoreTest, DuplicateIdsAndCancel) {
  auto store = Open(FreshDir("cancel"));
  ASSERT_TRUE(store->Add(Spec("a")).ok());
  absl::Status dup = store->Add(Spec("a")).status();
  EXPECT_EQ(dup.code(), absl::StatusCode::kAlreadyExists) << dup;
  auto cancelled = store->RequestCancel("a");
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);
  EXPECT_EQ(cancelled->error(), "cancelled while queued");
  absl::Status again = store->RequestCancel("a").status();
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(again.message(), "job \"a\" has already ended (CANCELLED)");
  EXPECT_EQ(store->RequestCancel("nope").status().code(), absl::StatusCode::kNotFound);
  // Restarts used by the ended run do not count against the resubmitted one.
  ASSERT_TRUE(store->Update("a", [](v1::JobRecord& r) { r.set_restarts(3); }).ok());
  auto resumed = store->Resubmit("a");
  ASSERT_TRUE(resumed.ok());
  EXPECT_EQ(resumed->state(), v1::QUEUED);
  EXPECT_TRUE(resumed->spec().resume());
  EXPECT_EQ(resumed->restarts(), 0);
  EXPECT_EQ(store->Resubmit("a").status().code(), absl::StatusCode::kFailedPrecondition);
}

// Issue 15: a record from before the paths were confined may name dirs
// relative to the chief's working directory; reloaded, they are absolute
// with that same meaning.
TEST(JobStoreTest, RelativeDirsOfOldRecordsAreMadeAbsoluteOnLoad) {
  const std::string dir = FreshDir("legacy");
  {
    auto store = Open(dir);
    v1::JobSpec spec = Spec("old");
    spec.mutable_checkpoint()->set_dir("towerps_state/jobs/old/checkpoints");
    spec.set_tensorboard_dir("towerps_state/jobs/old/tensorboard");
    ASSERT_TRUE(store->Add(spec).ok());
  }
  auto store = Open(dir);
  auto r = store->Get("old");
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string cwd = std::filesystem::current_path().string();
  EXPECT_EQ(r->checkpoint_dir(), cwd + "/towerps_state/jobs/old/checkpoints");
  EXPECT_EQ(r->spec().checkpoint().dir(), cwd + "/towerps_state/jobs/old/checkpoints");
  EXPECT_EQ(r->tensorboard_dir(), cwd + "/towerps_state/jobs/old/tensorboard");
  EXPECT_EQ(r->spec().tensorboard_dir(), cwd + "/towerps_state/jobs/old/tensorboard");
}

}  // namespace
}  // namespace towerps::worker
