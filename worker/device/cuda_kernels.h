// The CUDA backend's own kernels (everything but GEMM, which is cuBLAS).
//
// A plain header so that nvcc, which compiles worker/device/cuda_kernels.cu, never
// sees protobuf or Abseil; worker/device/backend_cuda.cc (the ordinary C++
// compiler) calls these. Every function enqueues on `stream` (a cudaStream_t)
// on the calling thread's current device, returns at once with the launch's
// cudaError_t as an int (cudaSuccess = 0; execution errors show up at the
// next synchronization), and does nothing for an empty size. Pointers are
// device pointers; sizes are 64-bit and the kernels index in 64 bits.
//
// Arithmetic follows the CPU backend operation by operation: the file is
// compiled with --fmad=false, so no multiply-add is contracted into an FMA
// the CPU code does not have, and the losses accumulate in double in the CPU
// code's order (worker/device/loss_kernels.cc), so only exp/log (within 1-2 ulp in
// double) can tell the two apart.
#ifndef TOWERPS_WORKER_DEVICE_CUDA_KERNELS_H_
#define TOWERPS_WORKER_DEVICE_CUDA_KERNELS_H_

#include <cstdint>

namespace towerps::worker::internal {

// x[r, c] += bias[c] for x [rows, cols].
int LaunchAddBiasRows(void* stream, int64_t rows, int64_t cols,
                      const float* bias, float* x);

// out[c] = sum over r of x[r, c], accumulated in double in a fixed order
// (deterministic run to run). rows == 0 gives zeros.
int LaunchSumRows(void* stream, int64_t rows, int64_t cols, const float* x,
                  float* out);

// out[i] = in[i] > 0 ? in[i] : 0. `in` may equal `out`.
int LaunchRelu(void* stream, int64_t n, const float* in, float* out);

// dx[i] = y[i] > 0 ? dy[i] : 0. `dx` may equal `dy`.
int LaunchReluGrad(void* stream, int64_t n, const float* y, const float* dy,
                   float* dx);

// y[i] += alpha * x[i].
int LaunchAxpy(void* stream, int64_t n, float alpha, const float* x, float* y);

// x[i] *= alpha.
int LaunchScale(void* stream, int64_t n, float alpha, float* x);

// out[i] = a[i] * b[i]. `out` may equal `a` or `b`.
int LaunchMul(void* stream, int64_t n, const float* a, const float* b,
              float* out);

// Inverted dropout: mask[i] = DropoutMaskValue(seed, i, rate)
// (worker/device/dropout_mask.h, the CPU backend's mask bit for bit) and
// y[i] = x[i] * mask[i]. `y` may equal `x`.
int LaunchDropout(void* stream, int64_t n, float rate, uint64_t seed,
                  const float* x, float* y, float* mask);

// Softmax cross-entropy, one thread per row of logits [n, d]: row_loss[i] =
// log(sum_j exp(z_ij - max_i)) - (z_i,label - max_i); row_correct[i] = 1 if
// the row's first maximum is at the label, else 0, and -1 if labels[i] is not
// a class index in [0, d), which no label is when d == 0 (then row_loss[i]
// is NaN and the row's dlogits are left as they were). dlogits (may be null)
// [n, d] = (softmax - onehot) * inv_count.
int LaunchSoftmaxCrossEntropy(void* stream, int64_t n, int64_t d,
                              const float* logits, const float* labels,
                              double inv_count, float* dlogits,
                              double* row_loss, int32_t* row_correct);

// MSE (absolute = false) or MAE (true), one thread per row of pred [n, d]:
// row_loss[i] = (sum_j diff^2 or |diff|) * inv_d with diff = pred - target
// in double; dpred (may be null) = 2 * diff * inv_nd, or sign(diff) * inv_nd.
int LaunchRegression(void* stream, bool absolute, int64_t n, int64_t d,
                     const float* pred, const float* targets, double inv_d,
                     double inv_nd, float* dpred, double* row_loss);

}  // namespace towerps::worker::internal

#endif  // TOWERPS_WORKER_DEVICE_CUDA_KERNELS_H_
