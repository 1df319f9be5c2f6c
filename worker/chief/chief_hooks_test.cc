// The chief's own worker's callbacks land in the job's record and events.
#include "worker/chief/chief_hooks.h"

#include <filesystem>
#include <memory>

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

}  // namespace
}  // namespace towerps::worker
