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

void Tensor::Resize(std::vector<int64_t> shape) {
  shape_ = std::move(shape);
  data_.resize(NumElements(shape_));
}

void Tensor::Fill(float value) { std::fill(data_.begin(), data_.end(), value); }

std::string Tensor::ShapeString() const {
  return "[" + absl::StrJoin(shape_, ",") + "]";
}

}  // namespace towerps::common
