// CPU-only build: the CUDA backend does not exist (worker/BUILD picks this
// file where the toolkit is missing or TOWERPS_NO_CUDA=1).
#include "absl/status/status.h"
#include "worker/device/backend.h"

namespace towerps::worker {

bool CudaBackendBuilt() { return false; }

absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(
    int gpu, Allocator* allocator) {
  return absl::UnavailableError(
      "this binary was built without CUDA (CPU-only build)");
}

}  // namespace towerps::worker
