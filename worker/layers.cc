#include "worker/layers.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace towerps::worker {
namespace {

// OK when `t` is [rows?, cols] (rows unchecked when < 0).
absl::Status CheckMatrix(const Layer& layer, const char* what,
                         const common::Tensor& t, int64_t rows, int64_t cols) {
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
      kernel_({input_dim, units}),
      kernel_grad_({input_dim, units}) {
  if (use_bias_) {
    bias_ = common::Tensor({units});
    bias_grad_ = common::Tensor({units});
  }
}

std::vector<common::Tensor*> Dense::params() {
  if (!use_bias_) return {&kernel_};
  return {&kernel_, &bias_};
}

std::vector<common::Tensor*> Dense::grads() {
  if (!use_bias_) return {&kernel_grad_};
  return {&kernel_grad_, &bias_grad_};
}

absl::Status Dense::Forward(const common::Tensor& x, common::Tensor* y) {
  TOWERPS_RETURN_IF_ERROR(CheckMatrix(*this, "input", x, -1, input_dim_));
  const int64_t n = x.dim(0);
  y->Resize({n, units_});
  backend_.Gemm(false, false, n, units_, input_dim_, 1.0f, x.data(),
                kernel_.data(), 0.0f, y->data());
  if (use_bias_) backend_.AddBiasRows(n, units_, bias_.data(), y->data());
  return absl::OkStatus();
}

absl::Status Dense::Backward(const common::Tensor& x, const common::Tensor& y,
                             const common::Tensor& dy, common::Tensor* dx) {
  TOWERPS_RETURN_IF_ERROR(CheckMatrix(*this, "input", x, -1, input_dim_));
  const int64_t n = x.dim(0);
  TOWERPS_RETURN_IF_ERROR(CheckMatrix(*this, "output gradient", dy, n, units_));
  // dW = x^T dy; db = column sums of dy; dx = dy W^T.
  backend_.Gemm(true, false, input_dim_, units_, n, 1.0f, x.data(), dy.data(),
                0.0f, kernel_grad_.data());
  if (use_bias_) backend_.SumRows(n, units_, dy.data(), bias_grad_.data());
  if (dx != nullptr) {
    dx->Resize({n, input_dim_});
    backend_.Gemm(false, true, n, input_dim_, units_, 1.0f, dy.data(),
                  kernel_.data(), 0.0f, dx->data());
  }
  return absl::OkStatus();
}

absl::Status ReLU::Forward(const common::Tensor& x, common::Tensor* y) {
  TOWERPS_RETURN_IF_ERROR(CheckMatrix(*this, "input", x, -1, -1));
  y->Resize(x.shape());
  backend_.Relu(x.num_elements(), x.data(), y->data());
  return absl::OkStatus();
}

absl::Status ReLU::Backward(const common::Tensor& x, const common::Tensor& y,
                            const common::Tensor& dy, common::Tensor* dx) {
  if (y.shape() != x.shape() || dy.shape() != x.shape()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReLU layer '", name(), "': input ", x.ShapeString(),
                     ", output ", y.ShapeString(), " and output gradient ",
                     dy.ShapeString(), " must have the same shape"));
  }
  if (dx == nullptr) return absl::OkStatus();
  dx->Resize(x.shape());
  backend_.ReluGrad(x.num_elements(), y.data(), dy.data(), dx->data());
  return absl::OkStatus();
}

}  // namespace towerps::worker
