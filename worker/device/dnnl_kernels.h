// Convolution, pooling and batch normalization through oneDNN primitives
// on host buffers, with the contracts of the Backend methods of the same
// names (worker/device/backend.h). The CPU backend owns one and forwards its
// convolutions to it. Its pooling and batch norm are oneDNN's too, with the
// same contracts, but the backend pools with cpu_pool.h (oneDNN's kernel for
// NCHW data is its reference one) and normalizes with cpu_batch_norm.h
// (faster, and exact at any thread count); pool_benchmark and
// batch_norm_benchmark compare them. A convolution of 4 or more input
// channels runs in the blocked layouts oneDNN's direct JIT kernels want:
// its arguments are reordered to them and back through buffers this object
// keeps (as large as the largest convolution's input and output).
//
// Not thread-safe (one thread drives it, as it drives the backend). Owns one
// oneDNN CPU engine and stream, and caches the primitives it creates by
// shape, so the same layer's calls in every training step reuse them.
// Every call is synchronous. No oneDNN exception escapes: each becomes a
// Status (Internal with oneDNN's message, ResourceExhausted for bad_alloc).
#ifndef TOWERPS_WORKER_DEVICE_DNNL_KERNELS_H_
#define TOWERPS_WORKER_DEVICE_DNNL_KERNELS_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/device/conv_shape.h"

namespace towerps::worker {

class DnnlKernels {
 public:
  virtual ~DnnlKernels() = default;

  virtual absl::Status Conv2DForward(const Conv2DShape& shape, const float* x,
                                     const float* w, const float* b,
                                     float* y) = 0;
  virtual absl::Status Conv2DBackwardData(const Conv2DShape& shape,
                                          const float* dy, const float* w,
                                          float* dx) = 0;
  virtual absl::Status Conv2DBackwardWeights(const Conv2DShape& shape,
                                             const float* x, const float* dy,
                                             float* dw, float* db) = 0;
  virtual absl::Status MaxPool2DForward(const Pool2DShape& shape,
                                        const float* x, float* y,
                                        float* workspace) = 0;
  virtual absl::Status MaxPool2DBackward(const Pool2DShape& shape,
                                         const float* workspace,
                                         const float* dy, float* dx) = 0;
  virtual absl::Status AvgPool2DForward(const Pool2DShape& shape,
                                        const float* x, float* y) = 0;
  virtual absl::Status AvgPool2DBackward(const Pool2DShape& shape,
                                         const float* dy, float* dx) = 0;
  virtual absl::Status BatchNormForwardTraining(const BatchNormShape& shape,
                                                const float* x,
                                                const float* gamma,
                                                const float* beta, float* y,
                                                float* mean, float* var) = 0;
  virtual absl::Status BatchNormForwardInference(
      const BatchNormShape& shape, const float* x, const float* gamma,
      const float* beta, const float* mean, const float* var, float* y) = 0;
  virtual absl::Status BatchNormBackward(const BatchNormShape& shape,
                                         const float* x, const float* dy,
                                         const float* gamma, const float* mean,
                                         const float* var, float* dx,
                                         float* dgamma, float* dbeta) = 0;

  // Primitives created so far (each shape and direction once), for tests.
  virtual int64_t cached_primitives() const = 0;
};

// A CPU engine and stream; Internal if oneDNN cannot create them.
absl::StatusOr<std::unique_ptr<DnnlKernels>> NewDnnlKernels();

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_DEVICE_DNNL_KERNELS_H_
