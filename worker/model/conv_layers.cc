#include "worker/model/conv_layers.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace towerps::worker {
namespace {

// The padding on each side that Keras' "same" needs for an input of `in`
// with window `k` and `stride`, or InvalidArgument when it is uneven.
absl::StatusOr<int> SamePadding(int64_t in, int64_t k, int stride, const std::string& label,
                                const char* dim) {
  const int64_t out = (in + stride - 1) / stride;
  const int64_t total = std::max<int64_t>((out - 1) * stride + k - in, 0);
  if (total % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": padding SAME needs ", total, " padding ", dim,
        " (uneven sides) for input ", in, ", window ", k, ", stride ", stride,
        "; only even (symmetric) padding is supported"));
  }
  return static_cast<int>(total / 2);
}

absl::Status CheckImage(const ImageDims& in, const std::string& label) {
  if (in.channels <= 0 || in.height <= 0 || in.width <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": input image shape must be positive, got ", in.channels, "x",
                     in.height, "x", in.width, " (channels x height x width)"));
  }
  return absl::OkStatus();
}

std::string Label(const char* type, const std::string& name) {
  return absl::StrCat(type, " layer '", name, "'");
}

}  // namespace

std::string ImageDims::ShapeString() const {
  if (height == 1 && width == 1) return absl::StrCat("(None, ", channels, ")");
  return absl::StrCat("(None, ", channels, ", ", height, ", ", width, ")");
}

absl::Status ImageLayer::CheckInput(const DeviceTensor& x) const {
  if (x.rank() != 2 || x.dim(1) != input_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        TypeName(), " layer '", name(), "': input has shape ", x.ShapeString(), ", want [n,",
        input_.size(), "] (an image ", input_.channels, "x", input_.height, "x", input_.width,
        " per row, CHW)"));
  }
  return absl::OkStatus();
}

absl::Status ImageLayer::CheckOutput(const char* what, const DeviceTensor& t, int64_t n) const {
  if (t.rank() != 2 || t.dim(0) != n || t.dim(1) != output_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(TypeName(), " layer '", name(), "': ", what,
                                                   " has shape ", t.ShapeString(), ", want [",
                                                   n, ",", output_.size(), "]"));
  }
  return absl::OkStatus();
}

// ---- Conv2D ------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Conv2D>> Conv2D::Create(Backend& backend, std::string name,
                                                       ImageDims input, const Options& options) {
  const std::string label = Label("Conv2D", name);
  TOWERPS_RETURN_IF_ERROR(CheckImage(input, label));
  if (options.filters <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": filters must be > 0, got ", options.filters));
  }
  if (options.kernel_h <= 0 || options.kernel_w <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": kernel_size must be > 0, got ",
                                                   options.kernel_h, "x", options.kernel_w));
  }
  if (options.stride <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": strides must be > 0, got ", options.stride));
  }
  int pad_h = 0, pad_w = 0;
  if (options.explicit_pad >= 0) {
    pad_h = pad_w = options.explicit_pad;
  } else if (options.padding == Padding::kSame) {
    TOWERPS_ASSIGN_OR_RETURN(pad_h, SamePadding(input.height, options.kernel_h, options.stride,
                                                label, "rows"));
    TOWERPS_ASSIGN_OR_RETURN(pad_w, SamePadding(input.width, options.kernel_w, options.stride,
                                                label, "columns"));
  }
  if (input.height + 2 * pad_h < options.kernel_h || input.width + 2 * pad_w < options.kernel_w) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": kernel_size ", options.kernel_h, "x", options.kernel_w,
        " does not fit the input image ", input.channels, "x", input.height, "x", input.width,
        options.padding == Padding::kValid ? " (padding VALID)" : ""));
  }
  Conv2DShape shape;
  shape.n = 1;
  shape.c = input.channels;
  shape.h = input.height;
  shape.w = input.width;
  shape.k = options.filters;
  shape.r = options.kernel_h;
  shape.s = options.kernel_w;
  shape.stride_h = shape.stride_w = options.stride;
  shape.pad_h = pad_h;
  shape.pad_w = pad_w;
  const absl::Status valid = shape.Validate();
  if (!valid.ok()) return absl::InvalidArgumentError(absl::StrCat(label, ": ", valid.message()));
  const ImageDims output{options.filters, shape.out_h(), shape.out_w()};
  return std::unique_ptr<Conv2D>(
      new Conv2D(backend, std::move(name), input, output, options, pad_h, pad_w));
}

