#include "common/process_cpu.h"

#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace towerps::common {
namespace {

// Spins until this thread has used `seconds` of CPU time of its own
// (CLOCK_THREAD_CPUTIME_ID), whatever else the machine runs.
void Spin(double seconds) {
  timespec t{};
  volatile double sink = 0;
  do {
    for (int i = 0; i < 100000; ++i) sink = sink + i;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  } while (t.tv_sec + t.tv_nsec * 1e-9 < seconds);
}

TEST(ProcessCpuTest, CountsEveryThreadsWork) {
  const CpuTime before = ProcessCpuTime();
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) threads.emplace_back([] { Spin(0.1); });
  for (auto& t : threads) t.join();
  const CpuTime after = ProcessCpuTime();
  // Two threads of at least 0.1 s each (their own clocks say so).
  EXPECT_GE(after.total_s() - before.total_s(), 0.2 - 0.02);
  EXPECT_GE(after.user_s, before.user_s);
  EXPECT_GE(after.system_s, before.system_s);
}

// Pins the calling thread to `cpu`.
void PinTo(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0) << "cpu " << cpu;
}

TEST(SharesCpusWithTest, ThreadsPinnedApartShareNone) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c) {
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  }
  if (cpus.size() < 2) GTEST_SKIP() << "this process may run on one CPU only";
  absl::Notification pinned, done;
  std::atomic<pid_t> a_tid{0};  // atomic: TSan does not see into the system's Abseil
  std::thread a([&] {
    PinTo(cpus[0]);
    a_tid = gettid();
    pinned.Notify();
    done.WaitForNotification();
  });
  pinned.WaitForNotification();
  // This thread may run anywhere this process may: on a's CPU too.
  EXPECT_TRUE(SharesCpusWith(a_tid));
  bool apart = true, together = false;
  std::thread b([&] {
    PinTo(cpus[1]);
    apart = !SharesCpusWith(a_tid);
    PinTo(cpus[0]);
    together = SharesCpusWith(a_tid);
  });
  b.join();
  done.Notify();
  a.join();
  EXPECT_TRUE(apart);
  EXPECT_TRUE(together);
}

TEST(SharesCpusWithTest, UnknownThreadsShareAll) {
  EXPECT_TRUE(SharesCpusWith(getpid()));
  EXPECT_TRUE(SharesCpusWith(0));
  EXPECT_TRUE(SharesCpusWith(-1));
  int pid_max = 0;
  std::ifstream("/proc/sys/kernel/pid_max") >> pid_max;
  ASSERT_GT(pid_max, 0);
  EXPECT_TRUE(SharesCpusWith(pid_max));  // pids are below pid_max: none such
}

}  // namespace
}  // namespace towerps::common
