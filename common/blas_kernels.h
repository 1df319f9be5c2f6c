// OpenBLAS's kernels for this CPU: which ones run, and a restart with better
// ones where the library picked kernels older than the CPU.
//
// Debian's OpenBLAS is built with DYNAMIC_ARCH: when it loads, it picks its
// kernels from the CPU's family and model numbers. A CPU model newer than the
// library (or a VM that reports a generic one) gets the fallback, Prescott's
// SSE3 kernels, even where the CPU has AVX2 and AVX-512. On one such 16-core
// Xeon (issue 16, tests/gpu/bench.sh blas_core) the MLP's compute ran 4.2x
// slower on one thread and 2.3x slower on sixteen than with the AVX-512
// kernels. The library reads OPENBLAS_CORETYPE only when it loads, so the
// remedy is to set it and start the program again.
//
// Thread-safe, except RestartWithBetterBlasKernels (see there).
#ifndef TOWERPS_COMMON_BLAS_KERNELS_H_
#define TOWERPS_COMMON_BLAS_KERNELS_H_

#include <string>

#include "absl/strings/string_view.h"

namespace towerps::common {

// The vector extensions OpenBLAS's newer kernels need, as the CPU (and the
// OS, which must save the wider registers) supports them.
struct CpuVectorFeatures {
  bool avx2_fma = false;  // AVX2 and FMA3: the Haswell kernels.
  bool avx512 = false;    // AVX-512 F, CD, BW, DQ and VL: the SkylakeX kernels.
};
CpuVectorFeatures DetectCpuVectorFeatures();

// The OPENBLAS_CORETYPE to ask for, or "" to keep the library's choice.
// "" unless `corename` (the library's choice, e.g. "Prescott") is a core
// whose kernels predate AVX2 while `cpu` has AVX2 and FMA; then "SkylakeX"
// where it has AVX-512, else "Haswell". `coretype_env` is OPENBLAS_CORETYPE
// (null: unset): a choice already made there is always kept.
std::string BetterBlasCore(absl::string_view corename, CpuVectorFeatures cpu,
                           const char* coretype_env);

// The kernels the library runs ("SkylakeX", "Prescott", ...).
std::string BlasCoreName();

// The library's own description, kernels included ("OpenBLAS 0.3.21
// DYNAMIC_ARCH NO_AFFINITY SkylakeX MAX_THREADS=64"), and BlasKernelsNote
// in parentheses where there is one, for start-up logs.
std::string BlasDescription();

// Where the run started again (RestartWithBetterBlasKernels), why: "OpenBLAS
// picked the Prescott kernels for this CPU, so this run started again with
// OPENBLAS_CORETYPE=SkylakeX"; else "". For the program's start-up log.
std::string BlasRestartNote();

// Why the library runs the kernels it does, where that is not its own
// choice or not the best this CPU has: BlasRestartNote where the run
// started again; else, where OPENBLAS_CORETYPE came from the environment
// and names kernels older than the CPU runs, that it was kept ("
// OPENBLAS_CORETYPE=Haswell from the environment, kept: this CPU has
// AVX-512, whose SkylakeX kernels may be faster"); else "". For start-up logs.
std::string BlasKernelsNote();

// Where BetterBlasCore names a core for the library's choice on this CPU:
// sets OPENBLAS_CORETYPE and replaces the process with a fresh run of the
// same program with the same arguments (execv of /proc/self/exe: the pid and
// open files stay), which says why in BlasRestartNote; nothing is printed,
// so that a command's output is the same on every CPU. Returns only where no
// restart is needed, or where exec failed (logged as a warning naming
// `program`; the program goes on with the library's kernels).
// REQUIRES: called first in main(), before the program starts threads or
// takes resources another run of it would need.
void RestartWithBetterBlasKernels(absl::string_view program, char** argv);

namespace internal {
// Where a restart keeps the library's first choice for BlasRestartNote.
inline constexpr char kPickedEnv[] = "TOWERPS_OPENBLAS_PICKED";
// RestartWithBetterBlasKernels for a given choice of the library's (tests
// pretend one).
void RestartIfBetter(absl::string_view program, absl::string_view corename, char** argv);
// BlasKernelsNote's second case for a given choice of kernels, CPU and
// OPENBLAS_CORETYPE (null: unset); "" where it does not apply.
std::string KeptCoreNote(absl::string_view corename, CpuVectorFeatures cpu,
                         const char* coretype_env);
}  // namespace internal

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_BLAS_KERNELS_H_
