#include "worker/device/cuda_util.h"

#include "absl/strings/str_cat.h"
#include "worker/device/cublas_lib.h"
#include "worker/device/cudnn_lib.h"
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
  // cuBLAS is loaded at run time; as for NCCL, a status can only come from a
  // loaded cuBLAS, but say the number if it is somehow not there.
  const CublasLib* blas = Cublas();
  const std::string message =
      blas != nullptr ? absl::StrCat(context, ": ", blas->GetStatusName(status), ": ",
                                     blas->GetStatusString(status))
                      : absl::StrCat(context, ": cuBLAS status ", static_cast<int>(status));
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

absl::Status GpuStatus(cudnnStatus_t status, absl::string_view context) {
  if (status == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  // As for NCCL: a status can only come from a loaded cuDNN.
  const CudnnLib* cudnn = Cudnn();
  const std::string message = absl::StrCat(
      context, ": cuDNN: ",
      cudnn != nullptr ? cudnn->GetErrorString(status)
                       : absl::StrCat("error ", static_cast<int>(status)));
  switch (status) {
    case CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED:
    case CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED:  // ALLOC_FAILED
      return absl::ResourceExhaustedError(message);
    // Not this call's fault: the machine cannot run this cuDNN.
    case CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER:
    case CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART:
    case CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH:
    case CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING:
    case CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE:
      return absl::FailedPreconditionError(message);
    default:
      break;
  }
  // cuDNN 9's codes come in families of a thousand (cudnn_graph.h).
  switch (static_cast<int>(status) / 1000) {
    case CUDNN_STATUS_NOT_INITIALIZED / 1000:
      return absl::FailedPreconditionError(message);
    case CUDNN_STATUS_BAD_PARAM / 1000:
      return absl::InvalidArgumentError(message);
    case CUDNN_STATUS_NOT_SUPPORTED / 1000:
      return absl::UnimplementedError(message);
    default:
      return absl::InternalError(message);
  }
}

void CudaStreamDeleter::operator()(cudaStream_t stream) const {
  cudaStreamDestroy(stream);
}

void CudaFreeDeleter::operator()(void* p) const { cudaFree(p); }

}  // namespace towerps::worker