Conv2D::Conv2D(Backend& backend, std::string name, ImageDims input, ImageDims output,
               const Options& options, int pad_h, int pad_w)
    : ImageLayer(backend, std::move(name), input, output),
      options_(options),
      pad_h_(pad_h),
      pad_w_(pad_w),
      kernel_(&backend),
      bias_(&backend),
      kernel_grad_(&backend),
      bias_grad_(&backend),
      kernel_scratch_(&backend),
      bias_scratch_(&backend) {}

Conv2DShape Conv2D::ShapeFor(int64_t n) const {
  Conv2DShape shape;
  shape.n = n;
  shape.c = input_image().channels;
  shape.h = input_image().height;
  shape.w = input_image().width;
  shape.k = options_.filters;
  shape.r = options_.kernel_h;
  shape.s = options_.kernel_w;
  shape.stride_h = shape.stride_w = options_.stride;
  shape.pad_h = pad_h_;
  shape.pad_w = pad_w_;
  return shape;
}

std::vector<DeviceTensor*> Conv2D::params() {
  if (!options_.use_bias) return {&kernel_};
  return {&kernel_, &bias_};
}

std::vector<DeviceTensor*> Conv2D::grads() {
  if (!options_.use_bias) return {&kernel_grad_};
  return {&kernel_grad_, &bias_grad_};
}

std::vector<Layer::ParamSpec> Conv2D::param_specs() const {
  const int64_t k = options_.filters, c = input_image().channels;
  const int64_t r = options_.kernel_h, s = options_.kernel_w;
  std::vector<ParamSpec> specs;
  specs.push_back({"kernel", {k, c, r, s}, ParamSpec::Init::kGlorotUniform, c * r * s, k * r * s});
  if (options_.use_bias) specs.push_back({"bias", {k}, ParamSpec::Init::kZeros});
  return specs;
}

absl::Status Conv2D::Forward(const DeviceTensor& x, DeviceTensor* y) {
  TOWERPS_RETURN_IF_ERROR(CheckInput(x));
  const int64_t n = x.dim(0);
  TOWERPS_RETURN_IF_ERROR(y->Resize({n, output_image().size()}));
  if (n == 0) return absl::OkStatus();
  return common::Annotate(
      backend_.Conv2DForward(ShapeFor(n), x.data(), kernel_.data(),
                             options_.use_bias ? bias_.data() : nullptr, y->data()),
      absl::StrCat("Conv2D layer '", name(), "'"));
}

absl::Status Conv2D::Backward(const DeviceTensor& x, const DeviceTensor& y,
                              const DeviceTensor& dy, DeviceTensor* dx, bool accumulate) {
  TOWERPS_RETURN_IF_ERROR(CheckInput(x));
  const int64_t n = x.dim(0);
  TOWERPS_RETURN_IF_ERROR(CheckOutput("output gradient", dy, n));
  const std::string where = absl::StrCat("Conv2D layer '", name(), "'");
  const Conv2DShape shape = ShapeFor(n);
  if (n == 0) {
    // Nothing to add; overwrite means zero.
    if (!accumulate) {
      backend_.Zero(kernel_grad_.num_elements(), kernel_grad_.data());
      if (options_.use_bias) backend_.Zero(bias_grad_.num_elements(), bias_grad_.data());
    }
    if (dx != nullptr) TOWERPS_RETURN_IF_ERROR(dx->Resize(x.shape()));
    return absl::OkStatus();
  }
  if (accumulate) {
    TOWERPS_RETURN_IF_ERROR(kernel_scratch_.Resize(kernel_grad_.shape()));
    if (options_.use_bias) TOWERPS_RETURN_IF_ERROR(bias_scratch_.Resize(bias_grad_.shape()));
    TOWERPS_RETURN_IF_ERROR(common::Annotate(
        backend_.Conv2DBackwardWeights(shape, x.data(), dy.data(), kernel_scratch_.data(),
                                       options_.use_bias ? bias_scratch_.data() : nullptr),
        where));
    backend_.Axpy(kernel_grad_.num_elements(), 1.0f, kernel_scratch_.data(), kernel_grad_.data());
    if (options_.use_bias) {
      backend_.Axpy(bias_grad_.num_elements(), 1.0f, bias_scratch_.data(), bias_grad_.data());
    }
  } else {
    TOWERPS_RETURN_IF_ERROR(common::Annotate(
        backend_.Conv2DBackwardWeights(shape, x.data(), dy.data(), kernel_grad_.data(),
                                       options_.use_bias ? bias_grad_.data() : nullptr),
        where));
  }
  if (dx != nullptr) {
    TOWERPS_RETURN_IF_ERROR(dx->Resize(x.shape()));
    TOWERPS_RETURN_IF_ERROR(common::Annotate(
        backend_.Conv2DBackwardData(shape, dy.data(), kernel_.data(), dx->data()), where));
  }
  return absl::OkStatus();
}

