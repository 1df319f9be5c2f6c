// The worker's math on one device: memory, copies, the handful of dense
// kernels a multilayer perceptron needs, convolution, pooling and batch norm
// (NCHW), dropout, and the losses, on raw row-major float32 buffers.
//
// Two implementations: the CPU one (CBLAS split by cpu_gemm.h, oneDNN for
// convolution through worker/device/dnnl_kernels.h, pooling and batch norm
// of its own in cpu_pool.h and cpu_batch_norm.h, with threads as
// worker/device/cpu_threads.h sets them; buffers are host memory) and
// the CUDA one (worker/device/backend_cuda.cc: cuBLAS for GEMM, cuDNN for
// convolution, pooling and batch norm through worker/device/cudnn_kernels.h,
// small kernels in worker/device/cuda_kernels.cu for the rest, one stream and
// one cuBLAS and one cuDNN handle per backend), which exists only in builds
// with the CUDA toolkit.
// Layers hold a `Backend&` and never touch a math library directly.
#ifndef TOWERPS_WORKER_DEVICE_BACKEND_H_
#define TOWERPS_WORKER_DEVICE_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/device/conv_shape.h"
#include "worker/device/loss_kind.h"

namespace towerps::worker {
class Allocator;
}

namespace towerps::worker {

// Not thread-safe: one thread drives a backend at a time (each tower and each
// pipeline stage has its own). The exceptions are what CopyFrom calls on its
// source, `from`, from the copying backend's thread while another thread may
// be driving `from` (pipeline stages on different devices):
// memory_space(), host_memory(), Synchronize() and CopyToHost() may be
// called from any thread at any time, concurrently with the driving thread's
// calls. Such a CopyToHost is ordered after the work queued before it on the
// backend; its `src` must not be written by work the driving thread queues
// until it returns (CopyFrom's contract on `src` already requires this).
// Implementations keep these calls to constant members and mutex-guarded
// state.
//
// Kernels may run asynchronously on the device (in order, on the backend's
// stream); buffers passed to a kernel must stay alive until Synchronize() or
// a synchronous call (CopyToHost, Loss) returns. On the CPU backend every
// call is synchronous.
//
// "Device pointers" are pointers from this backend's Allocate (or, for a
// backend with host_memory(), any host pointer). Buffers are row-major and
// not owned. Unless stated otherwise, input and output buffers must not
// overlap. All sizes must be >= 0; a zero size is a no-op (apart from scaling
// C by beta in Gemm when k == 0).
class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu" or "cuda:<physical GPU index>". Two backends with the same memory
  // space read each other's device pointers directly (after the writer's
  // Synchronize()).
  virtual std::string memory_space() const = 0;
  // True when device pointers are host pointers (the CPU backend).
  bool host_memory() const { return memory_space() == "cpu"; }

  // ---- Memory and copies ------------------------------------------------

  // `n` floats of device memory, through the virtual device's allocator when
  // the backend has one (so its limit is enforced: ResourceExhausted naming
  // the device, the bytes asked and the bytes left).
  virtual absl::StatusOr<float*> Allocate(int64_t n) = 0;
  // Frees what Allocate returned; nullptr is a no-op. Waits for pending work.
  virtual void Free(float* p) = 0;

  // dst (device) = src (host), n floats. The host buffer may be reused as
  // soon as the call returns.
  virtual void CopyFromHost(const float* src, int64_t n, float* dst) = 0;
  // dst (host) = src (device), n floats; waits for pending work first and
  // returns the first error the device reported (OK on the CPU). May be
  // called from another thread (see the class comment).
  virtual absl::Status CopyToHost(const float* src, int64_t n, float* dst) = 0;
  // dst (this backend's device) = src (on `from`'s device), n floats. Waits
  // for `from`'s pending work so that src is complete; works across memory
  // spaces (host<->GPU, GPU<->GPU). The copy is complete when it returns.
  virtual absl::Status CopyFrom(Backend& from, const float* src, int64_t n,
                                float* dst) = 0;
  // Waits for every kernel and copy issued so far; the first device error
  // (sticky) otherwise OK. May be called from another thread.
  virtual absl::Status Synchronize() = 0;

  // ---- Kernels ----------------------------------------------------------

