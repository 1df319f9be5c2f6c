// CPU-only build: there is no CUDA here.
#include "worker/device/gpu_info.h"

namespace towerps::worker {

GpuInfo QueryGpus() {
  GpuInfo info;
  info.note = "built without the CUDA toolkit";
  return info;
}

}  // namespace towerps::worker
