#include "worker/device/cpu_team.h"

// libgomp's entry point for a parallel region (what GCC emits for
// `#pragma omp parallel`), and its API, declared here rather than through
// <omp.h> and -fopenmp, which not every compiler here has (clang's, without
// libomp-dev; see cpu_threads.cc). Linked with -lgomp, oneDNN's runtime.
extern "C" {
void GOMP_parallel(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags);
int omp_get_thread_num(void);
int omp_get_num_threads(void);
#ifdef TOWERPS_TSAN_ANNOTATE
void __tsan_acquire(void* addr);
void __tsan_release(void* addr);
#endif
}

namespace towerps::worker {
namespace {

// libgomp is not built with TSan, which so cannot see a team's fork and
// join order the caller's writes before every member's reads and the
// members' writes before the caller's reads: they are announced to it
// (under --config=tsan only, where BUILD defines TOWERPS_TSAN_ANNOTATE).
void HandOver(void* token) {
#ifdef TOWERPS_TSAN_ANNOTATE
  __tsan_release(token);
#else
  (void)token;
#endif
}
void TakeOver(void* token) {
#ifdef TOWERPS_TSAN_ANNOTATE
  __tsan_acquire(token);
#else
  (void)token;
#endif
}

using Body = absl::FunctionRef<void(int, int)>;

// One team member's part.
void RunPart(void* data) {
  TakeOver(data);
  (*static_cast<const Body*>(data))(omp_get_thread_num(), omp_get_num_threads());
  HandOver(data);
}

}  // namespace

void RunOnTeam(int threads, absl::FunctionRef<void(int part, int parts)> body) {
  if (threads < 2) {
    body(0, 1);
    return;
  }
  Body b = body;
  HandOver(&b);
  GOMP_parallel(&RunPart, &b, static_cast<unsigned>(threads), 0);
  TakeOver(&b);
}

}  // namespace towerps::worker
