#include "common/tensor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_join.h"

namespace towerps::common {

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Tensor::Tensor(std::vector<int64_t> shape)
    : shape_(std::move(shape)), data_(NumElements(shape_), 0.0f) {}

Tensor::Tensor(std::vector<int64_t> shape, std::vector<float> values)
    : shape_(std::move(shape)), data_(std::move(values)) {
  data_.resize(NumElements(shape_), 0.0f);
}

Tensor::Tensor(const Tensor& other)
    : shape_(other.shape_), data_(other.data(), other.data() + other.num_elements()) {}

Tensor& Tensor::operator=(const Tensor& other) {
  if (this == &other) return *this;
  shape_ = other.shape_;
  data_.assign(other.data(), other.data() + other.num_elements());
  external_ = nullptr;
  external_elements_ = 0;
  return *this;
}

Tensor::Tensor(Tensor&& other) noexcept
    : shape_(std::move(other.shape_)),
      data_(std::move(other.data_)),
      external_(std::exchange(other.external_, nullptr)),
      external_elements_(std::exchange(other.external_elements_, 0)) {}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  shape_ = std::move(other.shape_);
  data_ = std::move(other.data_);
  external_ = std::exchange(other.external_, nullptr);
  external_elements_ = std::exchange(other.external_elements_, 0);
  return *this;
}

void Tensor::Resize(std::vector<int64_t> shape) {
  shape_ = std::move(shape);
  const int64_t n = NumElements(shape_);
  if (external_ != nullptr) {
    if (n == external_elements_) return;
    external_ = nullptr;
    external_elements_ = 0;
  }
  data_.resize(n);
}

void Tensor::MoveTo(float* where) {
  if (where == data()) return;
  const int64_t n = num_elements();
  if (where == nullptr) {
    if (external_ == nullptr) return;
    data_.assign(external_, external_ + n);
    external_ = nullptr;
    external_elements_ = 0;
    return;
  }
  std::copy(data(), data() + n, where);
  external_ = where;
  external_elements_ = n;
  std::vector<float>().swap(data_);
}

void Tensor::LiveAt(float* where) {
  if (where == data()) return;
  const int64_t n = num_elements();
  external_ = where;
  external_elements_ = n;
  std::vector<float>().swap(data_);
}

void Tensor::Fill(float value) { std::fill(data(), data() + num_elements(), value); }

std::string Tensor::ShapeString() const {
  return "[" + absl::StrJoin(shape_, ",") + "]";
}

}  // namespace towerps::common
