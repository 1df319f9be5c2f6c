#include "common/cancellation.h"

#include <atomic>
#include <thread>

#include "gtest/gtest.h"

namespace towerps::common {
namespace {

TEST(CancellationTokenTest, StartsUncancelledAndChecksOk) {
  CancellationToken token;
  EXPECT_FALSE(token.cancelled());
  EXPECT_TRUE(token.Check("pull").ok());
  EXPECT_FALSE(token.WaitFor(absl::Milliseconds(1)));
}

TEST(CancellationTokenTest, CancelKeepsFirstReasonAndNamesWhat) {
  CancellationToken token;
  token.Cancel("job cancelled by user");
  token.Cancel("second reason");
  EXPECT_TRUE(token.cancelled());
  const absl::Status st = token.Check("pull from ps 1");
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(st.message(), "pull from ps 1: job cancelled by user");
  EXPECT_EQ(token.Check().message(), "job cancelled by user");
  EXPECT_TRUE(token.WaitFor(absl::Hours(1)));  // returns at once
}

TEST(CancellationTokenTest, CallbacksRunOnceAndRemovedOnesNever) {
  CancellationToken token;
  int a = 0, b = 0;
  const int64_t ida = token.AddCallback([&] { ++a; });
  const int64_t idb = token.AddCallback([&] { ++b; });
  token.RemoveCallback(idb);
  token.Cancel();
  token.Cancel();
  EXPECT_EQ(a, 1);
  EXPECT_EQ(b, 0);
  token.RemoveCallback(ida);  // after it ran: no effect, no wait
  int c = 0;
  EXPECT_EQ(token.AddCallback([&] { ++c; }), -1);  // already cancelled: runs now
  EXPECT_EQ(c, 1);
}

TEST(CancellationTokenTest, CallbackMayRemoveItselfAndOthers) {
  CancellationToken token;
  int64_t self = -1, other = -1;
  int ran = 0;
  self = token.AddCallback([&] {
    ++ran;
    token.RemoveCallback(self);
    token.RemoveCallback(other);
  });
  other = token.AddCallback([&] { ++ran; });
  token.Cancel();  // must not deadlock
  EXPECT_GE(ran, 1);
}

TEST(CancellationTokenTest, WaitForWakesWhenCancelledFromAnotherThread) {
  CancellationToken token;
  std::atomic<bool> woke{false};
  std::thread waiter([&] { woke = token.WaitFor(absl::Hours(1)); });
  token.Cancel("stop");
  waiter.join();
  EXPECT_TRUE(woke);
}

TEST(CancellationTokenTest, RemoveWaitsForARunningCallback) {
  CancellationToken token;
  std::atomic<bool> entered{false}, finished{false};
  const int64_t id = token.AddCallback([&] {
    entered = true;
    absl::SleepFor(absl::Milliseconds(50));
    finished = true;
  });
  std::thread canceller([&] { token.Cancel(); });
  while (!entered) absl::SleepFor(absl::Milliseconds(1));
  token.RemoveCallback(id);
  EXPECT_TRUE(finished);  // RemoveCallback returned only after the callback did
  canceller.join();
}

// A callback added while another thread cancels either runs later from
// Cancel(), or runs at once in AddCallback, and then cancelled() is already
// true: the waiter that registered it to be woken (and then checks
// cancelled() before sleeping) can never miss the wake-up. Before the fix
// the second case could see cancelled() still false.
TEST(CancellationTokenTest, ACallbackRunAtOnceSeesTheTokenCancelled) {
  for (int i = 0; i < 2000; ++i) {
    CancellationToken token;
    std::atomic<bool> go{false};
    std::thread canceller([&] {
      while (!go.load()) {
      }
      token.Cancel("stop");
    });
    go.store(true);
    std::atomic<bool> ran{false};
    const int64_t id = token.AddCallback([&] { ran.store(true); });
    if (id < 0) {
      ASSERT_TRUE(token.cancelled()) << "iteration " << i;
    }
    canceller.join();
    EXPECT_TRUE(ran.load()) << "iteration " << i;  // one way or the other
  }
}

TEST(ScopedCancellationCallbackTest, UnregistersOnScopeExitAndAcceptsNull) {
  CancellationToken token;
  int n = 0;
  { ScopedCancellationCallback scoped(&token, [&] { ++n; }); }
  { ScopedCancellationCallback none(nullptr, [&] { ++n; }); }
  token.Cancel();
  EXPECT_EQ(n, 0);
}

TEST(ScopedCancellationCallbackTest, RegistersThroughAConstToken) {
  // A callee holds the token as const (it may not cancel) and still hears.
  CancellationToken token;
  const CancellationToken* view = &token;
  int n = 0;
  {
    ScopedCancellationCallback scoped(view, [&] { ++n; });
    token.Cancel();
  }
  EXPECT_EQ(n, 1);
}

}  // namespace
}  // namespace towerps::common