// ---- Pool2D ------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Pool2D>> Pool2D::Create(Backend& backend, std::string name,
                                                       ImageDims input, const Options& options) {
  const char* type = options.kind == Kind::kMax   ? "MaxPooling2D"
                     : options.kind == Kind::kAvg ? "AveragePooling2D"
                                                  : "GlobalAveragePooling2D";
  const std::string label = Label(type, name);
  TOWERPS_RETURN_IF_ERROR(CheckImage(input, label));
  if (options.kind == Kind::kGlobalAvg) {
    return std::unique_ptr<Pool2D>(new Pool2D(backend, std::move(name), input,
                                              {input.channels, 1, 1}, options.kind,
                                              static_cast<int>(input.height),
                                              static_cast<int>(input.width), 1, 0, 0));
  }
  if (options.pool_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": pool_size must be > 0, got ", options.pool_size));
  }
  if (options.stride < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": strides must be >= 0 (0: pool_size), got ", options.stride));
  }
  const int stride = options.stride == 0 ? options.pool_size : options.stride;
  int pad_h = 0, pad_w = 0;
  if (options.padding == Padding::kSame) {
    TOWERPS_ASSIGN_OR_RETURN(pad_h,
                             SamePadding(input.height, options.pool_size, stride, label, "rows"));
    TOWERPS_ASSIGN_OR_RETURN(pad_w,
                             SamePadding(input.width, options.pool_size, stride, label, "columns"));
  }
  if (input.height + 2 * pad_h < options.pool_size || input.width + 2 * pad_w < options.pool_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": pool_size ", options.pool_size, " does not fit the input image ",
        input.channels, "x", input.height, "x", input.width));
  }
  Pool2DShape shape;
  shape.n = 1;
  shape.c = input.channels;
  shape.h = input.height;
  shape.w = input.width;
  shape.r = shape.s = options.pool_size;
  shape.stride_h = shape.stride_w = stride;
  shape.pad_h = pad_h;
  shape.pad_w = pad_w;
  const absl::Status valid = shape.Validate();
  if (!valid.ok()) return absl::InvalidArgumentError(absl::StrCat(label, ": ", valid.message()));
  return std::unique_ptr<Pool2D>(new Pool2D(backend, std::move(name), input,
                                            {input.channels, shape.out_h(), shape.out_w()},
                                            options.kind, options.pool_size, options.pool_size,
                                            stride, pad_h, pad_w));
}

Pool2D::Pool2D(Backend& backend, std::string name, ImageDims input, ImageDims output, Kind kind,
               int window_h, int window_w, int stride, int pad_h, int pad_w)
    : ImageLayer(backend, std::move(name), input, output),
      kind_(kind),
      window_h_(window_h),
      window_w_(window_w),
      stride_(stride),
      pad_h_(pad_h),
      pad_w_(pad_w),
      workspace_(&backend),
      y_scratch_(&backend) {}

