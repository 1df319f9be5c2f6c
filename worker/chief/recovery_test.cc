// The restart decision: which failures restart a job, how many times.
#include "worker/chief/recovery.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

#include "gtest/gtest.h"

namespace towerps::worker {
namespace {

v1::JobSpec WithRestarts(int n) {
  v1::JobSpec spec;
  spec.set_max_restarts(n);
  return spec;
}

TEST(RecoveryTest, RetryableCodes) {
  common::RetryPolicy p = RestartPolicy(WithRestarts(2), absl::Milliseconds(1));
  EXPECT_TRUE(p.IsRetryable(absl::UnavailableError("")));
  EXPECT_TRUE(p.IsRetryable(absl::NotFoundError("")));
  EXPECT_TRUE(p.IsRetryable(absl::AbortedError("")));
  EXPECT_TRUE(p.IsRetryable(absl::DeadlineExceededError("")));
  EXPECT_FALSE(p.IsRetryable(absl::InvalidArgumentError("")));
  EXPECT_FALSE(p.IsRetryable(absl::CancelledError("")));
  EXPECT_EQ(p.max_attempts, 3);
  EXPECT_EQ(RestartPolicy(WithRestarts(0), absl::Milliseconds(1)).max_attempts, 1);
  // Restarts used by earlier chiefs leave fewer, never fewer than one attempt.
  EXPECT_EQ(RestartPolicy(WithRestarts(2), absl::Milliseconds(1), 1).max_attempts, 2);
  EXPECT_EQ(RestartPolicy(WithRestarts(2), absl::Milliseconds(1), 5).max_attempts, 1);
}

TEST(RecoveryTest, AttemptNumbersGoOnFromFirstAttempt) {
  std::vector<int> seen, restarts;
  absl::Status st = RunWithRestarts(
      RestartPolicy(WithRestarts(3), absl::Milliseconds(1), /*restarts_used=*/2), nullptr,
      [&](int n) {
        seen.push_back(n);
        return absl::UnavailableError("down");
      },
      [&](int, const absl::Status&, int k) { restarts.push_back(k); },
      /*first_attempt=*/4);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(seen, (std::vector<int>{4, 5}));  // one restart left of 3
  EXPECT_EQ(restarts, (std::vector<int>{1}));
}

TEST(RecoveryTest, RestartsUpToMaxRestartsThenReturnsTheLastFailure) {
  std::vector<int> restarts;
  int attempts = 0;
  absl::Status st = RunWithRestarts(
      RestartPolicy(WithRestarts(2), absl::Milliseconds(1)), nullptr,
      [&](int n) {
        attempts = n;
        return absl::UnavailableError(absl::StrCat("ps 0 lost in attempt ", n));
      },
      [&](int, const absl::Status&, int restart) { restarts.push_back(restart); });
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(st.message(), "ps 0 lost in attempt 3");
  EXPECT_EQ(attempts, 3);
  EXPECT_EQ(restarts, (std::vector<int>{1, 2}));
}

TEST(RecoveryTest, ANonRetryableFailureEndsAtOnce) {
  int attempts = 0;
  absl::Status st = RunWithRestarts(
      RestartPolicy(WithRestarts(5), absl::Milliseconds(1)), nullptr,
      [&](int n) {
        attempts = n;
        return absl::InvalidArgumentError("bad model");
      },
      nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(attempts, 1);
}

TEST(RecoveryTest, SucceedsAfterARestart) {
  absl::Status st = RunWithRestarts(
      RestartPolicy(WithRestarts(1), absl::Milliseconds(1)), nullptr,
      [&](int n) { return n == 1 ? absl::AbortedError("worker 1 stopped") : absl::OkStatus(); },
      nullptr);
  EXPECT_TRUE(st.ok()) << st;
}

TEST(RecoveryTest, ACancelledAttemptWithoutTheTokenRestarts) {
  common::CancellationToken cancel;
  int attempts = 0;
  absl::Status st = RunWithRestarts(
      RestartPolicy(WithRestarts(2), absl::Milliseconds(1)), &cancel,
      [&](int n) {
        attempts = n;
        return n == 1 ? absl::CancelledError("ps 0 stopping") : absl::OkStatus();
      },
      nullptr);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(attempts, 2);
}

TEST(RecoveryTest, PeerCancelIsAFailureUnlessTheOwnTokenFired) {
  common::CancellationToken own;
  absl::Status peer = PeerCancelIsAFailure(absl::CancelledError("ps 0 stopping"), &own);
  EXPECT_EQ(peer.code(), absl::StatusCode::kUnavailable) << peer;
  EXPECT_NE(peer.message().find("ps 0 stopping"), std::string::npos) << peer;
  EXPECT_EQ(PeerCancelIsAFailure(absl::CancelledError("x"), nullptr).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(PeerCancelIsAFailure(absl::InvalidArgumentError("x"), &own).code(),
            absl::StatusCode::kInvalidArgument);
  own.Cancel("cancelled by user");
  EXPECT_EQ(PeerCancelIsAFailure(absl::CancelledError("x"), &own).code(),
            absl::StatusCode::kCancelled);
}

TEST(RecoveryTest, ACancelDuringTheBackoffEndsIt) {
  common::CancellationToken cancel;
  int attempts = 0;
  absl::Status st = RunWithRestarts(
      RestartPolicy(WithRestarts(5), absl::Hours(1)), &cancel,
      [&](int n) {
        attempts = n;
        cancel.Cancel("cancelled by user");
        return absl::UnavailableError("lost");
      },
      nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
  EXPECT_EQ(attempts, 1);
}

TEST(RecoveryTest, RestorePoint) {
  v1::JobSpec spec;
  spec.mutable_checkpoint()->set_dir(std::string(getenv("TEST_TMPDIR")) + "/none");
  std::vector<std::string> lines;
  auto log = [&](const std::string& l) { lines.push_back(l); };
  RestorePoint first = ChooseRestorePoint(spec, 1, log);
  EXPECT_EQ(first.dir, "");
  EXPECT_TRUE(lines.empty());
  RestorePoint second = ChooseRestorePoint(spec, 2, log);
  EXPECT_EQ(second.dir, "");
  EXPECT_EQ(second.step, -1);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("starting from the initializers"), std::string::npos) << lines[0];
}

}  // namespace
}  // namespace towerps::worker
