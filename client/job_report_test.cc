#include "client/job_report.h"

#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace towerps::client {
namespace {

TEST(JobReportTest, CellsSayWhatIsKnown) {
  v1::Metrics m;
  EXPECT_EQ(StepCell(m), "0");
  EXPECT_EQ(LossCell(m), "-");  // no step yet
  m.set_step(120);
  m.set_total_steps(468);
  m.set_loss(0.41234);
  m.set_accuracy(0.8512);
  EXPECT_EQ(AccuracyCell(m), "-");  // no accuracy for this model
  m.set_has_accuracy(true);
  EXPECT_EQ(StepCell(m), "120/468");
  EXPECT_EQ(LossCell(m), "0.4123");
  EXPECT_EQ(AccuracyCell(m), "0.8512 train");
  m.set_test_accuracy(0.8401);
  m.set_has_test(true);
  EXPECT_EQ(AccuracyCell(m), "0.8401 test");
  v1::Metrics before_first_step;
  before_first_step.set_has_accuracy(true);
  EXPECT_EQ(AccuracyCell(before_first_step), "-");
}

TEST(JobReportTest, DurationRunsFromTheStartToTheEnd) {
  v1::JobRecord r;
  EXPECT_EQ(JobDuration(r), -1);  // not started
  r.set_start_time(1000);
  r.set_end_time(1090.5);
  EXPECT_DOUBLE_EQ(JobDuration(r), 90.5);
  r.clear_end_time();
  EXPECT_GT(JobDuration(r), 1e9);  // running: up to now
}

// An even share with a quarter's margin is balanced; beyond, the largest
// shard is named with its share and the even one.
TEST(JobReportTest, ImbalanceIsNotedBeyondAQuarterOverAnEvenShare) {
  EXPECT_EQ(ImbalanceNote({}), "");
  EXPECT_EQ(ImbalanceNote({{0, 100}}), "");
  EXPECT_EQ(ImbalanceNote({{0, 0}, {1, 0}}), "");
  EXPECT_EQ(ImbalanceNote({{0, 60}, {1, 40}}), "");
  EXPECT_EQ(ImbalanceNote({{0, 625}, {1, 375}}), "");  // 62.5%: 1.25 x 50%
  EXPECT_EQ(ImbalanceNote({{0, 255}, {1, 745}}),
            "Placement is unbalanced: ps 1 holds 74.5% of the bytes (an even share is 50.0%).");
  EXPECT_EQ(ImbalanceNote({{0, 10}, {1, 10}, {2, 10}, {3, 70}}),
            "Placement is unbalanced: ps 3 holds 70.0% of the bytes (an even share is 25.0%).");
}

TEST(JobReportTest, RecordNamesAttemptCheckpointAndError) {
  v1::JobRecord r;
  r.set_job_id("job-7");
  r.set_state(v1::RUNNING);
  r.set_attempts(2);
  r.set_checkpoint_step(300);
  r.set_restored_step(200);
  r.set_error("ps 1 unreachable");
  std::ostringstream out;
  PrintJobRecord(out, r);
  const std::string text = out.str();
  EXPECT_NE(text.find("Job:          job-7\n"), std::string::npos) << text;
  EXPECT_NE(text.find("State:        RUNNING (attempt 2)\n"), std::string::npos) << text;
  EXPECT_NE(text.find("Checkpoint:   step 300 (restored from step 200)\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("Metrics:      -\n"), std::string::npos) << text;
  EXPECT_NE(text.find("Error:        ps 1 unreachable\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("TensorBoard"), std::string::npos) << text;
}

v1::ShardStatus Shard(int task, int64_t bytes, bool reported) {
  v1::ShardStatus s;
  s.set_ps_task(task);
  s.set_address("127.0.0.1:" + std::to_string(2222 + task));
  s.set_reachable(reported);
  if (reported) {
    s.mutable_status()->set_bytes_held(bytes);
    s.mutable_status()->set_num_variables(3);
    s.mutable_status()->set_global_step(7);
  } else {
    s.set_error("connection refused");
  }
  return s;
}

TEST(JobReportTest, LiveStatusShowsTheOpenStepAndEachServersShare) {
  v1::JobLiveStatus live;
  live.set_global_step(7);
  live.set_explanation("step 7 waits for worker 1 (2.0 s)");
  live.add_waiting_for(1);
  live.set_waiting_s(2);
  *live.add_shards() = Shard(0, 255, true);
  *live.add_shards() = Shard(1, 745, true);
  live.mutable_shards(0)->mutable_status()->add_pushed_this_step(0);
  std::ostringstream out;
  PrintJobLiveStatus(out, live);
  const std::string text = out.str();
  EXPECT_NE(text.find("Live: global step 7\n  step 7 waits for worker 1 (2.0 s)\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("  Open step 7: pushed by worker 0; waiting for worker 1 for 2.0s\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("25.5%"), std::string::npos) << text;
  EXPECT_NE(text.find("74.5%"), std::string::npos) << text;
  EXPECT_NE(text.find("Placement is unbalanced: ps 1 holds 74.5%"), std::string::npos) << text;
}

// A server that did not report has no figures, and no share of the bytes
// can be claimed for the others: not "ps 0 holds 100%".
TEST(JobReportTest, LiveStatusWithASilentServerClaimsNoShares) {
  v1::JobLiveStatus live;
  *live.add_shards() = Shard(0, 1000, true);
  *live.add_shards() = Shard(1, 0, false);
  std::ostringstream out;
  PrintJobLiveStatus(out, live);
  const std::string text = out.str();
  EXPECT_NE(text.find("Shares of the bytes unknown: ps 1 did not report."), std::string::npos)
      << text;
  EXPECT_EQ(text.find("%"), std::string::npos) << text;
  EXPECT_EQ(text.find("Placement is unbalanced"), std::string::npos) << text;
  EXPECT_NE(text.find("connection refused"), std::string::npos) << text;
}

TEST(JobReportTest, FinalShardsShowEachServersCores) {
  v1::JobRecord r;
  std::ostringstream none;
  PrintFinalShards(none, r);
  EXPECT_EQ(none.str(), "");
  v1::JobStatus* a = r.add_final_shards();
  a->set_bytes_held(500);
  a->set_update_span_s(2);
  a->set_update_span_cpu_s(1);
  v1::JobStatus* b = r.add_final_shards();
  b->set_bytes_held(500);
  std::ostringstream out;
  PrintFinalShards(out, r);
  const std::string text = out.str();
  EXPECT_EQ(text.rfind("\nParameter servers at the end of the job:\n", 0), 0u) << text;
  EXPECT_NE(text.find("0.50"), std::string::npos) << text;  // 1 s of CPU in 2 s
  EXPECT_NE(text.find("50.0%"), std::string::npos) << text;
  EXPECT_EQ(text.find("unbalanced"), std::string::npos) << text;
}

}  // namespace
}  // namespace towerps::client
