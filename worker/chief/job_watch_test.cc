// Watch: the events after after_seq, and following until the job ends.
#include "worker/chief/job_watch.h"

#include <filesystem>
#include <thread>

#include "common/job_spec.h"
#include "gtest/gtest.h"

namespace towerps::worker {
namespace {

class JobWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = std::string(getenv("TEST_TMPDIR")) + "/watch";
    std::filesystem::remove_all(dir);
    auto store = JobStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    v1::JobSpec spec = JobWithDefaults(*BuiltinJob("dense_stack"));
    spec.set_job_id("j");
    ASSERT_TRUE(store_->Add(spec).ok());             // seq 1: QUEUED
    store_->AddEvent("j", v1::JobEvent::LOG, "two");    // seq 2
    store_->AddEvent("j", v1::JobEvent::LOG, "three");  // seq 3
  }

  std::unique_ptr<JobStore> store_;
};

TEST_F(JobWatchTest, SendsTheEventsAfterAfterSeq) {
  std::vector<int64_t> seqs;
  absl::Status st = WatchJob(*store_, "j", 1, /*follow=*/false,
                             [&](const v1::JobEvent& e) {
                               seqs.push_back(e.seq());
                               return true;
                             },
                             nullptr);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(seqs, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(WatchJob(*store_, "nope", 0, false, [](const v1::JobEvent&) { return true; }, nullptr)
                .code(),
            absl::StatusCode::kNotFound);
}

TEST_F(JobWatchTest, FollowsUntilTheJobEnds) {
  std::vector<std::string> messages;
  std::thread producer([&] {
    store_->AddEvent("j", v1::JobEvent::LOG, "four");
    ASSERT_TRUE(store_->RequestCancel("j").ok());  // Queued: ends at once.
  });
  absl::Status st = WatchJob(*store_, "j", 3, /*follow=*/true,
                             [&](const v1::JobEvent& e) {
                               messages.push_back(e.message());
                               return true;
                             },
                             nullptr, absl::Seconds(30));
  producer.join();
  EXPECT_TRUE(st.ok()) << st;
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_EQ(messages[0], "four");
  EXPECT_EQ(messages[1], "cancelled while queued");
}

TEST_F(JobWatchTest, StopsWhenTheClientGoesAway) {
  int calls = 0;
  absl::Status st = WatchJob(*store_, "j", 0, /*follow=*/true,
                             [&](const v1::JobEvent&) { return ++calls < 2; }, nullptr);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(calls, 2);
  // stop() ends a follow on a job that goes on.
  st = WatchJob(*store_, "j", 3, true, [](const v1::JobEvent&) { return true; },
                [] { return true; }, absl::Milliseconds(1));
  EXPECT_TRUE(st.ok()) << st;
}

}  // namespace
}  // namespace towerps::worker
