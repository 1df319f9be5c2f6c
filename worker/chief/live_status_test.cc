// GetJob's live explanation: the exact line for each situation.
#include "worker/chief/live_status.h"

#include <memory>

#include "gtest/gtest.h"
#include "worker/chief/fake_ps_control.h"
#include "worker/chief/fake_worker_client.h"

namespace towerps::worker {
namespace {

class LiveStatusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_.ps = {"h:1", "h:2"};
    cluster_.worker = {"h:3", "h:4"};
    for (int p = 0; p < 2; ++p) ps_.push_back(std::make_unique<FakePsControl>(p));
    for (int w = 0; w < 2; ++w) {
      workers_.push_back(std::make_unique<FakeWorkerClient>(w));
      v1::StartJobRequest r;
      r.mutable_job()->set_job_id("j");
      r.set_attempt(1);
      ASSERT_TRUE(workers_[w]->StartJob(r).ok());
    }
    record_.set_job_id("j");
    record_.mutable_metrics()->set_total_steps(100);
  }

  v1::JobLiveStatus Gather() {
    std::vector<PsControl*> ps;
    for (auto& p : ps_) ps.push_back(p.get());
    std::vector<WorkerClient*> w;
    for (auto& p : workers_) w.push_back(p.get());
    return GatherLive(record_, cluster_, ps, w);
  }

  common::ClusterSpec cluster_;
  std::vector<std::unique_ptr<FakePsControl>> ps_;
  std::vector<std::unique_ptr<FakeWorkerClient>> workers_;
  v1::JobRecord record_;
};

TEST_F(LiveStatusTest, Starting) {
  EXPECT_EQ(Gather().explanation(), "starting: the servers do not hold the job's variables yet");
}

TEST_F(LiveStatusTest, Running) {
  ps_[0]->SetJob("j", 42);
  ps_[1]->SetJob("j", 41);
  v1::JobLiveStatus live = Gather();
  EXPECT_EQ(live.explanation(), "running: step 41");
  EXPECT_EQ(live.global_step(), 41);
  EXPECT_EQ(live.workers(1).state(), v1::WORK_RUNNING);
}

TEST_F(LiveStatusTest, AStepWaitingForASilentWorker) {
  ps_[0]->SetJob("j", 7, 3.5, {1});
  ps_[1]->SetJob("j", 7, 1.0, {0, 1});
  workers_[1]->SetUnreachable(true);
  v1::JobLiveStatus live = Gather();
  EXPECT_EQ(live.explanation(),
            "step 7 has waited 3.5 s for worker 1 (worker 1 does not answer status requests "
            "either: stopped, hung or overloaded?)");
  ASSERT_EQ(live.waiting_for_size(), 1);
  EXPECT_EQ(live.waiting_for(0), 1);
}

TEST_F(LiveStatusTest, UnreachableTasks) {
  ps_[0]->SetJob("j", 5);
  ps_[1]->SetUnreachable(true);
  EXPECT_EQ(Gather().explanation(),
            "ps 1 (h:2) is unreachable: ps 1 unreachable (every step needs it: the workers fail "
            "the job after 60 s without it)");
  // Before the workers the open step waits for: they are blocked on it.
  ps_[0]->SetJob("j", 5, 7.5, {0, 1});
  record_.mutable_spec()->set_peer_timeout_s(20);
  EXPECT_EQ(Gather().explanation(),
            "ps 1 (h:2) is unreachable: ps 1 unreachable (every step needs it: the workers fail "
            "the job after 20 s without it)");
  ps_[0]->SetJob("j", 5);
  ps_[1]->SetUnreachable(false);
  ps_[1]->SetJob("j", 5);
  workers_[0]->SetUnreachable(true);
  EXPECT_EQ(Gather().explanation(), "worker 0 (h:3) is unreachable: worker 0 unreachable");
}

TEST_F(LiveStatusTest, TrainedAllSteps) {
  ps_[0]->SetJob("j", 100, 9.0, {0, 1});
  ps_[1]->SetJob("j", 100, 9.0, {0, 1});
  v1::JobLiveStatus live = Gather();
  EXPECT_EQ(live.explanation(),
            "trained all 100 steps: evaluating and writing the final checkpoint");
  EXPECT_EQ(live.waiting_for_size(), 0);  // Nobody is waited for.
}

TEST_F(LiveStatusTest, Cluster) {
  cluster_.task_index = 0;
  ps_[0]->SetBudget(1000, 300);
  ps_[1]->SetUnreachable(true);
  std::vector<PsControl*> ps;
  for (auto& p : ps_) ps.push_back(p.get());
  std::vector<WorkerClient*> w;
  for (auto& p : workers_) w.push_back(p.get());
  v1::ClusterResponse c = GatherCluster(cluster_, ps, w);
  ASSERT_EQ(c.tasks_size(), 4);
  EXPECT_TRUE(c.tasks(0).healthy());
  EXPECT_EQ(c.tasks(0).memory_budget_bytes(), 1000);
  EXPECT_EQ(c.tasks(0).memory_reserved_bytes(), 300);
  EXPECT_FALSE(c.tasks(1).healthy());
  EXPECT_EQ(c.tasks(1).error(), "ps 1 unreachable");
  EXPECT_TRUE(c.tasks(2).is_chief());
  EXPECT_EQ(c.tasks(3).address(), "h:4");
}

}  // namespace
}  // namespace towerps::worker
