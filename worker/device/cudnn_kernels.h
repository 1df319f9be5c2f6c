// The CUDA backend's convolution, pooling and batch normalization through
// cuDNN (loaded at run time: worker/device/cudnn_lib.h), with the contracts of
// the Backend methods of the same names (worker/device/backend.h), as
// worker/device/dnnl_kernels.h is for the CPU backend. The CUDA backend
// creates one on the first such call and forwards to it.
//
// Not thread-safe: one thread drives it, as it drives the backend. Owns one
// cuDNN handle bound to the backend's stream and one workspace buffer (plain
// cudaMalloc, not charged to a virtual device's allocator, like the backend's
// loss scratch), which grows to the largest a call has needed. Every call
// enqueues on the stream and returns without waiting; it returns the error
// cuDNN or CUDA reported when enqueueing (execution errors show at the
// backend's next synchronization). REQUIRES for every call: the calling
// thread's current device is the stream's.
//
// Numerics: convolutions run in FP32 with CUDNN_FMA_MATH (never TF32 tensor
// cores) and fixed, deterministic implicit-GEMM algorithms (a fallback only
// where cuDNN has no kernel or no workspace memory for them), so results are
// reproducible run to run and agree with the CPU backend within float
// rounding of a sum of products. Batch norm: CUDNN_BATCHNORM_SPATIAL.
//
// CUDA builds only.
#ifndef TOWERPS_WORKER_DEVICE_CUDNN_KERNELS_H_
#define TOWERPS_WORKER_DEVICE_CUDNN_KERNELS_H_

#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/device/conv_shape.h"

namespace towerps::worker {

class CudnnKernels {
 public:
  virtual ~CudnnKernels() = default;

  virtual absl::Status Conv2DForward(const Conv2DShape& shape, const float* x, const float* w,
                                     const float* b, float* y) = 0;
  virtual absl::Status Conv2DBackwardData(const Conv2DShape& shape, const float* dy,
                                          const float* w, float* dx) = 0;
  virtual absl::Status Conv2DBackwardWeights(const Conv2DShape& shape, const float* x,
                                             const float* dy, float* dw, float* db) = 0;
  // cuDNN's max-pooling backward finds the winners from x and y, so the
  // Backend's opaque workspace is neither written nor read.
  virtual absl::Status MaxPool2DForward(const Pool2DShape& shape, const float* x,
                                        float* y) = 0;
  virtual absl::Status MaxPool2DBackward(const Pool2DShape& shape, const float* x,
                                         const float* y, const float* dy, float* dx) = 0;
  virtual absl::Status AvgPool2DForward(const Pool2DShape& shape, const float* x,
                                        float* y) = 0;
  virtual absl::Status AvgPool2DBackward(const Pool2DShape& shape, const float* dy,
                                         float* dx) = 0;
  virtual absl::Status BatchNormForwardTraining(const BatchNormShape& shape, const float* x,
                                                const float* gamma, const float* beta,
                                                float* y, float* mean, float* var) = 0;
  virtual absl::Status BatchNormForwardInference(const BatchNormShape& shape, const float* x,
                                                 const float* gamma, const float* beta,
                                                 const float* mean, const float* var,
                                                 float* y) = 0;
  // cuDNN recomputes the batch statistics from x (the contract's mean and
  // var are those of the same x, so they are not read).
  virtual absl::Status BatchNormBackward(const BatchNormShape& shape, const float* x,
                                         const float* dy, const float* gamma, float* dx,
                                         float* dgamma, float* dbeta) = 0;
};

// A cuDNN handle on the calling thread's current device, bound to `stream`
// (not owned; must outlive the result). `where` ("cuda:0") prefixes
// messages. Unavailable "cuDNN unavailable: <why>" when the library cannot
// be loaded; the cuDNN error (through GpuStatus) when the handle cannot be
// created.
absl::StatusOr<std::unique_ptr<CudnnKernels>> NewCudnnKernels(cudaStream_t stream,
                                                              const std::string& where);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_DEVICE_CUDNN_KERNELS_H_
