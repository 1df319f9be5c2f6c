// Work shared out over the calling thread's OpenMP team (libgomp's: the
// team oneDNN's primitives run on too, sized by SetCpuMathThreads), for the
// CPU backend's own kernels (cpu_gemm, cpu_pool, cpu_batch_norm, ReLU).
//
// Thread-safe: any thread may call RunOnTeam at any time; each calling
// thread has its own team.
#ifndef TOWERPS_WORKER_DEVICE_CPU_TEAM_H_
#define TOWERPS_WORKER_DEVICE_CPU_TEAM_H_

#include "absl/functional/function_ref.h"

namespace towerps::worker {

// Calls body(part, parts) once for every part in [0, parts) and returns when
// all have returned: on one thread (this one) when `threads` < 2, otherwise
// on a team of up to `threads` threads, this one among them. `parts` is the
// team's real size (libgomp may give fewer threads than asked), so the body
// must divide its work by `parts`, not by `threads`. Writes made before the
// call are visible to every part, and every part's writes after it.
void RunOnTeam(int threads, absl::FunctionRef<void(int part, int parts)> body);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_DEVICE_CPU_TEAM_H_
