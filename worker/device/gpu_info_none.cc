// CPU-only build: there is no CUDA here.
#include "worker/device/gpu_info.h"

namespace towerps::common {

GpuInfo QueryGpus() {
  GpuInfo info;
  info.note = "built without the CUDA toolkit";
  return info;
}

}  // namespace towerps::common
