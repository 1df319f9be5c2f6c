// GPU memory for the virtual devices' allocators: a MemoryBackend
// that hands out device memory of one physical GPU.
//
// Two implementations, chosen in common/BUILD: cuda_memory_cuda.cc (the
// toolkit's cudaMalloc) and cuda_memory_none.cc (CPU-only builds).
#ifndef TOWERPS_WORKER_DEVICE_CUDA_MEMORY_H_
#define TOWERPS_WORKER_DEVICE_CUDA_MEMORY_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/device/device_manager.h"

namespace towerps::worker {

// A MemoryBackend whose Alloc is cudaMalloc on physical GPU `gpu` and whose
// Free is cudaFree. Thread-safe; Alloc, Free and this factory make `gpu` the
// calling thread's current CUDA device. Alloc(0) returns a unique non-null
// pointer (a small block). Out of device memory, Alloc fails with
// ResourceExhausted naming the GPU, the bytes asked, the CUDA error and the
// bytes the GPU has free; any other CUDA error (a faulted context, the
// driver) keeps its own code (see worker/device/cuda_util.h's GpuStatus).
//
// Returns InvalidArgument for a negative `gpu`, the CUDA error (e.g.
// FailedPrecondition: no device or driver; InvalidArgument: no such GPU) when
// the GPU cannot be used, and Unavailable in CPU-only builds.
absl::StatusOr<std::unique_ptr<MemoryBackend>> NewCudaMemoryBackend(int gpu);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_DEVICE_CUDA_MEMORY_H_
