// The chief's own worker's callbacks land in the job's record and events.
#include "worker/chief/chief_hooks.h"

#include <filesystem>
#include <memory>
#include <thread>

#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "worker/chief/fake_ps_control.h"

namespace towerps::worker {
namespace {

TEST(ChiefHooksTest, MetricsAndLogsBecomeEvents) {
  const std::string dir = std::string(getenv("TEST_TMPDIR")) + "/hooks";
  std::filesystem::remove_all(dir);
  auto store = JobStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  v1::JobSpec spec = JobWithDefaults(*BuiltinJob("dense_stack"));
  spec.set_job_id("j");
  auto added = (*store)->Add(spec);
  ASSERT_TRUE(added.ok()) << added.status();
  FakePsControl ps(0);
  Checkpointer checkpointer({&ps}, **store);
  ChiefHooks hooks(**store, checkpointer);
  hooks.BeginJob(added->spec());
  v1::StartJobRequest request;
  *request.mutable_job() = added->spec();
  JobHooks h = hooks.For(request);
  h.log("placement: 1 tower");
  v1::Metrics m;
  m.set_step(5);
  m.set_loss(0.5);
  m.set_total_steps(100);
  h.on_metrics(m, /*epoch_end=*/false);
  v1::Metrics eval;
  eval.set_step(5);
  eval.set_test_loss(0.25);
  h.on_metrics(eval, /*epoch_end=*/true);
  hooks.EndJob();

  auto record = (*store)->Get("j");
  ASSERT_TRUE(record.ok());
  EXPECT_EQ(record->metrics().step(), 5);
  EXPECT_FLOAT_EQ(record->metrics().loss(), 0.5);
  EXPECT_FLOAT_EQ(record->metrics().test_loss(), 0.25);
  EXPECT_TRUE(record->metrics().has_test());
  auto events = (*store)->EventsAfter("j", 1, absl::ZeroDuration());
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->events.size(), 3u);
  EXPECT_EQ(events->events[0].message(), "placement: 1 tower");
  EXPECT_EQ(events->events[1].kind(), v1::JobEvent::PROGRESS);
  EXPECT_EQ(events->events[2].kind(), v1::JobEvent::EPOCH);
  EXPECT_FLOAT_EQ(events->events[2].metrics().test_loss(), 0.25);
  EXPECT_TRUE(std::filesystem::exists(added->tensorboard_dir()));
}

// Shutdown: the next pull is a step boundary where the checkpoint of that
// step is written, and the attempt ends CANCELLED.
TEST(ChiefHooksTest, StopAtNextStepCheckpointsAtTheBoundaryAndEndsTheAttempt) {
  const std::string dir = std::string(getenv("TEST_TMPDIR")) + "/stop";
  std::filesystem::remove_all(dir);
  auto store = JobStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  v1::JobSpec spec = JobWithDefaults(*BuiltinJob("dense_stack"));
  spec.set_job_id("j");
  spec.mutable_checkpoint()->set_every_steps(0);  // Only the stop saves.
  spec.mutable_checkpoint()->set_every_seconds(0);
  auto added = (*store)->Add(spec);
  ASSERT_TRUE(added.ok()) << added.status();
  FakePsControl ps0(0), ps1(1);
  ps0.SetJob("j", 12);
  ps1.SetJob("j", 12);
  Checkpointer checkpointer({&ps0, &ps1}, **store);
  ChiefHooks hooks(**store, checkpointer);
  hooks.BeginJob(added->spec());
  v1::StartJobRequest request;
  *request.mutable_job() = added->spec();
  JobHooks h = hooks.For(request);
  ASSERT_TRUE(h.after_pull(11).ok());  // Before the request: training goes on.
  EXPECT_EQ(ps0.saves(), 0);

  ChiefHooks::StopResult result;
  std::thread stopper([&] { result = hooks.StopAtNextStep(absl::Seconds(60)); });
  // The training thread pulls until a pull ends the attempt.
  absl::Status pulled = absl::OkStatus();
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (pulled.ok() && absl::Now() < give_up) pulled = h.after_pull(12);
  stopper.join();
  EXPECT_TRUE(absl::IsCancelled(pulled)) << pulled;
  EXPECT_NE(pulled.message().find("step 12"), std::string::npos) << pulled;
  EXPECT_TRUE(result.reached);
  EXPECT_EQ(result.step, 12);
  EXPECT_TRUE(result.checkpoint.ok()) << result.checkpoint;
  EXPECT_EQ(ps0.saves(), 1);
  EXPECT_EQ(ps1.saves(), 1);
  EXPECT_EQ((*store)->Get("j")->checkpoint_step(), 12);
  // Every later pull of the job stops too (the request is terminal).
  EXPECT_TRUE(absl::IsCancelled(h.after_pull(12)));
  hooks.EndJob();
}

TEST(ChiefHooksTest, StopAtNextStepReturnsAtOnceWithNoJobRunning) {
  const std::string dir = std::string(getenv("TEST_TMPDIR")) + "/idle";
  std::filesystem::remove_all(dir);
  auto store = JobStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  FakePsControl ps(0);
  Checkpointer checkpointer({&ps}, **store);
  ChiefHooks hooks(**store, checkpointer);
  // A wait of an hour would time the test out: it must return at once.
  ChiefHooks::StopResult result = hooks.StopAtNextStep(absl::Hours(1));
  EXPECT_FALSE(result.reached);
  EXPECT_EQ(ps.saves(), 0);
}

}  // namespace
}  // namespace towerps::worker
