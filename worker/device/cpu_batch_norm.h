// Batch normalization of [n, c, spatial] tensors on the CPU, the CPU
// backend's.
//
// oneDNN 2.6 normalizes the plain layout our layers keep with its
// `ncsp_bnorm` kernel, and splits each channel's sums over its threads, so
// its bits follow the thread count (thread_bits: 14-15 million of the 25.7
// million outputs of a ResNet-18 layer's forward and backward differ at 2-8
// threads). Here every channel is
// reduced by one thread in a fixed order, the channels shared out over the
// calling thread's OpenMP team (cpu_team.h), so the bits do not depend on
// the thread count; batch_norm_benchmark compares the two for speed.
//
// A channel's sums (of x, of (x - mean)^2, of dy, of dy * (x - mean)) are
// taken in a fixed order: each image's plane of `spatial` floats is cut into
// blocks of kCpuBatchNormBlock; a block is summed in 8 float lanes (element
// k into lane k % 8, in order), the lanes added as ((0+4)+(2+6))+((1+5)+(3+7));
// the block sums are added in double, image by image, block by block. So the
// float rounding error grows with the block, not with n * spatial.
//
// Semantics (backend.h): mean and the BIASED variance of the batch; y =
// gamma * (x - mean) / sqrt(var + epsilon) + beta; the backward's dx holds
// the batch statistics' dependence on x.
//
// REQUIRES for every function: shape.Validate() is OK; no output aliases an
// input.
#ifndef TOWERPS_WORKER_DEVICE_CPU_BATCH_NORM_H_
#define TOWERPS_WORKER_DEVICE_CPU_BATCH_NORM_H_

#include <cstdint>

#include "worker/device/conv_shape.h"

namespace towerps::worker {

// Elements per float-summed block (a multiple of 8).
inline constexpr int64_t kCpuBatchNormBlock = 1024;

// Writes this batch's per-channel mean and biased variance, and y.
void CpuBatchNormForwardTraining(const BatchNormShape& shape, const float* x,
                                 const float* gamma, const float* beta, float* y,
                                 float* mean, float* var, int threads);
// y from the given statistics (the moving ones); element by element, so
// exact at any split.
void CpuBatchNormForwardInference(const BatchNormShape& shape, const float* x,
                                  const float* gamma, const float* beta,
                                  const float* mean, const float* var, float* y,
                                  int threads);
// dx, dgamma and dbeta, given the forward's x, gamma, and the mean and var
// it wrote.
void CpuBatchNormBackward(const BatchNormShape& shape, const float* x, const float* dy,
                          const float* gamma, const float* mean, const float* var,
                          float* dx, float* dgamma, float* dbeta, int threads);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_DEVICE_CPU_BATCH_NORM_H_
