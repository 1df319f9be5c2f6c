// CUDA build: asks the runtime, cuBLAS and NCCL (loaded at run time) what
// they have.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include "worker/device/gpu_info.h"
#include "worker/device/nccl_lib.h"

namespace towerps::worker {

GpuInfo QueryGpus() {
  GpuInfo info;
  info.cuda_built = true;
  info.driver_loaded = access("/proc/driver/nvidia", F_OK) == 0;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    // No driver or no device: a normal answer on CPU machines.
    info.note = cudaGetErrorString(err);
    count = 0;
    cudaGetLastError();  // clear the sticky error
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    info.devices.push_back({i, prop.name, static_cast<long long>(prop.totalGlobalMem)});
  }
  int v = 0;
  if (cublasGetProperty(MAJOR_VERSION, &v) == CUBLAS_STATUS_SUCCESS) {
    int minor = 0, patch = 0;
    cublasGetProperty(MINOR_VERSION, &minor);
    cublasGetProperty(PATCH_LEVEL, &patch);
    info.cublas_version = v * 10000 + minor * 100 + patch;
  }
  std::string why;
  if (const NcclLib* nccl = Nccl(&why)) {
    info.nccl_version = nccl->version;
  } else {
    info.nccl_note = why;
  }
  return info;
}

}  // namespace towerps::worker
