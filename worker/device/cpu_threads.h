// How many threads the CPU backend's math libraries use.
//
// Two libraries compute on the CPU: OpenBLAS (GEMM and the vector kernels;
// its own thread pool, one setting for the whole process) and oneDNN
// (convolution and pooling; an OpenMP team per calling thread, sized by that
// thread's OpenMP setting). They must agree: threads of one library that
// spin waiting for work while the other's run take the cores from them (two
// towers' or two worker processes' teams on two cores ran cnn_small 10x
// slower than one thread each). So the worker sets one count for both, and
// the CPU backend applies it to the thread that calls oneDNN, before each
// call (towers and pipeline stages call from their own threads). GEMMs run
// on the same OpenMP teams (cpu_gemm.h), so that their bits do not depend
// on the count; OpenBLAS's pool then stays at one thread.
//
// Thread-safe.
#ifndef TOWERPS_WORKER_DEVICE_CPU_THREADS_H_
#define TOWERPS_WORKER_DEVICE_CPU_THREADS_H_

namespace towerps::worker {

// Sets the thread count of every later call of a CPU backend's GEMM
// (CpuGemm's blocks on an OpenMP team, with OpenBLAS itself at one thread;
// OpenBLAS's own pool at `threads` where CpuGemmRowGranule found no exact
// split), convolution, pooling, batch norm or ReLU (the OpenMP team that
// oneDNN's primitives and cpu_team.h's kernels share), on any thread.
// `threads` < 1 counts as 1.
void SetCpuMathThreads(int threads);

// What SetCpuMathThreads last set; 0 before the first call (each library's
// own default: every core).
int CpuMathThreads();

// Makes the calling thread's OpenMP team (oneDNN's) the size set by
// SetCpuMathThreads, if one was set. Cheap when it already is.
void ApplyCpuMathThreadsToThisThread();

// Threads per tower so that every tower of every worker on this host
// together use at most their share of `cores`:
// max(1, share / (towers * workers_on_host)), where the share is every core,
// or half of them on a host of 4 cores or more where a ps runs too. A
// step's communication overlaps its compute: while the towers compute, the
// servers on the host apply and copy the other layers and the worker's
// streams move them, so an OpenBLAS team as wide as the machine loses a
// member to those threads in nearly every call and waits for it. On 16
// cores with 2 ps (issue 16, tests/gpu/bench.sh threads_sweep), 8 threads
// instead of 16 took the 1-worker MLP step from 3.12 to 2.51 ms and the
// dense stack's from 37.6 to 27.4, though each computes alone faster on 16.
// On 2 cores one thread instead of two cost the MLP's step 25% (its
// compute alone is 1.8x slower) and gained the dense stack's 5-20%: the
// whole cores stay shared there.
int CpuThreadsPerTower(int cores, int towers, int workers_on_host = 1, int ps_on_host = 0);

// The share of `cores` that CpuThreadsPerTower divides among the towers.
int CpuMathShare(int cores, int ps_on_host);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_DEVICE_CPU_THREADS_H_
