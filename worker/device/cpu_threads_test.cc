#include "worker/device/cpu_threads.h"

#include <cblas.h>

#include <thread>

#include "gtest/gtest.h"
#include "worker/device/cpu_gemm.h"

extern "C" int omp_get_max_threads(void);

namespace towerps::worker {
namespace {

TEST(CpuThreadsTest, PerTowerSharesTheCoresAmongTowersAndWorkers) {
  EXPECT_EQ(CpuThreadsPerTower(16, 4), 4);
  EXPECT_EQ(CpuThreadsPerTower(16, 4, 2), 2);
  EXPECT_EQ(CpuThreadsPerTower(2, 1, 2), 1);
  EXPECT_EQ(CpuThreadsPerTower(2, 4), 1);   // never below one
  EXPECT_EQ(CpuThreadsPerTower(8, 0, 0), 8);  // nonsense counts as one
}

TEST(CpuThreadsTest, LeavesHalfTheCoresToServersOnTheSameHost) {
  EXPECT_EQ(CpuThreadsPerTower(16, 1, 1, 0), 16);  // no ps here: every core
  EXPECT_EQ(CpuThreadsPerTower(16, 1, 1, 2), 8);
  EXPECT_EQ(CpuThreadsPerTower(16, 1, 1, 1), 8);   // one ps is enough
  EXPECT_EQ(CpuThreadsPerTower(16, 1, 2, 2), 4);   // then shared among the workers
  EXPECT_EQ(CpuThreadsPerTower(16, 2, 1, 2), 4);   // and the towers
  EXPECT_EQ(CpuThreadsPerTower(4, 1, 1, 1), 2);
  EXPECT_EQ(CpuThreadsPerTower(3, 1, 1, 1), 3);    // below 4 cores: every core
  EXPECT_EQ(CpuThreadsPerTower(2, 1, 1, 2), 2);
  EXPECT_EQ(CpuThreadsPerTower(2, 1, 2, 2), 1);
  EXPECT_EQ(CpuThreadsPerTower(1, 1, 1, 2), 1);
  EXPECT_EQ(CpuMathShare(16, 2), 8);
  EXPECT_EQ(CpuMathShare(16, 0), 16);
  EXPECT_EQ(CpuMathShare(2, 2), 2);
}

TEST(CpuThreadsTest, SetsOpenBlasAndEveryThreadsOpenMpTeam) {
  SetCpuMathThreads(3);
  EXPECT_EQ(CpuMathThreads(), 3);
  // GEMMs split over the OpenMP team, each block on one OpenBLAS thread;
  // OpenBLAS's own pool only where no exact split was found.
  EXPECT_EQ(openblas_get_num_threads(), CpuGemmRowGranule() > 0 ? 1 : 3);
  EXPECT_EQ(omp_get_max_threads(), 3);  // the calling thread at once
  // Another thread (a tower's) gets the setting when it applies it.
  int after = 0;
  SetCpuMathThreads(1);
  std::thread t([&] {
    ApplyCpuMathThreadsToThisThread();
    after = omp_get_max_threads();
  });
  t.join();
  EXPECT_EQ(after, 1);
  EXPECT_EQ(CpuMathThreads(), 1);
  EXPECT_EQ(openblas_get_num_threads(), 1);
  SetCpuMathThreads(0);
  EXPECT_EQ(CpuMathThreads(), 1);  // below one counts as one
}

}  // namespace
}  // namespace towerps::worker
