#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "worker/device/cuda_memory.h"
#include "worker/device/cuda_util.h"

namespace towerps::worker {
namespace {

// Alloc(0) must return a unique non-null pointer; cudaMalloc(0) returns null.
// 256 bytes is cudaMalloc's alignment, so this costs nothing extra.
constexpr int64_t kMinBlockBytes = 256;

// Thread-safe: no state beyond the constant GPU index; the CUDA runtime is
// thread-safe. Alloc and Free make the GPU the calling thread's current
// device and leave it so: restoring the previous one would create a context
// on GPU 0 for threads that never used it (cudaGetDevice answers 0 then).
// Every CUDA caller in towerps sets its device before each call anyway.
class CudaMemoryBackend : public MemoryBackend {
 public:
  explicit CudaMemoryBackend(int gpu) : gpu_(gpu) {}

  absl::StatusOr<void*> Alloc(int64_t bytes) override {
    if (bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("GPU ", gpu_, ": cannot allocate ", bytes, " bytes"));
    }
    TOWERPS_RETURN_IF_GPU_ERROR(cudaSetDevice(gpu_),
                                absl::StrCat("GPU ", gpu_, ": cudaSetDevice"));
    void* p = nullptr;
    const cudaError_t err =
        cudaMalloc(&p, static_cast<size_t>(std::max(bytes, kMinBlockBytes)));
    if (err == cudaErrorMemoryAllocation) {
      // Out of memory is not sticky; clear it so that this thread's next
      // cudaGetLastError does not report it again.
      cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      std::string left;
      if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
        left = absl::StrCat(" (", free_bytes, " of ", total_bytes,
                            " bytes free on the GPU)");
      } else {
        cudaGetLastError();
      }
      return absl::ResourceExhaustedError(absl::StrCat(
          "GPU ", gpu_, ": cudaMalloc of ", bytes, " bytes: ",
          cudaGetErrorName(err), ": ", cudaGetErrorString(err), left));
    }
    // Anything else is not about memory: a sticky context error (an earlier
    // kernel's illegal address), a driver failure. Calling it out of memory
    // would send the caller looking for a smaller batch; GpuStatus picks the
    // code (Internal, FailedPrecondition, ...). Not cleared, as in
    // worker/device/backend_cuda.cc's Allocate: a sticky error cannot be, and kernel
    // launchers clear stale errors themselves.
    TOWERPS_RETURN_IF_GPU_ERROR(
        err, absl::StrCat("GPU ", gpu_, ": cudaMalloc of ", bytes, " bytes"));
    return p;
  }

  void Free(void* p) override {
    if (p == nullptr) return;
    // cudaFree waits for the device's work that may still use the block.
    absl::Status status = GpuStatus(
        cudaSetDevice(gpu_), absl::StrCat("GPU ", gpu_, ": cudaSetDevice"));
    if (status.ok()) {
      status = GpuStatus(cudaFree(p), absl::StrCat("GPU ", gpu_, ": cudaFree"));
    }
    if (!status.ok()) TLOG(ERROR) << status;
  }

 private:
  const int gpu_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MemoryBackend>> NewCudaMemoryBackend(int gpu) {
  if (gpu < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU memory: bad GPU index ", gpu));
  }
  // Fail now, not at the first allocation, when the GPU cannot be used.
  TOWERPS_RETURN_IF_GPU_ERROR(cudaSetDevice(gpu),
                              absl::StrCat("GPU ", gpu, ": cudaSetDevice"));
  return std::make_unique<CudaMemoryBackend>(gpu);
}

}  // namespace towerps::worker
