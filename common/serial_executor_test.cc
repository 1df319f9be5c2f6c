#include "common/serial_executor.h"

#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace towerps::common {
namespace {

TEST(SerialExecutorTest, RunsClosuresInOrderOnOneOtherThread) {
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  absl::Notification done;
  {
    SerialExecutor ex;
    for (int i = 0; i < 100; ++i) {
      // No lock: closures never overlap, and the destructor joins.
      ex.Schedule([&order, &threads, i] {
        order.push_back(i);
        threads.push_back(std::this_thread::get_id());
      });
    }
  }
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
  for (const auto& id : threads) {
    EXPECT_EQ(id, threads[0]);
    EXPECT_NE(id, std::this_thread::get_id());
  }
}

TEST(SerialExecutorTest, ScheduleDoesNotWaitForTheClosure) {
  SerialExecutor ex;
  absl::Notification release, ran;
  ex.Schedule([&] { release.WaitForNotification(); });
  ex.Schedule([&] { ran.Notify(); });
  // Both scheduled while the first blocks: Schedule returned without waiting.
  EXPECT_FALSE(ran.HasBeenNotified());
  release.Notify();
  ran.WaitForNotification();
}

TEST(SerialExecutorTest, DestructorRunsWhatIsStillScheduled) {
  absl::Mutex mu;
  int count = 0;
  absl::Notification release;
  {
    SerialExecutor ex;
    ex.Schedule([&] { release.WaitForNotification(); });
    for (int i = 0; i < 10; ++i) {
      ex.Schedule([&] {
        absl::MutexLock lock(&mu);
        ++count;
      });
    }
    release.Notify();
  }
  absl::MutexLock lock(&mu);
  EXPECT_EQ(count, 10);
}

TEST(SerialExecutorTest, ClosuresMayScheduleMore) {
  std::vector<int> order;
  absl::Notification second_scheduled;
  {
    SerialExecutor ex;
    ex.Schedule([&] {
      second_scheduled.WaitForNotification();  // so that 3 goes after 2
      order.push_back(1);
      ex.Schedule([&] { order.push_back(3); });
    });
    ex.Schedule([&] { order.push_back(2); });
    second_scheduled.Notify();
  }
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

TEST(SerialExecutorTest, ScheduleFromManyThreads) {
  absl::Mutex mu;
  int count = 0;
  {
    SerialExecutor ex;
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 250; ++i) {
          ex.Schedule([&] {
            absl::MutexLock lock(&mu);
            ++count;
          });
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  absl::MutexLock lock(&mu);
  EXPECT_EQ(count, 1000);
}

}  // namespace
}  // namespace towerps::common
