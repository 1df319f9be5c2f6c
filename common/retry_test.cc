#include "common/retry.h"

#include <thread>

#include "gtest/gtest.h"

namespace towerps::common {
namespace {

RetryPolicy Fast() {
  RetryPolicy p;
  p.initial_backoff = absl::Microseconds(100);
  p.max_backoff = absl::Milliseconds(1);
  return p;
}

TEST(RetryPolicyTest, DefaultRetriesTransportCodesOnly) {
  const RetryPolicy p;
  EXPECT_TRUE(p.IsRetryable(absl::UnavailableError("down")));
  EXPECT_TRUE(p.IsRetryable(absl::DeadlineExceededError("slow")));
  EXPECT_FALSE(p.IsRetryable(absl::OkStatus()));
  EXPECT_FALSE(p.IsRetryable(absl::AbortedError("lost worker")));
  EXPECT_FALSE(p.IsRetryable(absl::NotFoundError("no job")));
  EXPECT_FALSE(p.IsRetryable(absl::InvalidArgumentError("bad")));
  const RetryPolicy q = p.RetryingOn({absl::StatusCode::kAborted});
  EXPECT_TRUE(q.IsRetryable(absl::AbortedError("x")));
  EXPECT_FALSE(q.IsRetryable(absl::UnavailableError("x")));
}

TEST(RetryTest, RetriesUntilSuccess) {
  int calls = 0;
  const absl::Status st = Retry(Fast(), nullptr, [&] {
    return ++calls < 4 ? absl::UnavailableError("down") : absl::OkStatus();
  });
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(calls, 4);
}

TEST(RetryTest, NonRetryableErrorIsReturnedAtOnce) {
  int calls = 0;
  const absl::Status st = Retry(Fast(), nullptr, [&] {
    ++calls;
    return absl::InvalidArgumentError("bad shape");
  });
  EXPECT_EQ(st, absl::InvalidArgumentError("bad shape"));
  EXPECT_EQ(calls, 1);
}

TEST(RetryTest, MaxAttemptsCountsTheFirst) {
  int calls = 0;
  const absl::Status st = Retry(Fast().WithMaxAttempts(3), nullptr, [&] {
    ++calls;
    return absl::UnavailableError("down");
  });
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(calls, 3);
}

TEST(RetryTest, DeadlineGivesUpNamingTheLastError) {
  const absl::Status st = Retry(Fast().WithDeadline(absl::Milliseconds(20)), nullptr,
                                [] { return absl::UnavailableError("ps 1 is down"); });
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(st.message().find("gave up after 20ms"), absl::string_view::npos) << st;
  EXPECT_NE(st.message().find("ps 1 is down"), absl::string_view::npos) << st;
}

TEST(RetryTest, CancellationStopsTheWait) {
  CancellationToken token;
  RetryPolicy slow;
  slow.initial_backoff = slow.max_backoff = absl::Hours(1);
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(20));
    token.Cancel("job cancelled");
  });
  int calls = 0;
  const absl::Status st = Retry(slow, &token, [&] {
    ++calls;
    return absl::UnavailableError("down");
  });
  canceller.join();
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(st.message(), "job cancelled");
  EXPECT_EQ(calls, 1);
}

TEST(BackoffTest, DelaysGrowToTheCapWithinTheJitter) {
  RetryPolicy p;
  p.initial_backoff = absl::Milliseconds(100);
  p.max_backoff = absl::Milliseconds(400);
  p.multiplier = 2;
  Backoff b(p);
  EXPECT_EQ(b.next_delay(), absl::Milliseconds(100));
  // Pause() advances the schedule; Reset() goes back.
  CancellationToken cancelled;
  cancelled.Cancel();
  Backoff c(p, &cancelled);
  EXPECT_EQ(c.Pause().code(), absl::StatusCode::kCancelled);  // no wait
  EXPECT_EQ(c.next_delay(), absl::Milliseconds(200));
  EXPECT_EQ(c.Pause().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(c.next_delay(), absl::Milliseconds(400));
  EXPECT_EQ(c.Pause().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(c.next_delay(), absl::Milliseconds(400));  // capped
  c.Reset();
  EXPECT_EQ(c.next_delay(), absl::Milliseconds(100));
}

TEST(BackoffTest, JitteredWaitStaysInItsBand) {
  RetryPolicy p;
  p.initial_backoff = p.max_backoff = absl::Milliseconds(20);
  p.jitter = 0.5;  // [10, 30] ms
  Backoff b(p);
  const absl::Time t0 = absl::Now();
  ASSERT_TRUE(b.Wait(absl::UnavailableError("x")).ok());
  // A sleep never ends early; only its lower bound is checked (an upper bound
  // would be a timing assertion on a shared machine).
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(10));
  EXPECT_EQ(b.attempts(), 1);
}

TEST(BackoffTest, AgainAtOnceDecidesWithoutWaitingOrGrowing) {
  RetryPolicy p;
  p.initial_backoff = p.max_backoff = absl::Hours(1);
  p.deadline = absl::Milliseconds(20);
  Backoff b(p);
  EXPECT_TRUE(b.AgainAtOnce(absl::DeadlineExceededError("step wait ran out")).ok());
  EXPECT_EQ(b.next_delay(), absl::Hours(1));
  EXPECT_EQ(b.AgainAtOnce(absl::AbortedError("lost worker")).code(),
            absl::StatusCode::kAborted);
  absl::SleepFor(absl::Milliseconds(30));
  const absl::Status st = b.AgainAtOnce(absl::DeadlineExceededError("step wait ran out"));
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(st.message().find("gave up after 20ms (3 attempts)"), absl::string_view::npos) << st;
  CancellationToken cancelled;
  cancelled.Cancel("job cancelled");
  Backoff c(p, &cancelled);
  EXPECT_EQ(c.AgainAtOnce(absl::UnavailableError("down")), absl::CancelledError("job cancelled"));
}

}  // namespace
}  // namespace towerps::common
