// A dense, row-major float32 tensor that owns its storage, or (MoveTo) lives
// in memory someone else owns, such as a worker's shared memory segment.
//
// Not thread-safe; one owner at a time. Resize() keeps the allocation when the
// new size fits, so buffers reused every step cost no fresh pages. A copy
// always owns its storage.
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
  Tensor(const Tensor& other);
  Tensor& operator=(const Tensor& other);
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;

  const std::vector<int64_t>& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t num_elements() const {
    return external_ != nullptr ? external_elements_ : static_cast<int64_t>(data_.size());
  }
  int64_t num_bytes() const { return num_elements() * sizeof(float); }

  float* data() { return external_ != nullptr ? external_ : data_.data(); }
  const float* data() const { return external_ != nullptr ? external_ : data_.data(); }
  absl::Span<float> span() { return absl::MakeSpan(data(), num_elements()); }
  absl::Span<const float> span() const { return absl::MakeConstSpan(data(), num_elements()); }
  float& operator[](int64_t i) { return data()[i]; }
  float operator[](int64_t i) const { return data()[i]; }

  // Changes the shape; contents are unspecified afterwards (zero where the
  // tensor grew). Keeps the allocation when it is large enough; a tensor
  // living elsewhere (MoveTo) stays there when the number of elements is
  // unchanged, and otherwise owns a new allocation.
  void Resize(std::vector<int64_t> shape);
  // Copies the values to `where` and lives there from now on, freeing its
  // own allocation; MoveTo(nullptr) moves them back into an allocation of
  // its own. REQUIRES: `where` holds num_elements() floats, does not
  // overlap data(), and outlives the tensor (or its next MoveTo or Resize to
  // another size).
  void MoveTo(float* where);
  // Lives at `where` from now on without copying: its values become those
  // there, and its own allocation is freed (no page of `where` is touched).
  // For memory whose first reader comes after its first writer. REQUIRES:
  // `where` is not null; as MoveTo.
  void LiveAt(float* where);
  // Whether it lives in memory it does not own (MoveTo).
  bool external() const { return external_ != nullptr; }
  void Fill(float value);

  // "[2,3]".
  std::string ShapeString() const;

 private:
  std::vector<int64_t> shape_;
  std::vector<float> data_;  // owned storage; empty while external
  float* external_ = nullptr;
  int64_t external_elements_ = 0;
};

// Number of elements of `shape` (1 for a scalar).
int64_t NumElements(const std::vector<int64_t>& shape);

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_TENSOR_H_
