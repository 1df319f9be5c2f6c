// Image layers: Conv2D, MaxPool2D, AvgPool2D (also global) and Flatten.
//
// Shapes: activations stay rank 2, [n, C*H*W], each row one example's image
// in CHW order (channel 0 row by row, then channel 1, ...), exactly the NCHW
// layout the Backend's convolution kernels take (worker/device/conv_shape.h).
// So the Model's plumbing (widths, devices, micro-batches, towers) is the one
// Dense layers use; an image layer knows its input image shape from
// construction and checks that the row width equals C*H*W. Weights are OIHW:
// a Conv2D kernel is [filters, C, kh, kw].
//
// Layers are built by their Create() factories, which validate the options
// and return InvalidArgument naming the layer and the field. Forward and
// Backward follow the Layer contract (worker/model/layers.h); an input whose
// width is not C*H*W is an InvalidArgument naming the layer. The backend's
// kernel errors come back as they are (e.g. Unavailable "cuDNN unavailable:
// ..." from the GPU backend on a machine without cuDNN).
//
// Not thread-safe, as every Layer.
#ifndef TOWERPS_WORKER_MODEL_CONV_LAYERS_H_
#define TOWERPS_WORKER_MODEL_CONV_LAYERS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/device/backend.h"
#include "worker/device/conv_shape.h"
#include "worker/device/device_tensor.h"
#include "worker/model/layers.h"

namespace towerps::worker {

// One example's image, channels first.
struct ImageDims {
  int64_t channels = 0;
  int64_t height = 0;
  int64_t width = 0;

  int64_t size() const { return channels * height * width; }
  bool operator==(const ImageDims& o) const {
    return channels == o.channels && height == o.height && width == o.width;
  }
  // Keras-like output shape with channels first: "(None, 32, 26, 26)".
  std::string ShapeString() const;
};

// Keras' padding modes. kSame pads so that the output has ceil(in / stride)
// rows and columns; supported only where that padding is the same on both
// sides (the backend's kernels pad symmetrically), e.g. odd kernels at
// stride 1.
enum class Padding { kValid, kSame };

// A layer whose input is an image. output_image() is what it produces; a
// layer that ends the image (GlobalAvgPool2D, Flatten) reports channels =
// OutputDim and height = width = 1.
class ImageLayer : public Layer {
 public:
  const ImageDims& input_image() const { return input_; }
  const ImageDims& output_image() const { return output_; }
  // The width of the rows this layer takes and gives.
  int64_t OutputDim(int64_t /*input_dim*/) const override { return output_.size(); }

 protected:
  ImageLayer(Backend& backend, std::string name, ImageDims input, ImageDims output)
      : Layer(backend, std::move(name)), input_(input), output_(output) {}

  // OK when x is [n, input_image().size()].
  absl::Status CheckInput(const DeviceTensor& x) const;
  // OK when t is [n, output_image().size()].
  absl::Status CheckOutput(const char* what, const DeviceTensor& t, int64_t n) const;

 private:
  const ImageDims input_;
  const ImageDims output_;
};

// y = conv(x, kernel) + bias (cross-correlation, as Keras). params() order:
// kernel [filters, C, kh, kw] (Glorot uniform, fan_in = C*kh*kw, fan_out =
// filters*kh*kw, as Keras), then, with a bias, bias [filters] (zeros).
class Conv2D : public ImageLayer {
 public:
  struct Options {
    int64_t filters = 0;   // REQUIRED > 0.
    int64_t kernel_h = 0;  // REQUIRED > 0.
    int64_t kernel_w = 0;  // REQUIRED > 0.
    int stride = 1;        // Both directions; >= 1.
    Padding padding = Padding::kValid;
    bool use_bias = true;
    // >= 0: this many zero rows and columns on every side instead of
    // `padding` (PyTorch's `padding=`; e.g. 1 for a 3x3 kernel at stride 2,
    // where Keras' SAME would be uneven). -1: use `padding`.
    int explicit_pad = -1;
  };
  // InvalidArgument naming the layer and the field when an option is out of
  // range, the input image is empty, the kernel does not fit the (padded)
  // image, or SAME padding would need different padding on the two sides.
  static absl::StatusOr<std::unique_ptr<Conv2D>> Create(Backend& backend, std::string name,
                                                        ImageDims input, const Options& options);

