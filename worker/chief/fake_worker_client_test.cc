// The fake worker behaves like the real thing: one job at a time, stopped
// jobs WORK_STOPPED, failures with their code; errors injected as asked.
#include "worker/chief/fake_worker_client.h"

#include "gtest/gtest.h"

namespace towerps::worker {
namespace {

v1::StartJobRequest Request(const std::string& id, int attempt) {
  v1::StartJobRequest r;
  r.mutable_job()->set_job_id(id);
  r.set_attempt(attempt);
  return r;
}

TEST(FakeWorkerClientTest, RunsOneJobAtATime) {
  FakeWorkerClient w(1);
  ASSERT_TRUE(w.StartJob(Request("a", 1)).ok());
  absl::Status busy = w.StartJob(Request("b", 1));
  EXPECT_EQ(busy.code(), absl::StatusCode::kFailedPrecondition) << busy;
  ASSERT_TRUE(w.StopJob("a").ok());
  EXPECT_EQ(w.status().state(), v1::WORK_STOPPED);
  ASSERT_TRUE(w.StartJob(Request("b", 2)).ok());
  w.Fail(absl::InvalidArgumentError("bad layer"));
  auto s = w.GetStatus(absl::Seconds(1));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->job_id(), "b");
  EXPECT_EQ(s->attempt(), 2);
  EXPECT_EQ(s->state(), v1::WORK_FAILED);
  EXPECT_EQ(s->error_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(s->error(), "bad layer");
  EXPECT_EQ(w.starts(), 2);
}

TEST(FakeWorkerClientTest, InjectsErrors) {
  FakeWorkerClient w(3);
  w.SetUnreachable(true);
  absl::Status st = w.GetStatus(absl::Seconds(1)).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(st.message(), "worker 3 unreachable");
  w.SetUnreachable(false);
  w.FailStarts(absl::InternalError("boom"), 1);
  EXPECT_EQ(w.StartJob(Request("a", 1)).code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(w.StartJob(Request("a", 1)).ok());
}

}  // namespace
}  // namespace towerps::worker
