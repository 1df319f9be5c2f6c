// A row-major float32 tensor in one backend's memory (a GPU's, or the
// host's for the CPU backend).
//
// Owns its buffer (from Backend::Allocate, so a virtual device's limit
// applies) unless it is a view of host memory, which only a backend with
// host_memory() can use without a copy. Resize() keeps the allocation when
// the new size fits, so buffers reused every step cost nothing.
//
// Not thread-safe; movable, not copyable.
#ifndef TOWERPS_WORKER_DEVICE_DEVICE_TENSOR_H_
#define TOWERPS_WORKER_DEVICE_DEVICE_TENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/device/backend.h"

namespace towerps::worker {

class DeviceTensor {
 public:
  DeviceTensor() = default;
  // An empty tensor whose memory will come from `backend` (not owned; must
  // outlive the tensor).
  explicit DeviceTensor(Backend* backend) : backend_(backend) {}
  ~DeviceTensor() { Release(); }
  DeviceTensor(DeviceTensor&& other) noexcept { *this = std::move(other); }
  DeviceTensor& operator=(DeviceTensor&& other) noexcept;
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;

  // Changes the shape. Contents are unspecified afterwards. Allocates (and
  // frees the old buffer, or drops a view) when the current buffer is too
  // small; the backend's error (e.g. the device's memory limit) otherwise OK.
  // REQUIRES: a backend; every dimension >= 0.
  absl::Status Resize(std::vector<int64_t> shape);

  // Makes this tensor a view of `data` of `shape` (no copy; the memory must
  // outlive the view or the next Resize/View), freeing a buffer it owned. A
  // view of const data must not be written. REQUIRES: `data` is in this
  // backend's memory space (host memory for a host_memory() backend; e.g.
  // another virtual device's buffer on the same GPU). The next Resize makes
  // the tensor own a buffer again.
  void View(std::vector<int64_t> shape, float* data);
  void ViewHost(std::vector<int64_t> shape, float* data) { View(std::move(shape), data); }
  void ViewHost(std::vector<int64_t> shape, const float* data) {
    View(std::move(shape), const_cast<float*>(data));
  }

  Backend* backend() const { return backend_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t num_elements() const { return num_elements_; }
  float* data() { return data_; }
  const float* data() const { return data_; }
  bool is_view() const { return view_; }
  // "[2,3]".
  std::string ShapeString() const;

 private:
  void Release();

  Backend* backend_ = nullptr;
  std::vector<int64_t> shape_;
  int64_t num_elements_ = 0;
  float* data_ = nullptr;
  int64_t capacity_ = 0;  // Elements owned (0 for a view).
  bool view_ = false;
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_DEVICE_DEVICE_TENSOR_H_
