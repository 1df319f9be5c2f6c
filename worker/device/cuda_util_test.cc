#include "worker/device/cuda_util.h"

#include <string>

#include "gtest/gtest.h"

namespace towerps::worker {
namespace {

// The conversions need the libraries but no GPU.

TEST(CudaUtilTest, SuccessIsOk) {
  EXPECT_TRUE(GpuStatus(cudaSuccess, "x").ok());
  EXPECT_TRUE(GpuStatus(CUBLAS_STATUS_SUCCESS, "x").ok());
  EXPECT_TRUE(GpuStatus(ncclSuccess, "x").ok());
}

TEST(CudaUtilTest, CudaErrorsGetMeaningfulCodesAndText) {
  const absl::Status oom = GpuStatus(cudaErrorMemoryAllocation, "cuda:1: Gemm");
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(std::string(oom.message()).rfind("cuda:1: Gemm: ", 0), 0u)
      << oom.message();
  EXPECT_NE(oom.message().find("cudaErrorMemoryAllocation"), std::string::npos)
      << oom.message();
  EXPECT_EQ(GpuStatus(cudaErrorInvalidDevice, "x").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GpuStatus(cudaErrorNoDevice, "x").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(GpuStatus(cudaErrorInsufficientDriver, "x").code(),
            absl::StatusCode::kFailedPrecondition);
  // A container with the toolkit's stub libcuda, or a driver older than
  // the runtime: no usable GPU, not an internal error.
  EXPECT_EQ(GpuStatus(cudaErrorStubLibrary, "x").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(GpuStatus(cudaErrorSystemDriverMismatch, "x").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(GpuStatus(cudaErrorIllegalAddress, "x").code(),
            absl::StatusCode::kInternal);
}

TEST(CudaUtilTest, CublasAndNcclErrors) {
  const absl::Status alloc = GpuStatus(CUBLAS_STATUS_ALLOC_FAILED, "h");
  EXPECT_EQ(alloc.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(alloc.message().find("CUBLAS_STATUS_ALLOC_FAILED"),
            std::string::npos)
      << alloc.message();
  EXPECT_EQ(GpuStatus(CUBLAS_STATUS_EXECUTION_FAILED, "h").code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(GpuStatus(ncclInvalidUsage, "n").code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status nccl = GpuStatus(ncclUnhandledCudaError, "n");
  EXPECT_EQ(nccl.code(), absl::StatusCode::kInternal);
  // NCCL's own text, from the library loaded at run time.
  EXPECT_NE(nccl.message().find("n: NCCL: "), std::string::npos) << nccl.message();
  EXPECT_EQ(nccl.message().find("error 1"), std::string::npos) << nccl.message();
}

absl::Status Fails() {
  TOWERPS_RETURN_IF_GPU_ERROR(cudaSuccess, "first");
  TOWERPS_RETURN_IF_GPU_ERROR(ncclInvalidArgument, "second");
  return absl::InternalError("not reached");
}

TEST(CudaUtilTest, MacroReturnsTheFirstFailure) {
  const absl::Status status = Fails();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(status.message()).rfind("second: ", 0), 0u)
      << status.message();
}

}  // namespace
}  // namespace towerps::worker
