// The fake ps holds jobs until deleted, saves only what it holds, and
// answers UNAVAILABLE while unreachable.
#include "worker/chief/fake_ps_control.h"

#include "gtest/gtest.h"

namespace towerps::worker {
namespace {

TEST(FakePsControlTest, HoldsJobsUntilDeleted) {
  FakePsControl ps(0);
  ps.SetJob("a", 7);
  auto status = ps.GetStatus("a", absl::Seconds(1));
  ASSERT_TRUE(status.ok());
  ASSERT_EQ(status->jobs_size(), 1);
  EXPECT_EQ(status->jobs(0).global_step(), 7);
  auto deleted = ps.DeleteJob("a", absl::Seconds(1));
  ASSERT_TRUE(deleted.ok());
  EXPECT_TRUE(deleted->existed());
  EXPECT_FALSE(ps.holds("a"));
  v1::SaveRequest save;
  save.set_job_id("a");
  EXPECT_EQ(ps.SaveCheckpoint(save, absl::Seconds(1)).status().code(), absl::StatusCode::kNotFound);
  ps.SetUnreachable(true);
  absl::Status st = ps.DeleteJob("a", absl::Seconds(1)).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(st.message(), "ps 0 unreachable");
}

}  // namespace
}  // namespace towerps::worker
