// For blas_kernels_test: restarts as a ps or worker would, pretending that
// OpenBLAS picked the kernels named by argv[1] (none: the library's real
// choice), then prints what the run that stays has.
#include <cblas.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "common/blas_kernels.h"

int main(int argc, char** argv) {
  if (argc > 1) {
    towerps::common::internal::RestartIfBetter("helper", argv[1], argv);
  } else {
    towerps::common::RestartWithBetterBlasKernels("helper", argv);
  }
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  std::printf("note=%s\n", towerps::common::BlasRestartNote().c_str());
  std::printf("pid=%d coretype_env=%s corename=%s\n", static_cast<int>(getpid()),
              env != nullptr ? env : "", openblas_get_corename());
  return 0;
}
