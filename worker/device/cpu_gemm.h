// A single-precision GEMM on the CPU whose bits do not depend on how many
// threads compute it.
//
// OpenBLAS's own threads split a product differently for each thread count,
// so the same step rounds differently on 1, 2 or 16 threads (the 1-epoch MLP
// job ended on 0.8385/0.4515 with one and 0.8382/0.4510 with two). CpuGemm
// instead cuts C into blocks of whole rows whose boundaries are multiples of
// a granule, and computes each block with one single-threaded cblas_sgemm,
// the blocks on the calling thread's OpenMP team (libgomp's, the team
// oneDNN's convolutions use too: one pool for all CPU math). Within one
// OpenBLAS kernel every row of C is computed by the same micro-tile code as
// long as the blocks start on the kernel's tile boundaries, so each element
// gets exactly the bits one single-threaded call over the whole product
// gives it. Which granule keeps that true depends on the kernel OpenBLAS
// picked for the CPU; CpuGemmRowGranule finds it once per process by
// checking, not by assuming. (Cutting columns instead is not exact at any
// granule: OpenBLAS halves a wide product's columns where they exceed its
// blocking, so its tiles start where the width puts them.)
//
// A product with too few rows to cut (the dense stack's at batch 10) but
// many columns is computed as its transpose, C^T = op(B)^T op(A)^T, whose
// rows are C's columns, then transposed into C: whatever the thread count,
// since which way a product is computed must depend on its shape alone.
//
// Thread-safe: any thread may call any function here at any time.
#ifndef TOWERPS_WORKER_DEVICE_CPU_GEMM_H_
#define TOWERPS_WORKER_DEVICE_CPU_GEMM_H_

#include <cstdint>

namespace towerps::worker {

// The smallest candidate granule (4, 8, 12, 16, 24, 32, 48, 64 rows) at
// which blocks of one granule each reproduce the unsplit product bit for bit
// on this CPU's OpenBLAS kernel, over probe products of every transpose
// combination with ragged tails; 0 if none does (then CpuGemm never splits
// and never transposes). Measured on first call (milliseconds, on the
// calling thread, with OpenBLAS at one thread and its setting restored
// after), cached for the process.
int CpuGemmRowGranule();

// Row-major C[m, n] = alpha * op(A) * op(B) + beta * C, with op(A) [m, k]
// (A stored [k, m] when trans_a), op(B) [k, n] (B stored [n, k] when
// trans_b), leading dimensions those of contiguous matrices.
// With `threads` > 1 and a product large enough to gain, the rows (of C, or
// of C^T for a product of fewer than two granules of rows) are split into up
// to `threads` blocks computed at once; otherwise one cblas_sgemm computes
// it all. Returns how many blocks were computed at once (1: not split).
// REQUIRES: m, n, k >= 1. For the bits to be the same whatever `threads`,
// OpenBLAS must be at one thread (SetCpuMathThreads sees to it when a
// granule was found): an OpenBLAS team inside each block would split it its
// own way again.
int CpuGemm(int threads, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
            float alpha, const float* a, const float* b, float beta, float* c);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_DEVICE_CPU_GEMM_H_
