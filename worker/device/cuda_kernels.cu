// Kernels of the CUDA backend. Compiled by nvcc with --fmad=false (see
// worker/BUILD and the header): the arithmetic is written to match the CPU
// backend's operation by operation.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "worker/device/cuda_kernels.h"
#include "worker/device/dropout_mask.h"
#include "worker/device/loss_rows.h"

namespace towerps::worker::internal {
namespace {

constexpr int kThreads = 256;
// Grid-stride loops cover the rest; 4096 blocks of 256 threads fill any
// current GPU several times over.
constexpr int64_t kMaxBlocks = 4096;

int Blocks(int64_t n, int threads_per_block) {
  return static_cast<int>(std::min<int64_t>(
      (n + threads_per_block - 1) / threads_per_block, kMaxBlocks));
}

cudaStream_t AsStream(void* stream) {
  return static_cast<cudaStream_t>(stream);
}

// The launch's own error. A failed runtime call earlier on this thread (whose
// caller saw it as a return value) would otherwise be reported again here, so
// the thread's last error is cleared before launching; a sticky error (a
// corrupted context) makes the launch itself fail and is reported anyway.
void ClearStaleError() { cudaGetLastError(); }
int LaunchError() { return static_cast<int>(cudaGetLastError()); }

__device__ int64_t GlobalIndex() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ int64_t GridStride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

__global__ void AddBiasRowsKernel(int64_t total, int64_t cols,
                                  const float* bias, float* x) {
  for (int64_t i = GlobalIndex(); i < total; i += GridStride()) {
    x[i] += bias[i % cols];
  }
}

// SumRows: each block owns kSumCols adjacent columns (coalesced reads along a
// row); its kSumSlices rows of threads each sum every kSumSlices-th row, then
// thread row 0 adds the slices in slice order. The order of additions depends
// only on the shape, never on scheduling, so the result is deterministic.
constexpr int kSumCols = 32;
constexpr int kSumSlices = 16;

__global__ void SumRowsKernel(int64_t rows, int64_t cols, const float* x,
                              float* out) {
  __shared__ double partial[kSumSlices][kSumCols];
  // The loop bound depends on blockIdx only, so every thread of the block
  // runs the same iterations and reaches the same __syncthreads.
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * kSumCols;
       first < cols; first += static_cast<int64_t>(gridDim.x) * kSumCols) {
    const int64_t col = first + threadIdx.x;
    double sum = 0.0;
    if (col < cols) {
      for (int64_t r = threadIdx.y; r < rows; r += kSumSlices) {
        sum += x[r * cols + col];
      }
    }
    partial[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
      double total = 0.0;
      for (int s = 0; s < kSumSlices; ++s) total += partial[s][threadIdx.x];
      out[col] = static_cast<float>(total);
    }
    __syncthreads();  // `partial` is reused by the next iteration.
  }
}

__global__ void ReluKernel(int64_t n, const float* in, float* out) {
  for (int64_t i = GlobalIndex(); i < n; i += GridStride()) {
    // As the CPU's std::max(v, 0): a NaN goes through (the ps's finiteness
    // check must see it), -0 stays -0.
    const float v = in[i];
    out[i] = v < 0.0f ? 0.0f : v;
  }
}

__global__ void ReluGradKernel(int64_t n, const float* y, const float* dy,
                               float* dx) {
  for (int64_t i = GlobalIndex(); i < n; i += GridStride()) {
    dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
  }
}

__global__ void MulKernel(int64_t n, const float* a, const float* b,
                          float* out) {
  for (int64_t i = GlobalIndex(); i < n; i += GridStride()) {
    out[i] = a[i] * b[i];
  }
}

__global__ void DropoutKernel(int64_t n, float rate, uint64_t seed,
                              const float* x, float* y, float* mask) {
  for (int64_t i = GlobalIndex(); i < n; i += GridStride()) {
    const float m = DropoutMaskValue(seed, static_cast<uint64_t>(i), rate);
    mask[i] = m;
    y[i] = x[i] * m;
  }
}

__global__ void AxpyKernel(int64_t n, float alpha, const float* x, float* y) {
  for (int64_t i = GlobalIndex(); i < n; i += GridStride()) {
    y[i] += alpha * x[i];
  }
}

__global__ void ScaleKernel(int64_t n, float alpha, float* x) {
  for (int64_t i = GlobalIndex(); i < n; i += GridStride()) {
    x[i] = alpha * x[i];
  }
}

// The losses: one row per thread, with the CPU backend's arithmetic
// (worker/device/loss_rows.h).
__global__ void SoftmaxCrossEntropyKernel(int64_t n, int64_t d, const float* z,
                                          const float* labels, double inv_count,
                                          float* dz, double* row_loss,
                                          int32_t* row_correct) {
  for (int64_t i = GlobalIndex(); i < n; i += GridStride()) {
    // The caller validates labels; a bad one must still not make this thread
    // read outside the row. Truncation toward zero, as the CPU's cast: valid
    // exactly when -1 < label < d (NaN fails both). d == 0 is checked too: a
    // label in (-1, 0) would pass and read row[0] of an empty row.
    const double label_value = labels[i];
    if (!(d > 0 && label_value > -1.0 &&
          label_value < static_cast<double>(d))) {
      row_loss[i] = __longlong_as_double(0x7ff8000000000000LL);  // NaN
      row_correct[i] = -1;
      continue;
    }
    bool correct = false;
    row_loss[i] = SoftmaxCrossEntropyRow(d, z + i * d, static_cast<int64_t>(label_value),
                                         inv_count, dz != nullptr ? dz + i * d : nullptr,
                                         &correct);
    row_correct[i] = correct ? 1 : 0;
  }
}

__global__ void RegressionKernel(bool absolute, int64_t n, int64_t d,
                                 const float* p, const float* t, double inv_d,
                                 double inv_nd, float* dp, double* row_loss) {
  for (int64_t i = GlobalIndex(); i < n; i += GridStride()) {
    row_loss[i] = RegressionRow(absolute, d, p + i * d, t + i * d, inv_d, inv_nd,
                                dp != nullptr ? dp + i * d : nullptr);
  }
}

}  // namespace

