#include "worker/device/device_tensor.h"

#include <utility>

#include "common/tensor.h"

namespace towerps::worker {

DeviceTensor& DeviceTensor::operator=(DeviceTensor&& other) noexcept {
  if (this == &other) return *this;
  Release();
  backend_ = other.backend_;
  shape_ = std::move(other.shape_);
  num_elements_ = other.num_elements_;
  data_ = other.data_;
  capacity_ = other.capacity_;
  view_ = other.view_;
  other.shape_.clear();
  other.num_elements_ = 0;
  other.data_ = nullptr;
  other.capacity_ = 0;
  other.view_ = false;
  return *this;
}

void DeviceTensor::Release() {
  if (!view_ && data_ != nullptr && backend_ != nullptr) backend_->Free(data_);
  data_ = nullptr;
  capacity_ = 0;
  view_ = false;
}

absl::Status DeviceTensor::Resize(std::vector<int64_t> shape) {
  const int64_t n = common::NumElements(shape);
  if (view_ || n > capacity_) {
    Release();
    shape_.clear();
    num_elements_ = 0;
    if (n > 0) {
      absl::StatusOr<float*> p = backend_->Allocate(n);
      if (!p.ok()) return p.status();
      data_ = *p;
      capacity_ = n;
    }
  }
  shape_ = std::move(shape);
  num_elements_ = n;
  return absl::OkStatus();
}

void DeviceTensor::View(std::vector<int64_t> shape, float* data) {
  Release();
  num_elements_ = common::NumElements(shape);
  shape_ = std::move(shape);
  data_ = data;
  view_ = true;
}

std::string DeviceTensor::ShapeString() const {
  std::string s = "[";
  for (size_t i = 0; i < shape_.size(); ++i) {
    if (i > 0) s += ",";
    s += std::to_string(shape_[i]);
  }
  return s + "]";
}

}  // namespace towerps::worker
