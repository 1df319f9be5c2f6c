// Max and average pooling of NCHW images on the CPU, the CPU backend's.
//
// oneDNN 2.6 pools NCHW data with its reference kernel (`simple_nchw`): on
// cnn_small's 2x2 max pooling (batch 64, 32 channels, 26x26) 25.5 ms
// forward and 8.1 ms backward on one Zen core, most of that model's step,
// against 1.2 and 0.55 here (pool_benchmark; its JIT kernels, for blocked
// layouts, took 6.4 and 3.8 ms without the reorders to and from them).
// Here every image plane (one image's channel) is pooled by one thread in a
// fixed order, the planes shared out over the calling thread's OpenMP team
// (cpu_team.h), so the bits do not depend on the thread count.
//
// Semantics (backend.h): windows are clipped to the image (padding never
// wins a max and is not counted in a mean); a NaN in a window is its max;
// of equal maxima the first in row-major order wins.
//
// REQUIRES for every function: shape.Validate() is OK (every window then
// holds at least one pixel of the image); for max pooling also h * w <
// 2^31, the workspace's int32 offsets (CpuMaxPool2DFits).
#ifndef TOWERPS_WORKER_DEVICE_CPU_POOL_H_
#define TOWERPS_WORKER_DEVICE_CPU_POOL_H_

#include <cstdint>

#include "worker/device/conv_shape.h"

namespace towerps::worker {

// Whether max pooling can record `shape`'s winners (h * w < 2^31).
inline bool CpuMaxPool2DFits(const Pool2DShape& shape) {
  return shape.h * shape.w < (int64_t{1} << 31);
}

// y = each window's max; `workspace` (shape.workspace_size() floats) gets
// each winner's offset in its plane (as int32 bits), for the backward.
void CpuMaxPool2DForward(const Pool2DShape& shape, const float* x, float* y, float* workspace,
                         int threads);
// dx = dy added at each window's winner as CpuMaxPool2DForward recorded it
// in `workspace`; zero elsewhere.
void CpuMaxPool2DBackward(const Pool2DShape& shape, const float* workspace, const float* dy,
                          float* dx, int threads);
// y = each window's sum over its pixels in the image, divided by their count.
void CpuAvgPool2DForward(const Pool2DShape& shape, const float* x, float* y, int threads);
// dx = the sum, over the windows holding each pixel, of dy / the window's
// pixel count.
void CpuAvgPool2DBackward(const Pool2DShape& shape, const float* dy, float* dx, int threads);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_DEVICE_CPU_POOL_H_
