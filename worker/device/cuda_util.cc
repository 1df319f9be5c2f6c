#include "worker/device/cuda_util.h"

#include "absl/strings/str_cat.h"
#include "worker/device/nccl_lib.h"

namespace towerps::worker {

absl::Status GpuStatus(cudaError_t err, absl::string_view context) {
  if (err == cudaSuccess) return absl::OkStatus();
  const std::string message = absl::StrCat(context, ": ", cudaGetErrorName(err),
                                           ": ", cudaGetErrorString(err));
  switch (err) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidMemcpyDirection:
    case cudaErrorInvalidConfiguration:
      return absl::InvalidArgumentError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorStubLibrary:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorSystemNotReady:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status GpuStatus(cublasStatus_t status, absl::string_view context) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message =
      absl::StrCat(context, ": ", cublasGetStatusName(status), ": ",
                   cublasGetStatusString(status));
  switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(message);
    case CUBLAS_STATUS_INVALID_VALUE:
      return absl::InvalidArgumentError(message);
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status GpuStatus(ncclResult_t result, absl::string_view context) {
  if (result == ncclSuccess) return absl::OkStatus();
  // NCCL is loaded at run time; a result can only come from a loaded NCCL,
  // but say the number if it is somehow not there.
  const NcclLib* nccl = Nccl();
  const std::string message = absl::StrCat(
      context, ": NCCL: ",
      nccl != nullptr ? nccl->GetErrorString(result)
                      : absl::StrCat("error ", static_cast<int>(result)));
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

void CudaStreamDeleter::operator()(cudaStream_t stream) const {
  cudaStreamDestroy(stream);
}

void CudaFreeDeleter::operator()(void* p) const { cudaFree(p); }

}  // namespace towerps::worker