  // C[m,n] = alpha * op(A) * op(B) + beta * C, where op(A) is [m,k] and op(B)
  // is [k,n]. A is stored [m,k] (or [k,m] when trans_a); B is stored [k,n]
  // (or [n,k] when trans_b). With beta == 0, C's prior contents are ignored
  // (NaNs in it do not propagate).
  virtual void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                    float alpha, const float* a, const float* b, float beta,
                    float* c) = 0;

  // x[r, :] += bias for every row r of x[rows, cols].
  virtual void AddBiasRows(int64_t rows, int64_t cols, const float* bias,
                           float* x) = 0;

  // out[j] = sum_r x[r, j] (column sums of x[rows, cols]; the bias gradient).
  // out has `cols` elements and is overwritten.
  virtual void SumRows(int64_t rows, int64_t cols, const float* x,
                       float* out) = 0;

  // out[i] = max(in[i], 0). `in` and `out` may be the same buffer.
  virtual void Relu(int64_t n, const float* in, float* out) = 0;

  // dx[i] = dy[i] if y[i] > 0 else 0, where y is ReLU's output (its input
  // gives the same mask). `dx` may alias `dy`.
  virtual void ReluGrad(int64_t n, const float* y, const float* dy,
                        float* dx) = 0;

  // y += alpha * x (n elements).
  virtual void Axpy(int64_t n, float alpha, const float* x, float* y) = 0;

  // x *= alpha (n elements).
  virtual void Scale(int64_t n, float alpha, float* x) = 0;

  // x = 0 (n elements).
  virtual void Zero(int64_t n, float* x) = 0;

  // ---- Convolution and pooling (NCHW float32) ---------------------------
  //
  // Shapes and layouts: worker/device/conv_shape.h (x [n,c,h,w], weights
  // [k,c,r,s] OIHW, bias [k], y [n,k,out_h,out_w]). Every output buffer is
  // OVERWRITTEN, never accumulated into (a caller that needs a sum adds with
  // Axpy). Errors: InvalidArgument naming the bad shape field (checked
  // before any buffer is touched); Internal with the library's message if
  // the kernel library fails; ResourceExhausted if it cannot allocate;
  // Unimplemented where the library has no kernel for the configuration.
  // The CUDA backend (cuDNN, loaded at run time): Unavailable "cuDNN
  // unavailable: <why>" where cuDNN cannot be loaded (every other call still
  // works). Like the other kernels they may run asynchronously.

  // y = conv(x, w) + b; `b` may be null (no bias).
  virtual absl::Status Conv2DForward(const Conv2DShape& shape, const float* x,
                                     const float* w, const float* b,
                                     float* y) = 0;
  // dx = the gradient of sum(dy * conv(x, w)) with respect to x (the
  // adjoint of the forward's linear map in x).
  virtual absl::Status Conv2DBackwardData(const Conv2DShape& shape,
                                          const float* dy, const float* w,
                                          float* dx) = 0;
  // dw = the gradient with respect to w ([k,c,r,s]); db ([k], may be null)
  // = dy summed over n, rows and columns.
  virtual absl::Status Conv2DBackwardWeights(const Conv2DShape& shape,
                                             const float* x, const float* dy,
                                             float* dw, float* db) = 0;

  // y = the maximum over each window (padding never wins). `workspace`
  // (shape.workspace_size() floats, opaque) records the winners for
  // MaxPool2DBackward on the same backend with the same shape (the CUDA
  // backend leaves it untouched: cuDNN finds the winners from x and y).
  virtual absl::Status MaxPool2DForward(const Pool2DShape& shape,
                                        const float* x, float* y,
                                        float* workspace) = 0;
  // dx = dy routed to each window's winner (summed where windows overlap);
  // zero elsewhere. `x` and `y` are the forward's input and output (a
  // backend may use them instead of the workspace), `workspace` what the
  // forward wrote.
  virtual absl::Status MaxPool2DBackward(const Pool2DShape& shape,
                                         const float* x, const float* y,
                                         const float* workspace,
                                         const float* dy, float* dx) = 0;
  // y = the mean over each window's pixels inside the image (padding is not
  // counted). Global average pooling: r = h, s = w.
  virtual absl::Status AvgPool2DForward(const Pool2DShape& shape,
                                        const float* x, float* y) = 0;
  // dx = each dy spread evenly over its window's pixels inside the image.
  virtual absl::Status AvgPool2DBackward(const Pool2DShape& shape,
                                         const float* dy, float* dx) = 0;

  // ---- Batch normalization and dropout -----------------------------------
  //
  // Batch norm: shapes in worker/device/conv_shape.h (x, y, dx [n, c,
  // spatial]; gamma, beta, mean, var, dgamma, dbeta [c]). Outputs are
  // overwritten and must not alias an input (the CPU backend reads x more
  // than once). Errors as the convolution kernels' (InvalidArgument from
  // shape.Validate() before any buffer is touched, Internal from the kernel
  // library, Unimplemented where a backend has no kernel yet).

  // Training mode: mean[c] and var[c] are this batch's per-channel mean and
  // BIASED variance (divided by n * spatial, as Keras' moving statistics
  // take it), and y = gamma * (x - mean) / sqrt(var + epsilon) + beta.
  virtual absl::Status BatchNormForwardTraining(const BatchNormShape& shape, const float* x,
                                                const float* gamma, const float* beta,
                                                float* y, float* mean, float* var) = 0;
  // Inference mode: y as above with the given mean and var (the moving
  // statistics).
  virtual absl::Status BatchNormForwardInference(const BatchNormShape& shape, const float* x,
                                                 const float* gamma, const float* beta,
                                                 const float* mean, const float* var,
                                                 float* y) = 0;
  // The gradients of training mode (the batch statistics depend on x):
  // given the forward's x, gamma and the mean and var it wrote, and dy,
  // writes dx, dgamma and dbeta.
  virtual absl::Status BatchNormBackward(const BatchNormShape& shape, const float* x,
                                         const float* dy, const float* gamma,
                                         const float* mean, const float* var, float* dx,
                                         float* dgamma, float* dbeta) = 0;

  // Inverted dropout, training mode: mask[i] = 0 with probability `rate`, else
  // 1 / (1 - rate), and y[i] = x[i] * mask[i]. The mask is a function of
  // (seed, i) alone (a counter-based generator), so a seed gives the same
  // mask on every call and every backend. REQUIRES: 0 <= rate < 1. `y` may
  // alias `x`.
  virtual void DropoutForward(int64_t n, float rate, uint64_t seed, const float* x, float* y,
                              float* mask) = 0;
  // out[i] = a[i] * b[i] (dropout's backward: dx = dy * mask). `out` may
  // alias `a` or `b`.
  virtual void Mul(int64_t n, const float* a, const float* b, float* out) = 0;

  // ---- Losses -----------------------------------------------------------

  // The loss of predictions `pred` [n, d] (device), Keras semantics (see
  // worker/model/losses.h), and, when `dpred` (device, [n, d]) is non-null, the
  // gradient of the per-example losses' SUM divided by `grad_count` (<= 0
  // means n):
  // n for the mean over this batch, the whole batch's size when this is a
  // micro-batch of it, so micro-batches add up to the whole batch's gradient.
  //  - kSoftmaxCrossEntropy: `labels` (device, n floats holding class
  //    indices; each must be in [0, d): the caller validates).
  //  - kMse, kMae: `targets` (device, [n, d]).
  // Waits for the device; returns the sums in double (per-row values are
  // summed on the host in row order, so every backend reports the same sum
  // for the same per-row values) or the device's error. InvalidArgument for
  // an unknown loss kind and for softmax cross-entropy over no classes
  // (d == 0 with n > 0; an empty batch is fine at any d); the CUDA backend
  // also for a label out of range.
  virtual absl::StatusOr<LossResult> Loss(LossKind kind, int64_t n, int64_t d,
                                          const float* pred,
                                          const float* labels,
                                          const float* targets, float* dpred,
                                          int64_t grad_count) = 0;
};

// A Backend on the host CPU through CBLAS (OpenBLAS). With an `allocator`
// (not owned; must outlive the backend), Allocate charges it, so a virtual
// CPU device's limit holds; without one, Allocate uses plain host memory.
std::unique_ptr<Backend> NewCpuBackend(Allocator* allocator = nullptr);

// Whether this binary has the CUDA backend (built with the toolkit).
bool CudaBackendBuilt();

// A CUDA backend on physical GPU `gpu` with its own stream and cuBLAS
// handle (and cuDNN handle, made on the first call that needs cuDNN); memory through `allocator` (not owned; its MemoryBackend must hand
// out device memory of that GPU, e.g. NewCudaMemoryBackend), or
// cudaMalloc directly when null. Unavailable (with the reason) in CPU-only
// builds; the CUDA error when the GPU cannot be used.
absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(
    int gpu, Allocator* allocator = nullptr);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_DEVICE_BACKEND_H_
