#include "common/process_cpu.h"

#include <thread>
#include <vector>

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

}  // namespace
}  // namespace towerps::common
