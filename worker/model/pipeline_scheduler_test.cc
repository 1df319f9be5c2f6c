#include "worker/model/pipeline_scheduler.h"

#include <map>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace towerps::worker {
namespace {

// What the steps did, in the order they started, and on which threads.
class Recorder {
 public:
  struct Event {
    bool forward;
    int stage, micro_batch;
    std::thread::id thread;
  };

  PipelineScheduler::Step Forward() {
    return [this](int s, int k) { return Record(true, s, k); };
  }
  PipelineScheduler::Step Backward() {
    return [this](int s, int k) { return Record(false, s, k); };
  }
  // The step that answers `status` instead of OK.
  void FailAt(bool forward, int s, int k, absl::Status status) {
    absl::MutexLock lock(&mu_);
    failures_[{forward, s, k}] = std::move(status);
  }
  std::vector<Event> events() {
    absl::MutexLock lock(&mu_);
    return events_;
  }

 private:
  absl::Status Record(bool forward, int s, int k) {
    absl::MutexLock lock(&mu_);
    events_.push_back({forward, s, k, std::this_thread::get_id()});
    auto it = failures_.find({forward, s, k});
    return it == failures_.end() ? absl::OkStatus() : it->second;
  }

  absl::Mutex mu_;
  std::vector<Event> events_ ABSL_GUARDED_BY(mu_);
  std::map<std::tuple<bool, int, int>, absl::Status> failures_ ABSL_GUARDED_BY(mu_);
};

std::vector<std::string> Names(const std::vector<Recorder::Event>& events) {
  std::vector<std::string> out;
  for (const auto& e : events) {
    out.push_back(absl::StrCat(e.forward ? "F" : "B", e.stage, ".", e.micro_batch));
  }
  return out;
}

// Position of each step in `events`.
std::map<std::string, size_t> Positions(const std::vector<Recorder::Event>& events) {
  std::map<std::string, size_t> at;
  const auto names = Names(events);
  for (size_t i = 0; i < names.size(); ++i) at[names[i]] = i;
  return at;
}

TEST(PipelineSchedulerTest, OneStageRunsEachMicroBatchForwardThenBackwardOnTheCaller) {
  Recorder r;
  PipelineScheduler pipeline(1, 3);
  ASSERT_TRUE(pipeline.Run(r.Forward(), r.Backward()).ok());
  EXPECT_EQ(Names(r.events()),
            (std::vector<std::string>{"F0.0", "B0.0", "F0.1", "B0.1", "F0.2", "B0.2"}));
  for (const auto& e : r.events()) EXPECT_EQ(e.thread, std::this_thread::get_id());
}

TEST(PipelineSchedulerTest, OneMicroBatchRunsThroughTheStagesOnTheCaller) {
  Recorder r;
  PipelineScheduler pipeline(3, 1);
  ASSERT_TRUE(pipeline.Run(r.Forward(), r.Backward()).ok());
  EXPECT_EQ(Names(r.events()),
            (std::vector<std::string>{"F0.0", "F1.0", "F2.0", "B2.0", "B1.0", "B0.0"}));
  for (const auto& e : r.events()) EXPECT_EQ(e.thread, std::this_thread::get_id());
}

TEST(PipelineSchedulerTest, WithoutBackwardRunsForwardOnly) {
  Recorder r;
  PipelineScheduler pipeline(2, 1);
  ASSERT_TRUE(pipeline.Run(r.Forward(), nullptr).ok());
  EXPECT_EQ(Names(r.events()), (std::vector<std::string>{"F0.0", "F1.0"}));
}

TEST(PipelineSchedulerTest, StagesRunOnTheirOwnThreadsInGPipeOrder) {
  constexpr int kStages = 3, kMicro = 4;
  for (int round = 0; round < 20; ++round) {
    Recorder r;
    PipelineScheduler pipeline(kStages, kMicro);
    ASSERT_TRUE(pipeline.Run(r.Forward(), r.Backward()).ok());
    const auto events = r.events();
    ASSERT_EQ(events.size(), 2u * kStages * kMicro);
    auto at = Positions(events);
    std::map<int, std::set<std::thread::id>> threads;
    for (const auto& e : events) threads[e.stage].insert(e.thread);
    std::set<std::thread::id> all;
    for (int s = 0; s < kStages; ++s) {
      ASSERT_EQ(threads[s].size(), 1u) << "stage " << s;
      EXPECT_NE(*threads[s].begin(), std::this_thread::get_id());
      all.insert(*threads[s].begin());
      for (int k = 0; k < kMicro; ++k) {
        const std::string f = absl::StrCat("F", s, ".", k);
        const std::string b = absl::StrCat("B", s, ".", k);
        if (s > 0) {
          EXPECT_LT(at[absl::StrCat("F", s - 1, ".", k)], at[f]);
        }
        if (s + 1 < kStages) {
          EXPECT_LT(at[absl::StrCat("B", s + 1, ".", k)], at[b]);
        }
        if (k > 0) {
          EXPECT_LT(at[absl::StrCat("F", s, ".", k - 1)], at[f]);
          EXPECT_LT(at[absl::StrCat("B", s, ".", k - 1)], at[b]);
        }
        // Every forward step of the stage before any backward one.
        EXPECT_LT(at[absl::StrCat("F", s, ".", kMicro - 1)], at[b]);
      }
    }
    EXPECT_EQ(all.size(), static_cast<size_t>(kStages));
  }
}

TEST(PipelineSchedulerTest, AFailedStepStopsTheRunAndIsReturned) {
  Recorder r;
  r.FailAt(/*forward=*/true, 1, 2, absl::ResourceExhaustedError("stage 1 full"));
  PipelineScheduler pipeline(3, 4);
  const absl::Status st = pipeline.Run(r.Forward(), r.Backward());
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(st.message(), "stage 1 full");
  auto at = Positions(r.events());
  EXPECT_EQ(at.count("F2.2"), 0u);  // never got its input
  EXPECT_EQ(at.count("F1.3"), 0u);
  for (const auto& e : r.events()) EXPECT_TRUE(e.forward);
}

TEST(PipelineSchedulerTest, TheLowestFailedStageWins) {
  Recorder r;
  r.FailAt(/*forward=*/false, 0, 0, absl::InternalError("stage 0"));
  r.FailAt(/*forward=*/false, 1, 0, absl::InternalError("stage 1"));
  PipelineScheduler pipeline(2, 2);
  // Stage 1 fails first; stage 0 never starts its backward pass.
  const absl::Status st = pipeline.Run(r.Forward(), r.Backward());
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(st.message(), "stage 1");
}

TEST(PipelineSchedulerTest, ErrorOnTheCallerStopsAtOnce) {
  Recorder r;
  r.FailAt(/*forward=*/true, 0, 1, absl::InvalidArgumentError("bad"));
  PipelineScheduler pipeline(1, 3);
  EXPECT_EQ(pipeline.Run(r.Forward(), r.Backward()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Names(r.events()), (std::vector<std::string>{"F0.0", "B0.0", "F0.1"}));
}

TEST(PipelineSchedulerTest, RunsAgain) {
  PipelineScheduler pipeline(2, 3);
  for (int i = 0; i < 3; ++i) {
    Recorder r;
    ASSERT_TRUE(pipeline.Run(r.Forward(), r.Backward()).ok());
    EXPECT_EQ(r.events().size(), 12u);
  }
}

}  // namespace
}  // namespace towerps::worker
