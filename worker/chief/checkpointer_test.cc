// Checkpoints through fake servers: the manifest names a complete one, a
// ps that cannot save fails it, and the schedule decides when.
#include "worker/chief/checkpointer.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>

#include "common/job_spec.h"
#include "common/storage/checkpoint.h"
#include "gtest/gtest.h"
#include "worker/chief/fake_ps_control.h"

namespace towerps::worker {
namespace {

class CheckpointerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::string(getenv("TEST_TMPDIR")) + "/" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    auto store = JobStore::Open(dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    v1::JobSpec spec = JobWithDefaults(*BuiltinJob("dense_stack"));
    spec.set_job_id("j");
    auto added = store_->Add(spec);
    ASSERT_TRUE(added.ok()) << added.status();
    spec_ = added->spec();
    for (int p = 0; p < 2; ++p) {
      ps_.push_back(std::make_unique<FakePsControl>(p));
      ps_[p]->SetJob("j", 20);
    }
  }

  Checkpointer Make() { return Checkpointer({ps_[0].get(), ps_[1].get()}, *store_); }

  std::string dir_;
  std::unique_ptr<JobStore> store_;
  v1::JobSpec spec_;
  std::vector<std::unique_ptr<FakePsControl>> ps_;
};

TEST_F(CheckpointerTest, SaveNamesTheCheckpointInTheManifest) {
  Checkpointer c = Make();
  absl::Status st = c.Save("j", spec_, 20);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(ps_[0]->saves(), 1);
  EXPECT_EQ(ps_[1]->saves(), 1);
  auto manifest = common::ReadManifest(spec_.checkpoint().dir());
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  ASSERT_EQ(manifest->size(), 1u);
  EXPECT_EQ((*manifest)[0].step, 20);
  EXPECT_EQ((*manifest)[0].num_ps, 2);
  EXPECT_EQ(store_->Get("j")->checkpoint_step(), 20);
}

TEST_F(CheckpointerTest, ADamagedManifestIsRebuiltAndTheJobsEventsSaySo) {
  Checkpointer c = Make();
  ASSERT_TRUE(c.Save("j", spec_, 20).ok());
  const std::string manifest = spec_.checkpoint().dir() + "/MANIFEST";
  std::string bytes;
  {
    std::ifstream in(manifest, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_FALSE(bytes.empty());
  bytes[bytes.size() / 2] ^= 0x01;
  std::ofstream(manifest, std::ios::binary | std::ios::trunc) << bytes;
  ASSERT_EQ(common::ReadManifest(spec_.checkpoint().dir()).status().code(),
            absl::StatusCode::kDataLoss);
  ps_[0]->SetJob("j", 30);
  ps_[1]->SetJob("j", 30);
  absl::Status st = c.Save("j", spec_, 30);
  ASSERT_TRUE(st.ok()) << st;  // checkpointing goes on
  auto m = common::ReadManifest(spec_.checkpoint().dir());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->back().step, 30);
  EXPECT_EQ(store_->Get("j")->checkpoint_step(), 30);
  auto events = store_->EventsAfter("j", 0, absl::ZeroDuration());
  ASSERT_TRUE(events.ok()) << events.status();
  bool said = false;
  for (const auto& e : events->events) {
    said |= e.message().find("checkpoint ckpt-0000000030: MANIFEST damaged (") == 0 &&
            e.message().find("rebuilt from the intact checkpoints on disk") != std::string::npos;
  }
  EXPECT_TRUE(said);
}

TEST_F(CheckpointerTest, APsThatCannotSaveFailsTheCheckpoint) {
  ps_[1]->SetUnreachable(true);
  Checkpointer c = Make();
  absl::Status st = c.Save("j", spec_, 20);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_EQ(st.message(), "ps 1: ps 1 unreachable");
  EXPECT_FALSE(common::ReadManifest(spec_.checkpoint().dir()).ok());
  EXPECT_EQ(store_->Get("j")->checkpoint_step(), -1);
}

TEST_F(CheckpointerTest, AFailedSaveRemovesThePartialDirectory) {
  // ps 0 wrote its shard, ps 1 cannot.
  const std::string partial = spec_.checkpoint().dir() + "/ckpt-0000000020";
  std::filesystem::create_directories(partial);
  std::ofstream(partial + "/shard-0-of-2") << "ps 0's shard";
  ps_[1]->SetUnreachable(true);
  Checkpointer c = Make();
  EXPECT_FALSE(c.Save("j", spec_, 20).ok());
  EXPECT_FALSE(std::filesystem::exists(partial));
  auto events = store_->EventsAfter("j", 0, absl::ZeroDuration());
  ASSERT_TRUE(events.ok());
  ASSERT_FALSE(events->events.empty());
  EXPECT_EQ(events->events.back().message(),
            "checkpoint ckpt-0000000020 incomplete: removed " + partial);
  // A checkpoint the MANIFEST lists is never removed by a failed retry.
  ps_[1]->SetUnreachable(false);
  ASSERT_TRUE(c.Save("j", spec_, 20).ok());
  std::filesystem::create_directories(partial);
  ps_[1]->SetUnreachable(true);
  EXPECT_FALSE(c.Save("j", spec_, 20).ok());
  EXPECT_TRUE(std::filesystem::exists(partial));
}

TEST_F(CheckpointerTest, PeriodicFailuresTryAgainThenFailTheTraining) {
  spec_.mutable_checkpoint()->set_every_steps(10);
  spec_.mutable_checkpoint()->set_every_seconds(0);
  Checkpointer c = Make();
  Checkpointer::Schedule schedule;
  ps_[1]->SetUnreachable(true);
  EXPECT_TRUE(c.MaybeSave("j", spec_, 10, schedule).ok());
  EXPECT_TRUE(c.MaybeSave("j", spec_, 20, schedule).ok());
  ps_[1]->SetUnreachable(false);
  EXPECT_TRUE(c.MaybeSave("j", spec_, 30, schedule).ok());  // resets the count
  ps_[1]->SetUnreachable(true);
  EXPECT_TRUE(c.MaybeSave("j", spec_, 40, schedule).ok());
  EXPECT_TRUE(c.MaybeSave("j", spec_, 50, schedule).ok());
  absl::Status st = c.MaybeSave("j", spec_, 60, schedule);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_EQ(st.message(), "checkpoint at step 60 failed 3 times in a row: ps 1: ps 1 unreachable");
  auto events = store_->EventsAfter("j", 0, absl::ZeroDuration());
  ASSERT_TRUE(events.ok());
  bool said = false;
  for (const auto& e : events->events) {
    said |= e.message() ==
            "checkpoint at step 40 failed (1 of 3 in a row; the next one tries again): ps 1: ps 1 "
            "unreachable";
  }
  EXPECT_TRUE(said);
}

TEST_F(CheckpointerTest, MaybeSaveFollowsEverySteps) {
  spec_.mutable_checkpoint()->set_every_steps(10);
  spec_.mutable_checkpoint()->set_every_seconds(0);
  Checkpointer c = Make();
  Checkpointer::Schedule schedule;
  EXPECT_TRUE(c.MaybeSave("j", spec_, 5, schedule).ok());
  EXPECT_EQ(ps_[0]->saves(), 0);
  EXPECT_TRUE(c.MaybeSave("j", spec_, 10, schedule).ok());
  EXPECT_TRUE(c.MaybeSave("j", spec_, 10, schedule).ok());  // Once per step.
  EXPECT_EQ(ps_[0]->saves(), 1);
  spec_.mutable_checkpoint()->set_disabled(true);
  EXPECT_TRUE(c.MaybeSave("j", spec_, 20, schedule).ok());
  EXPECT_EQ(ps_[0]->saves(), 1);
}

}  // namespace
}  // namespace towerps::worker