int LaunchAddBiasRows(void* stream, int64_t rows, int64_t cols,
                      const float* bias, float* x) {
  const int64_t total = rows * cols;
  if (total <= 0) return cudaSuccess;
  ClearStaleError();
  AddBiasRowsKernel<<<Blocks(total, kThreads), kThreads, 0, AsStream(stream)>>>(
      total, cols, bias, x);
  return LaunchError();
}

int LaunchSumRows(void* stream, int64_t rows, int64_t cols, const float* x,
                  float* out) {
  if (cols <= 0) return cudaSuccess;
  ClearStaleError();
  SumRowsKernel<<<Blocks(cols, kSumCols), dim3(kSumCols, kSumSlices), 0,
                  AsStream(stream)>>>(rows, cols, x, out);
  return LaunchError();
}

int LaunchRelu(void* stream, int64_t n, const float* in, float* out) {
  if (n <= 0) return cudaSuccess;
  ClearStaleError();
  ReluKernel<<<Blocks(n, kThreads), kThreads, 0, AsStream(stream)>>>(n, in,
                                                                     out);
  return LaunchError();
}

int LaunchReluGrad(void* stream, int64_t n, const float* y, const float* dy,
                   float* dx) {
  if (n <= 0) return cudaSuccess;
  ClearStaleError();
  ReluGradKernel<<<Blocks(n, kThreads), kThreads, 0, AsStream(stream)>>>(
      n, y, dy, dx);
  return LaunchError();
}

int LaunchMul(void* stream, int64_t n, const float* a, const float* b,
              float* out) {
  if (n <= 0) return cudaSuccess;
  ClearStaleError();
  MulKernel<<<Blocks(n, kThreads), kThreads, 0, AsStream(stream)>>>(n, a, b,
                                                                    out);
  return LaunchError();
}

int LaunchDropout(void* stream, int64_t n, float rate, uint64_t seed,
                  const float* x, float* y, float* mask) {
  if (n <= 0) return cudaSuccess;
  ClearStaleError();
  DropoutKernel<<<Blocks(n, kThreads), kThreads, 0, AsStream(stream)>>>(
      n, rate, seed, x, y, mask);
  return LaunchError();
}

int LaunchAxpy(void* stream, int64_t n, float alpha, const float* x, float* y) {
  if (n <= 0) return cudaSuccess;
  ClearStaleError();
  AxpyKernel<<<Blocks(n, kThreads), kThreads, 0, AsStream(stream)>>>(n, alpha,
                                                                     x, y);
  return LaunchError();
}

int LaunchScale(void* stream, int64_t n, float alpha, float* x) {
  if (n <= 0) return cudaSuccess;
  ClearStaleError();
  ScaleKernel<<<Blocks(n, kThreads), kThreads, 0, AsStream(stream)>>>(n, alpha,
                                                                      x);
  return LaunchError();
}

// One thread per row: 128 threads per block so that a batch of a few hundred
// rows still spreads over several SMs.
constexpr int kLossThreads = 128;

int LaunchSoftmaxCrossEntropy(void* stream, int64_t n, int64_t d,
                              const float* logits, const float* labels,
                              double inv_count, float* dlogits,
                              double* row_loss, int32_t* row_correct) {
  if (n <= 0) return cudaSuccess;
  ClearStaleError();
  SoftmaxCrossEntropyKernel<<<Blocks(n, kLossThreads), kLossThreads, 0,
                              AsStream(stream)>>>(
      n, d, logits, labels, inv_count, dlogits, row_loss, row_correct);
  return LaunchError();
}

int LaunchRegression(void* stream, bool absolute, int64_t n, int64_t d,
                     const float* pred, const float* targets, double inv_d,
                     double inv_nd, float* dpred, double* row_loss) {
  if (n <= 0) return cudaSuccess;
  ClearStaleError();
  RegressionKernel<<<Blocks(n, kLossThreads), kLossThreads, 0,
                     AsStream(stream)>>>(absolute, n, d, pred, targets, inv_d,
                                         inv_nd, dpred, row_loss);
  return LaunchError();
}

}  // namespace towerps::worker::internal
