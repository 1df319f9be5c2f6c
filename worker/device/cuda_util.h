// CUDA, cuBLAS, cuDNN and NCCL results as absl::Status, and RAII owners for the
// handles several libraries share (streams, device memory).
//
// CUDA builds only: include this from *_cuda.cc files, which common/BUILD and
// worker/BUILD compile only where the toolkit exists (the target does not
// exist in CPU-only builds). Thread-safe: the functions have no state.
#ifndef TOWERPS_WORKER_DEVICE_CUDA_UTIL_H_
#define TOWERPS_WORKER_DEVICE_CUDA_UTIL_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include <memory>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/status.h"

namespace towerps::worker {

// OK for success; otherwise "<context>: <library error name>: <description>"
// with a code chosen from the error:
//   ResourceExhausted  out of device memory (cudaErrorMemoryAllocation,
//                      CUBLAS_STATUS_ALLOC_FAILED, cuDNN's allocation
//                      failures);
//   InvalidArgument    a bad device ordinal or a bad argument we passed;
//   FailedPrecondition no usable GPU or driver (cudaErrorNoDevice,
//                      cudaErrorInsufficientDriver, a stub libcuda, a
//                      driver/runtime mismatch, ...);
//   Internal           everything else (kernel faults, library bugs).
absl::Status GpuStatus(cudaError_t err, absl::string_view context);
absl::Status GpuStatus(cublasStatus_t status, absl::string_view context);
absl::Status GpuStatus(ncclResult_t result, absl::string_view context);
// cuDNN's: InvalidArgument for its BAD_PARAM family, Unimplemented for its
// NOT_SUPPORTED family (a shape or configuration it has no kernel for),
// FailedPrecondition for NOT_INITIALIZED, version and licence mismatches and
// a driver, runtime or GPU it cannot use, ResourceExhausted for allocation
// failures, Internal otherwise.
absl::Status GpuStatus(cudnnStatus_t status, absl::string_view context);

// Owns a cudaStream_t; destroying it destroys the stream (without waiting:
// synchronize first if work may be pending).
struct CudaStreamDeleter {
  void operator()(cudaStream_t stream) const;
};
using CudaStream =
    std::unique_ptr<std::remove_pointer_t<cudaStream_t>, CudaStreamDeleter>;

// Owns device memory from cudaMalloc; destroying it calls cudaFree.
struct CudaFreeDeleter {
  void operator()(void* p) const;
};
using CudaMemory = std::unique_ptr<void, CudaFreeDeleter>;

}  // namespace towerps::worker

// Evaluates `expr` (a cudaError_t, cublasStatus_t, cudnnStatus_t or
// ncclResult_t) and
// returns GpuStatus(result, context) from the caller if it is not success.
#define TOWERPS_RETURN_IF_GPU_ERROR(expr, context) \
  TOWERPS_RETURN_IF_ERROR(::towerps::worker::GpuStatus((expr), (context)))

#endif  // TOWERPS_WORKER_DEVICE_CUDA_UTIL_H_
