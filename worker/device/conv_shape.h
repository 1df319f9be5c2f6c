// The shapes of 2-D convolution and pooling over NCHW float32 tensors, as the
// Backend's convolution kernels take them (worker/device/backend.h), with the
// output size and the validation every backend applies first.
//
// Plain value types; thread-compatible.
#ifndef TOWERPS_WORKER_DEVICE_CONV_SHAPE_H_
#define TOWERPS_WORKER_DEVICE_CONV_SHAPE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace towerps::worker {

// A convolution of x [n, c, h, w] (NCHW) with weights [k, c, r, s] (OIHW: out
// channel, in channel, kernel row, kernel column) and an optional bias [k],
// giving y [n, k, out_h(), out_w()]. Symmetric zero padding (pad_h rows above
// and below, pad_w columns left and right); no dilation, no groups. As in
// every deep-learning library, this is a cross-correlation: y[n,k,i,j] =
// b[k] + sum_{c,u,v} x[n, c, i*stride_h - pad_h + u, j*stride_w - pad_w + v]
// * w[k, c, u, v], where x outside the image reads as 0.
struct Conv2DShape {
  int64_t n = 0, c = 0, h = 0, w = 0;  // input: batch, channels, rows, columns
  int64_t k = 0;                       // output channels
  int64_t r = 0, s = 0;                // kernel rows, columns
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;

  int64_t out_h() const { return (h + 2 * pad_h - r) / stride_h + 1; }
  int64_t out_w() const { return (w + 2 * pad_w - s) / stride_w + 1; }
  int64_t x_size() const { return n * c * h * w; }
  int64_t w_size() const { return k * c * r * s; }
  int64_t y_size() const { return n * k * out_h() * out_w(); }

  // OK, or InvalidArgument naming the first bad field and its value:
  // n, c, h, w, k, r, s >= 1; strides >= 1; 0 <= pad < kernel size (a
  // window that is all padding has no input); the padded image at least as
  // large as the kernel.
  absl::Status Validate() const;
  // "n=3 c=4 h=7 w=5 k=2 r=3 s=3 stride=1x1 pad=1x1", for messages.
  std::string DebugString() const;
};

// Pooling of x [n, c, h, w] over windows of r x s, giving y [n, c, out_h(),
// out_w()]. Windows are clipped to the image: padding never wins a max and
// is not counted by an average. Global average pooling is r = h, s = w.
struct Pool2DShape {
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t r = 0, s = 0;  // window rows, columns
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;

  int64_t out_h() const { return (h + 2 * pad_h - r) / stride_h + 1; }
  int64_t out_w() const { return (w + 2 * pad_w - s) / stride_w + 1; }
  int64_t x_size() const { return n * c * h * w; }
  int64_t y_size() const { return n * c * out_h() * out_w(); }
  // Floats of the opaque workspace MaxPool2DForward writes and
  // MaxPool2DBackward reads: one per output element.
  int64_t workspace_size() const { return y_size(); }

  // As Conv2DShape::Validate (fields n, c, h, w, r, s, stride_*, pad_*).
  absl::Status Validate() const;
  std::string DebugString() const;
};

// Batch normalization of x [n, c, spatial]: NCHW with spatial = h * w, or
// dense rows [n, c] with spatial = 1. Each channel is normalized over its
// n * spatial values, with per-channel scale (gamma) and shift (beta).
struct BatchNormShape {
  int64_t n = 0, c = 0, spatial = 1;
  float epsilon = 1e-3f;  // Added to the variance (Keras' default).

  int64_t x_size() const { return n * c * spatial; }
  // OK, or InvalidArgument naming the first bad field: n, c, spatial >= 1,
  // epsilon > 0 and finite.
  absl::Status Validate() const;
  std::string DebugString() const;
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_DEVICE_CONV_SHAPE_H_
