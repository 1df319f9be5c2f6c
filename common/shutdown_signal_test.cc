#include "common/shutdown_signal.h"

#include <signal.h>
#include <unistd.h>

#include <thread>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace towerps::common {
namespace {

// kill(), not raise(): the signal goes to the process, and the kernel picks
// any thread that does not block it, as it does for `kill -TERM <pid>`.
void SignalProcessFromAnotherThread(int sig) {
  std::thread t([sig] { kill(getpid(), sig); });
  t.join();
}

TEST(ShutdownSignalTest, WaiterWakesAndReportsTheSignal) {
  auto stop = ShutdownSignal::Install();
  ASSERT_TRUE(stop.ok()) << stop.status();
  int got = 0;
  std::thread waiter([&] { got = (*stop)->Wait(); });
  SignalProcessFromAnotherThread(SIGTERM);
  waiter.join();
  EXPECT_EQ(got, SIGTERM);
}

TEST(ShutdownSignalTest, ReleaseWakesTheWaiterWithZero) {
  auto stop = ShutdownSignal::Install();
  ASSERT_TRUE(stop.ok()) << stop.status();
  int got = -1;
  std::thread waiter([&] { got = (*stop)->Wait(); });
  (*stop)->Release();
  waiter.join();
  EXPECT_EQ(got, 0);
  // A signal after the release is still caught (the process lives) and
  // changes nothing.
  SignalProcessFromAnotherThread(SIGTERM);
  EXPECT_EQ((*stop)->Wait(), 0);
}

TEST(ShutdownSignalTest, ASignalBeforeReleaseWins) {
  auto stop = ShutdownSignal::Install();
  ASSERT_TRUE(stop.ok()) << stop.status();
  SignalProcessFromAnotherThread(SIGINT);
  (*stop)->Release();
  EXPECT_EQ((*stop)->Wait(), SIGINT);
}

TEST(ShutdownSignalTest, ReportsSigint) {
  auto stop = ShutdownSignal::Install();
  ASSERT_TRUE(stop.ok()) << stop.status();
  SignalProcessFromAnotherThread(SIGINT);
  EXPECT_EQ((*stop)->Wait(), SIGINT);
}

TEST(ShutdownSignalTest, RepeatedSignalsDoNotKillAndTheFirstIsKept) {
  auto stop = ShutdownSignal::Install();
  ASSERT_TRUE(stop.ok()) << stop.status();
  SignalProcessFromAnotherThread(SIGTERM);
  SignalProcessFromAnotherThread(SIGTERM);
  SignalProcessFromAnotherThread(SIGINT);
  // A signal landing on a thread that never blocked anything (as OpenBLAS's
  // threads do) reaches the handler too.
  std::thread bystander([] { pthread_kill(pthread_self(), SIGTERM); });
  bystander.join();
  EXPECT_EQ((*stop)->Wait(), SIGTERM);
  EXPECT_EQ((*stop)->Wait(), SIGTERM);  // later calls: the same, at once
}

TEST(ShutdownSignalTest, SignalsAfterDestructionAreIgnored) {
  {
    auto stop = ShutdownSignal::Install();
    ASSERT_TRUE(stop.ok()) << stop.status();
  }
  SignalProcessFromAnotherThread(SIGTERM);  // would end the test binary if not ignored
  SUCCEED();
}

TEST(ShutdownSignalTest, OnlyOneAtATime) {
  auto first = ShutdownSignal::Install();
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = ShutdownSignal::Install();
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace towerps::common
