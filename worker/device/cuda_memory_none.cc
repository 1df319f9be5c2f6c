// CPU-only build: there is no GPU memory to hand out.
#include "absl/status/status.h"
#include "worker/device/cuda_memory.h"

namespace towerps::worker {

absl::StatusOr<std::unique_ptr<MemoryBackend>> NewCudaMemoryBackend(int gpu) {
  return absl::UnavailableError(
      "GPU memory: this binary was built without CUDA (CPU-only build)");
}

}  // namespace towerps::worker
