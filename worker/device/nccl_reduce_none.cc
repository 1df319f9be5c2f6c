// CPU-only build: no NCCL.
#include "worker/device/nccl_reduce.h"

namespace towerps::worker {

absl::StatusOr<std::unique_ptr<NcclGroup>> NcclGroup::Create(
    const std::vector<int>& gpus) {
  return absl::UnavailableError(
      "NCCL: this binary was built without CUDA (CPU-only build)");
}

bool NcclGroup::Available(std::string* why) {
  if (why != nullptr) *why = "built without CUDA";
  return false;
}

}  // namespace towerps::worker