  std::string TypeName() const override { return "Conv2D"; }
  absl::Status Forward(const DeviceTensor& x, DeviceTensor* y) override;
  // With `accumulate`, the weight gradients of this call are computed into
  // scratch buffers and added (the backend's kernels overwrite).
  absl::Status Backward(const DeviceTensor& x, const DeviceTensor& y, const DeviceTensor& dy,
                        DeviceTensor* dx, bool accumulate) override;
  std::vector<DeviceTensor*> params() override;
  std::vector<DeviceTensor*> grads() override;
  std::vector<ParamSpec> param_specs() const override;

  // The kernels' shape for a batch of n examples.
  Conv2DShape ShapeFor(int64_t n) const;

 private:
  Conv2D(Backend& backend, std::string name, ImageDims input, ImageDims output,
         const Options& options, int pad_h, int pad_w);

  const Options options_;
  const int pad_h_;
  const int pad_w_;
  DeviceTensor kernel_;
  DeviceTensor bias_;
  DeviceTensor kernel_grad_;
  DeviceTensor bias_grad_;
  DeviceTensor kernel_scratch_;  // One micro-batch's kernel gradient.
  DeviceTensor bias_scratch_;    // One micro-batch's bias gradient.
};

// Max or average pooling over pool x pool windows. No parameters.
class Pool2D : public ImageLayer {
 public:
  enum class Kind { kMax, kAvg, kGlobalAvg };
  struct Options {
    Kind kind = Kind::kMax;
    int pool_size = 2;  // >= 1; ignored by kGlobalAvg (the whole image).
    int stride = 0;     // 0 means pool_size (Keras); ignored by kGlobalAvg.
    Padding padding = Padding::kValid;  // Ignored by kGlobalAvg.
  };
  // InvalidArgument naming the layer and the field as Conv2D::Create.
  // kGlobalAvg gives output_image() = {C, 1, 1}.
  static absl::StatusOr<std::unique_ptr<Pool2D>> Create(Backend& backend, std::string name,
                                                        ImageDims input, const Options& options);

  // "MaxPooling2D", "AveragePooling2D", "GlobalAveragePooling2D".
  std::string TypeName() const override;
  absl::Status Forward(const DeviceTensor& x, DeviceTensor* y) override;
  // Max pooling recomputes its forward (into scratch) to get the winners:
  // with micro-batches, several forwards run before their backwards, so the
  // workspace of the matching forward is gone.
  absl::Status Backward(const DeviceTensor& x, const DeviceTensor& y, const DeviceTensor& dy,
                        DeviceTensor* dx, bool accumulate) override;

  Pool2DShape ShapeFor(int64_t n) const;

 private:
  Pool2D(Backend& backend, std::string name, ImageDims input, ImageDims output, Kind kind,
         int window_h, int window_w, int stride, int pad_h, int pad_w);

  const Kind kind_;
  const int window_h_, window_w_, stride_, pad_h_, pad_w_;
  DeviceTensor workspace_;
  DeviceTensor y_scratch_;
};

// The identity on rows; output_image() = {C*H*W, 1, 1}. Exists for the
// summary and Keras parity: after it, Dense layers see a plain width.
class Flatten : public ImageLayer {
 public:
  Flatten(Backend& backend, std::string name, ImageDims input)
      : ImageLayer(backend, std::move(name), input, {input.size(), 1, 1}) {}

  std::string TypeName() const override { return "Flatten"; }
  absl::Status Forward(const DeviceTensor& x, DeviceTensor* y) override;
  absl::Status Backward(const DeviceTensor& x, const DeviceTensor& y, const DeviceTensor& dy,
                        DeviceTensor* dx, bool accumulate) override;
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_MODEL_CONV_LAYERS_H_
