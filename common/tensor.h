// A dense, row-major float32 tensor that owns its storage.
//
// Not thread-safe; one owner at a time. Resize() keeps the allocation when the
// new size fits, so buffers reused every step cost no fresh pages.
#ifndef TOWERPS_COMMON_TENSOR_H_
#define TOWERPS_COMMON_TENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"

namespace towerps::common {

class Tensor {
 public:
  Tensor() = default;
  // A zero-filled tensor of `shape`. REQUIRES: every dimension >= 0.
  explicit Tensor(std::vector<int64_t> shape);
  Tensor(std::vector<int64_t> shape, std::vector<float> values);

  const std::vector<int64_t>& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t num_elements() const { return static_cast<int64_t>(data_.size()); }
  int64_t num_bytes() const { return num_elements() * sizeof(float); }

  float* data() { return data_.data(); }
  const float* data() const { return data_.data(); }
  absl::Span<float> span() { return absl::MakeSpan(data_); }
  absl::Span<const float> span() const { return absl::MakeConstSpan(data_); }
  float& operator[](int64_t i) { return data_[i]; }
  float operator[](int64_t i) const { return data_[i]; }

  // Changes the shape; contents are unspecified afterwards (zero where the
  // tensor grew). Keeps the allocation when it is large enough.
  void Resize(std::vector<int64_t> shape);
  void Fill(float value);

  // "[2,3]".
  std::string ShapeString() const;

 private:
  std::vector<int64_t> shape_;
  std::vector<float> data_;
};

// Number of elements of `shape` (1 for a scalar).
int64_t NumElements(const std::vector<int64_t>& shape);

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_TENSOR_H_
