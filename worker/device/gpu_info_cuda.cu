// CUDA build: asks the runtime, and where there is a GPU cuBLAS and NCCL
// (both loaded at run time), what they have.
#include <cuda_runtime.h>
#include <unistd.h>

#include "worker/device/cublas_lib.h"
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
  // Without a GPU neither library is loaded (cuBLAS alone is ~150 MB of
  // resident memory): a CPU-only run of this binary does not pay for them.
  if (info.devices.empty()) return info;
  std::string why;
  if (const CublasLib* blas = Cublas(&why)) {
    info.cublas_version = blas->version;
  } else {
    info.cublas_note = why;
  }
  if (const NcclLib* nccl = Nccl(&why)) {
    info.nccl_version = nccl->version;
  } else {
    info.nccl_note = why;
  }
  return info;
}

}  // namespace towerps::worker