std::string Pool2D::TypeName() const {
  switch (kind_) {
    case Kind::kMax:
      return "MaxPooling2D";
    case Kind::kAvg:
      return "AveragePooling2D";
    case Kind::kGlobalAvg:
      return "GlobalAveragePooling2D";
  }
  return "Pool2D";
}

Pool2DShape Pool2D::ShapeFor(int64_t n) const {
  Pool2DShape shape;
  shape.n = n;
  shape.c = input_image().channels;
  shape.h = input_image().height;
  shape.w = input_image().width;
  shape.r = window_h_;
  shape.s = window_w_;
  shape.stride_h = shape.stride_w = stride_;
  shape.pad_h = pad_h_;
  shape.pad_w = pad_w_;
  return shape;
}

absl::Status Pool2D::Forward(const DeviceTensor& x, DeviceTensor* y) {
  TOWERPS_RETURN_IF_ERROR(CheckInput(x));
  const int64_t n = x.dim(0);
  TOWERPS_RETURN_IF_ERROR(y->Resize({n, output_image().size()}));
  if (n == 0) return absl::OkStatus();
  const Pool2DShape shape = ShapeFor(n);
  const std::string where = absl::StrCat(TypeName(), " layer '", name(), "'");
  if (kind_ == Kind::kMax) {
    TOWERPS_RETURN_IF_ERROR(workspace_.Resize({shape.workspace_size()}));
    return common::Annotate(
        backend_.MaxPool2DForward(shape, x.data(), y->data(), workspace_.data()), where);
  }
  return common::Annotate(backend_.AvgPool2DForward(shape, x.data(), y->data()), where);
}

absl::Status Pool2D::Backward(const DeviceTensor& x, const DeviceTensor& y,
                              const DeviceTensor& dy, DeviceTensor* dx, bool /*accumulate*/) {
  TOWERPS_RETURN_IF_ERROR(CheckInput(x));
  const int64_t n = x.dim(0);
  TOWERPS_RETURN_IF_ERROR(CheckOutput("output gradient", dy, n));
  if (dx == nullptr) return absl::OkStatus();
  TOWERPS_RETURN_IF_ERROR(dx->Resize(x.shape()));
  if (n == 0) return absl::OkStatus();
  const Pool2DShape shape = ShapeFor(n);
  const std::string where = absl::StrCat(TypeName(), " layer '", name(), "'");
  if (kind_ == Kind::kMax) {
    TOWERPS_RETURN_IF_ERROR(workspace_.Resize({shape.workspace_size()}));
    TOWERPS_RETURN_IF_ERROR(y_scratch_.Resize({n, output_image().size()}));
    TOWERPS_RETURN_IF_ERROR(common::Annotate(
        backend_.MaxPool2DForward(shape, x.data(), y_scratch_.data(), workspace_.data()), where));
    return common::Annotate(backend_.MaxPool2DBackward(shape, x.data(), y_scratch_.data(),
                                                       workspace_.data(), dy.data(), dx->data()),
                            where);
  }
  return common::Annotate(backend_.AvgPool2DBackward(shape, dy.data(), dx->data()), where);
}

// ---- Flatten -----------------------------------------------------------------

absl::Status Flatten::Forward(const DeviceTensor& x, DeviceTensor* y) {
  TOWERPS_RETURN_IF_ERROR(CheckInput(x));
  TOWERPS_RETURN_IF_ERROR(y->Resize(x.shape()));
  if (x.num_elements() == 0) return absl::OkStatus();
  return backend_.CopyFrom(backend_, x.data(), x.num_elements(), y->data());
}

absl::Status Flatten::Backward(const DeviceTensor& x, const DeviceTensor& y,
                               const DeviceTensor& dy, DeviceTensor* dx, bool /*accumulate*/) {
  TOWERPS_RETURN_IF_ERROR(CheckInput(x));
  TOWERPS_RETURN_IF_ERROR(CheckOutput("output gradient", dy, x.dim(0)));
  if (dx == nullptr) return absl::OkStatus();
  TOWERPS_RETURN_IF_ERROR(dx->Resize(x.shape()));
  if (x.num_elements() == 0) return absl::OkStatus();
  return backend_.CopyFrom(backend_, dy.data(), dy.num_elements(), dx->data());
}

}  // namespace towerps::worker
