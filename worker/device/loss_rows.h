// One row of each loss, the arithmetic both backends run: the CPU backend
// (worker/device/loss_kernels.cc, a loop over rows) and the CUDA kernels
// (worker/device/cuda_kernels.cu, a thread per row; nvcc compiles these functions
// for the device, with --fmad=false so that they round as the CPU does). Plain
// C++ with no library types, so that nvcc can read it. Inputs are trusted:
// label in [0, d), d > 0.
#ifndef TOWERPS_WORKER_DEVICE_LOSS_ROWS_H_
#define TOWERPS_WORKER_DEVICE_LOSS_ROWS_H_

#include <math.h>

#include <cstdint>

#if defined(__CUDACC__)
#define TOWERPS_HOST_DEVICE __host__ __device__
#else
#define TOWERPS_HOST_DEVICE
#endif

namespace towerps::worker {

// -log(softmax(row)[label]) over `d` logits, computed stably in double (the
// row maximum is subtracted before exponentiating). `*correct`: the first
// maximum (as std::max_element picks it) is `label`. When `drow` is non-null
// it receives (softmax(row) - onehot(label)) * inv_count.
TOWERPS_HOST_DEVICE inline double SoftmaxCrossEntropyRow(int64_t d, const float* row,
                                                         int64_t label, double inv_count,
                                                         float* drow, bool* correct) {
  int64_t argmax = 0;
  for (int64_t j = 1; j < d; ++j) {
    if (row[argmax] < row[j]) argmax = j;
  }
  const double max = row[argmax];
  double sum = 0.0;  // shifted logits are all <= 0
  for (int64_t j = 0; j < d; ++j) sum += exp(row[j] - max);
  *correct = argmax == label;
  if (drow != nullptr) {
    for (int64_t j = 0; j < d; ++j) {
      const double p = exp(row[j] - max) / sum;
      drow[j] = static_cast<float>((p - (j == label ? 1.0 : 0.0)) * inv_count);
    }
  }
  return log(sum) - (row[label] - max);
}

// Mean over `d` of (p - t)^2 (MSE) or |p - t| (MAE), as example * inv_d with
// inv_d = 1 / d. When `dp` is non-null it receives the derivative times
// inv_nd (2 (p - t) for MSE; sign(p - t), 0 at equality, for MAE).
TOWERPS_HOST_DEVICE inline double RegressionRow(bool absolute, int64_t d, const float* p,
                                                const float* t, double inv_d, double inv_nd,
                                                float* dp) {
  double example = 0.0;
  for (int64_t j = 0; j < d; ++j) {
    const double diff = static_cast<double>(p[j]) - t[j];
    if (absolute) {
      example += fabs(diff);
      if (dp != nullptr) {
        const double sign = diff > 0 ? 1.0 : (diff < 0 ? -1.0 : 0.0);
        dp[j] = static_cast<float>(sign * inv_nd);
      }
    } else {
      example += diff * diff;
      if (dp != nullptr) dp[j] = static_cast<float>(2.0 * diff * inv_nd);
    }
  }
  return example * inv_d;
}

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_DEVICE_LOSS_ROWS_H_
