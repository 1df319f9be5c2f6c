#include "common/blas_kernels.h"

#include <cblas.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace towerps::common {

CpuVectorFeatures DetectCpuVectorFeatures() {
  // libgcc's (and clang's) checks include the OS's support for the AVX and
  // AVX-512 register state (XGETBV), not only CPUID's bits.
  __builtin_cpu_init();
  CpuVectorFeatures f;
  f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  f.avx512 = f.avx2_fma && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  return f;
}

std::string BetterBlasCore(absl::string_view corename, CpuVectorFeatures cpu,
                           const char* coretype_env) {
  if (coretype_env != nullptr && *coretype_env != '\0') return "";  // the user's choice
  if (!cpu.avx2_fma) return "";
  // Cores whose kernels use AVX2 and FMA or more; any other choice (Prescott,
  // Nehalem, Sandybridge, "Unknown", ...) on a CPU with AVX2 and FMA is the
  // library not knowing the CPU.
  const std::string core = absl::AsciiStrToLower(corename);
  for (const char* modern : {"haswell", "zen", "skylakex", "cooperlake", "sapphirerapids",
                             "excavator"}) {
    if (core == modern) return "";
  }
  return cpu.avx512 ? "SkylakeX" : "Haswell";
}

std::string BlasCoreName() {
  const char* core = openblas_get_corename();
  return core != nullptr ? core : "Unknown";
}

std::string BlasRestartNote() {
  const char* picked = std::getenv(internal::kPickedEnv);
  const char* asked = std::getenv("OPENBLAS_CORETYPE");
  if (picked == nullptr || *picked == '\0' || asked == nullptr) return "";
  return absl::StrCat("OpenBLAS picked the ", picked,
                      " kernels for this CPU, so this run started again with OPENBLAS_CORETYPE=",
                      asked);
}

std::string BlasKernelsNote() {
  std::string note = BlasRestartNote();
  if (note.empty()) {
    note = internal::KeptCoreNote(BlasCoreName(), DetectCpuVectorFeatures(),
                                  std::getenv("OPENBLAS_CORETYPE"));
  }
  return note;
}

std::string BlasDescription() {
  const char* config = openblas_get_config();
  const std::string note = BlasKernelsNote();
  return absl::StrCat(config != nullptr ? config : "OpenBLAS (no description)",
                      note.empty() ? "" : " (", note, note.empty() ? "" : ")");
}

namespace internal {

namespace {
// 2: kernels for AVX-512; 1: for AVX2 and FMA; 0: older (or unknown).
int KernelLevel(absl::string_view corename) {
  const std::string core = absl::AsciiStrToLower(corename);
  for (const char* c : {"skylakex", "cooperlake", "sapphirerapids"}) {
    if (core == c) return 2;
  }
  for (const char* c : {"haswell", "zen", "excavator"}) {
    if (core == c) return 1;
  }
  return 0;
}
}  // namespace

std::string KeptCoreNote(absl::string_view corename, CpuVectorFeatures cpu,
                         const char* coretype_env) {
  if (coretype_env == nullptr || *coretype_env == '\0') return "";
  const int cpu_level = cpu.avx512 ? 2 : cpu.avx2_fma ? 1 : 0;
  if (KernelLevel(corename) >= cpu_level) return "";
  return absl::StrCat("OPENBLAS_CORETYPE=", coretype_env,
                      " from the environment, kept: this CPU has ",
                      cpu_level == 2 ? "AVX-512, whose SkylakeX" : "AVX2 and FMA, whose Haswell",
                      " kernels may be faster");
}

void RestartIfBetter(absl::string_view program, absl::string_view corename, char** argv) {
  const std::string better =
      BetterBlasCore(corename, DetectCpuVectorFeatures(), std::getenv("OPENBLAS_CORETYPE"));
  if (better.empty()) return;
  // No line here: the run that stays says it (BlasRestartNote), so that a
  // command's output (an error, --print_job_spec) is the same on every CPU.
  // Set, OPENBLAS_CORETYPE also keeps the new run from restarting again.
  if (setenv("OPENBLAS_CORETYPE", better.c_str(), 1) != 0 ||
      setenv(kPickedEnv, std::string(corename).c_str(), 1) != 0) {
    return;
  }
  execv("/proc/self/exe", argv);
  const int err = errno;
  unsetenv(kPickedEnv);
  TLOG(WARNING) << program << ": OpenBLAS picked the " << corename
                << " kernels for this CPU, which has newer ones (" << better
                << "), and starting again with OPENBLAS_CORETYPE=" << better << " failed ("
                << std::strerror(err) << "); going on with the " << corename << " kernels";
}

}  // namespace internal

void RestartWithBetterBlasKernels(absl::string_view program, char** argv) {
  internal::RestartIfBetter(program, BlasCoreName(), argv);
}

}  // namespace towerps::common
