#include "worker/device/cpu_threads.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>

#include "worker/device/cpu_gemm.h"

// libgomp's API, declared here rather than through <omp.h>, which not every
// compiler's include path has (clang's, without libomp-dev). Linked with
// -lgomp, the runtime oneDNN itself uses.
extern "C" {
void omp_set_num_threads(int num_threads);
int omp_get_max_threads(void);
}

namespace towerps::worker {
namespace {

std::atomic<int> g_threads{0};

}  // namespace

void SetCpuMathThreads(int threads) {
  threads = std::max(1, threads);
  g_threads.store(threads, std::memory_order_relaxed);
  // GEMMs split over the OpenMP team (cpu_gemm.h), each block on one
  // OpenBLAS thread; OpenBLAS's own pool only where no split is exact.
  openblas_set_num_threads(CpuGemmRowGranule() > 0 ? 1 : threads);
  ApplyCpuMathThreadsToThisThread();
}

int CpuMathThreads() { return g_threads.load(std::memory_order_relaxed); }

void ApplyCpuMathThreadsToThisThread() {
  const int threads = CpuMathThreads();
  if (threads > 0 && omp_get_max_threads() != threads) omp_set_num_threads(threads);
}

int CpuMathShare(int cores, int ps_on_host) {
  return ps_on_host > 0 && cores >= 4 ? cores / 2 : cores;
}

int CpuThreadsPerTower(int cores, int towers, int workers_on_host, int ps_on_host) {
  return std::max(1, CpuMathShare(cores, ps_on_host) /
                         std::max(1, std::max(1, towers) * std::max(1, workers_on_host)));
}

}  // namespace towerps::worker
