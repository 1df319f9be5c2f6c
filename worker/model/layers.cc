#include "worker/model/layers.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace towerps::worker {
namespace {

// OK when `t` is [rows?, cols] (rows unchecked when < 0).
absl::Status CheckMatrix(const Layer& layer, const char* what,
                         const DeviceTensor& t, int64_t rows, int64_t cols) {
  if (t.rank() != 2 || (rows >= 0 && t.dim(0) != rows) ||
      (cols >= 0 && t.dim(1) != cols)) {
    return absl::InvalidArgumentError(absl::StrCat(
        layer.TypeName(), " layer '", layer.name(), "': ", what, " has shape ",
        t.ShapeString(), ", want [", rows < 0 ? "n" : absl::StrCat(rows), ",",
        cols < 0 ? "d" : absl::StrCat(cols), "]"));
  }
  return absl::OkStatus();
}

}  // namespace

Dense::Dense(Backend& backend, std::string name, int64_t input_dim,
             int64_t units, bool use_bias)
    : Layer(backend, std::move(name)),
      input_dim_(input_dim),
      units_(units),
      use_bias_(use_bias),
      kernel_(&backend),
      bias_(&backend),
      kernel_grad_(&backend),
      bias_grad_(&backend),
      bias_scratch_(&backend) {}

std::vector<DeviceTensor*> Dense::params() {
  if (!use_bias_) return {&kernel_};
  return {&kernel_, &bias_};
}

std::vector<DeviceTensor*> Dense::grads() {
  if (!use_bias_) return {&kernel_grad_};
  return {&kernel_grad_, &bias_grad_};
}

std::vector<std::vector<int64_t>> Layer::param_shapes() const {
  std::vector<std::vector<int64_t>> shapes;
  for (ParamSpec& p : param_specs()) shapes.push_back(std::move(p.shape));
  return shapes;
}

int64_t Layer::num_params() const {
  int64_t total = 0;
  for (const ParamSpec& p : param_specs()) {
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    total += n;
  }
  return total;
}

absl::Status Layer::BackwardInput(const DeviceTensor&, const DeviceTensor&,
                                  const DeviceTensor&, DeviceTensor*) {
  return absl::UnimplementedError(
      absl::StrCat("layer '", name(), "' (", TypeName(), ") has no BackwardInput"));
}

absl::Status Layer::BackwardParams(const DeviceTensor&, const DeviceTensor&,
                                   const DeviceTensor&, bool) {
  return absl::UnimplementedError(
      absl::StrCat("layer '", name(), "' (", TypeName(), ") has no BackwardParams"));
}

std::vector<Layer::ParamSpec> Dense::param_specs() const {
  std::vector<ParamSpec> specs;
  specs.push_back({"kernel", {input_dim_, units_}, ParamSpec::Init::kGlorotUniform,
                   input_dim_, units_});
  if (use_bias_) specs.push_back({"bias", {units_}, ParamSpec::Init::kZeros});
  return specs;
}

absl::Status Dense::Forward(const DeviceTensor& x, DeviceTensor* y) {
  TOWERPS_RETURN_IF_ERROR(CheckMatrix(*this, "input", x, -1, input_dim_));
  const int64_t n = x.dim(0);
  TOWERPS_RETURN_IF_ERROR(y->Resize({n, units_}));
  backend_.Gemm(false, false, n, units_, input_dim_, 1.0f, x.data(),
                kernel_.data(), 0.0f, y->data());
  if (use_bias_) backend_.AddBiasRows(n, units_, bias_.data(), y->data());
  return absl::OkStatus();
}

absl::Status Dense::Backward(const DeviceTensor& x, const DeviceTensor& y,
                             const DeviceTensor& dy, DeviceTensor* dx,
                             bool accumulate) {
  TOWERPS_RETURN_IF_ERROR(BackwardParams(x, y, dy, accumulate));
  return dx != nullptr ? BackwardInput(x, y, dy, dx) : absl::OkStatus();
}

absl::Status Dense::BackwardParams(const DeviceTensor& x, const DeviceTensor& y,
                                   const DeviceTensor& dy, bool accumulate) {
  TOWERPS_RETURN_IF_ERROR(CheckMatrix(*this, "input", x, -1, input_dim_));
  const int64_t n = x.dim(0);
  TOWERPS_RETURN_IF_ERROR(CheckMatrix(*this, "output gradient", dy, n, units_));
  // dW (+)= x^T dy; db (+)= column sums of dy.
  backend_.Gemm(true, false, input_dim_, units_, n, 1.0f, x.data(), dy.data(),
                accumulate ? 1.0f : 0.0f, kernel_grad_.data());
  if (use_bias_) {
    if (accumulate) {
      TOWERPS_RETURN_IF_ERROR(bias_scratch_.Resize({units_}));
      backend_.SumRows(n, units_, dy.data(), bias_scratch_.data());
      backend_.Axpy(units_, 1.0f, bias_scratch_.data(), bias_grad_.data());
    } else {
      backend_.SumRows(n, units_, dy.data(), bias_grad_.data());
    }
  }
  return absl::OkStatus();
}

absl::Status Dense::BackwardInput(const DeviceTensor& x, const DeviceTensor& y,
                                  const DeviceTensor& dy, DeviceTensor* dx) {
  TOWERPS_RETURN_IF_ERROR(CheckMatrix(*this, "input", x, -1, input_dim_));
  const int64_t n = x.dim(0);
  TOWERPS_RETURN_IF_ERROR(CheckMatrix(*this, "output gradient", dy, n, units_));
  // dx = dy W^T.
  TOWERPS_RETURN_IF_ERROR(dx->Resize({n, input_dim_}));
  backend_.Gemm(false, true, n, input_dim_, units_, 1.0f, dy.data(),
                kernel_.data(), 0.0f, dx->data());
  return absl::OkStatus();
}

absl::Status ReLU::Forward(const DeviceTensor& x, DeviceTensor* y) {
  TOWERPS_RETURN_IF_ERROR(CheckMatrix(*this, "input", x, -1, -1));
  TOWERPS_RETURN_IF_ERROR(y->Resize(x.shape()));
  backend_.Relu(x.num_elements(), x.data(), y->data());
  return absl::OkStatus();
}

absl::Status ReLU::Backward(const DeviceTensor& x, const DeviceTensor& y,
                            const DeviceTensor& dy, DeviceTensor* dx,
                            bool /*accumulate*/) {
  if (y.shape() != x.shape() || dy.shape() != x.shape()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReLU layer '", name(), "': input ", x.ShapeString(),
                     ", output ", y.ShapeString(), " and output gradient ",
                     dy.ShapeString(), " must have the same shape"));
  }
  if (dx == nullptr) return absl::OkStatus();
  TOWERPS_RETURN_IF_ERROR(dx->Resize(x.shape()));
  backend_.ReluGrad(x.num_elements(), y.data(), dy.data(), dx->data());
  return absl::OkStatus();
}

}  // namespace towerps::worker
