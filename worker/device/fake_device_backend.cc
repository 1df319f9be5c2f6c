#include "worker/device/fake_device_backend.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace towerps::worker {
namespace {

// Allocations of every fake backend, by space, so that backends of one space
// accept each other's buffers (as virtual devices of one GPU do).
struct Registry {
  absl::Mutex mu;
  // start -> (n, space)
  std::map<const float*, std::pair<int64_t, int>> blocks ABSL_GUARDED_BY(mu);
};
std::atomic<int64_t> host_to_device{0};
std::atomic<int64_t> device_to_device{0};

Registry& Blocks() {
  static Registry* r = new Registry();
  return *r;
}

class FakeBackend : public Backend {
 public:
  FakeBackend(int space, std::vector<std::string>* violations)
      : space_(space), violations_(violations), cpu_(NewCpuBackend()) {}

  std::string memory_space() const override { return absl::StrCat("fake:", space_); }

  absl::StatusOr<float*> Allocate(int64_t n) override {
    float* p = new float[std::max<int64_t>(n, 1)];
    std::fill(p, p + std::max<int64_t>(n, 1), std::numeric_limits<float>::quiet_NaN());
    Registry& r = Blocks();
    absl::MutexLock lock(&r.mu);
    r.blocks[p] = {std::max<int64_t>(n, 1), space_};
    return p;
  }
  void Free(float* p) override {
    if (p == nullptr) return;
    {
      Registry& r = Blocks();
      absl::MutexLock lock(&r.mu);
      r.blocks.erase(p);
    }
    delete[] p;
  }
  void CopyFromHost(const float* src, int64_t n, float* dst) override {
    Check("CopyFromHost dst", dst, n);
    host_to_device += n;
    if (n > 0) std::memcpy(dst, src, n * sizeof(float));
  }
  absl::Status CopyToHost(const float* src, int64_t n, float* dst) override {
    Check("CopyToHost src", src, n);
    if (n > 0) std::memcpy(dst, src, n * sizeof(float));
    return absl::OkStatus();
  }
  absl::Status CopyFrom(Backend& from, const float* src, int64_t n, float* dst) override {
    Check("CopyFrom dst", dst, n);
    device_to_device += n;
    if (n > 0) std::memcpy(dst, src, n * sizeof(float));
    return absl::OkStatus();
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }

  void Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
            const float* b, float beta, float* c) override {
    Check("Gemm A", a, m * k);
    Check("Gemm B", b, k * n);
    Check("Gemm C", c, m * n);
    cpu_->Gemm(ta, tb, m, n, k, alpha, a, b, beta, c);
  }
  void AddBiasRows(int64_t rows, int64_t cols, const float* bias, float* x) override {
    Check("AddBiasRows bias", bias, cols);
    Check("AddBiasRows x", x, rows * cols);
    cpu_->AddBiasRows(rows, cols, bias, x);
  }
  void SumRows(int64_t rows, int64_t cols, const float* x, float* out) override {
    Check("SumRows x", x, rows * cols);
    Check("SumRows out", out, cols);
    cpu_->SumRows(rows, cols, x, out);
  }
  void Relu(int64_t n, const float* in, float* out) override {
    Check("Relu in", in, n);
    Check("Relu out", out, n);
    cpu_->Relu(n, in, out);
  }
  void ReluGrad(int64_t n, const float* y, const float* dy, float* dx) override {
    Check("ReluGrad y", y, n);
    Check("ReluGrad dy", dy, n);
    Check("ReluGrad dx", dx, n);
    cpu_->ReluGrad(n, y, dy, dx);
  }
  void Axpy(int64_t n, float alpha, const float* x, float* y) override {
    Check("Axpy x", x, n);
    Check("Axpy y", y, n);
    cpu_->Axpy(n, alpha, x, y);
  }
  void Scale(int64_t n, float alpha, float* x) override {
    Check("Scale x", x, n);
    cpu_->Scale(n, alpha, x);
  }
  void Zero(int64_t n, float* x) override {
    Check("Zero x", x, n);
    cpu_->Zero(n, x);
  }
  absl::StatusOr<LossResult> Loss(LossKind kind, int64_t n, int64_t d, const float* pred,
                                  const float* labels, const float* targets, float* dpred,
                                  int64_t grad_count) override {
    Check("Loss pred", pred, n * d);
    if (labels != nullptr) Check("Loss labels", labels, n);
    if (targets != nullptr) Check("Loss targets", targets, n * d);
    if (dpred != nullptr) Check("Loss dpred", dpred, n * d);
    return cpu_->Loss(kind, n, d, pred, labels, targets, dpred, grad_count);
  }

  // Convolution and pooling: the CPU backend's oneDNN kernels, after the
  // same checks (only for a valid shape: an invalid one has no sizes, and the
  // CPU backend returns its InvalidArgument).
  absl::Status Conv2DForward(const Conv2DShape& sh, const float* x, const float* w,
                             const float* b, float* y) override {
    if (sh.Validate().ok()) {
      Check("Conv2DForward x", x, sh.x_size());
      Check("Conv2DForward w", w, sh.w_size());
      if (b != nullptr) Check("Conv2DForward b", b, sh.k);
      Check("Conv2DForward y", y, sh.y_size());
    }
    return cpu_->Conv2DForward(sh, x, w, b, y);
  }
  absl::Status Conv2DBackwardData(const Conv2DShape& sh, const float* dy, const float* w,
                                  float* dx) override {
    if (sh.Validate().ok()) {
      Check("Conv2DBackwardData dy", dy, sh.y_size());
      Check("Conv2DBackwardData w", w, sh.w_size());
      Check("Conv2DBackwardData dx", dx, sh.x_size());
    }
    return cpu_->Conv2DBackwardData(sh, dy, w, dx);
  }
  absl::Status Conv2DBackwardWeights(const Conv2DShape& sh, const float* x, const float* dy,
                                     float* dw, float* db) override {
    if (sh.Validate().ok()) {
      Check("Conv2DBackwardWeights x", x, sh.x_size());
      Check("Conv2DBackwardWeights dy", dy, sh.y_size());
      Check("Conv2DBackwardWeights dw", dw, sh.w_size());
      if (db != nullptr) Check("Conv2DBackwardWeights db", db, sh.k);
    }
    return cpu_->Conv2DBackwardWeights(sh, x, dy, dw, db);
  }
  absl::Status MaxPool2DForward(const Pool2DShape& sh, const float* x, float* y,
                                float* workspace) override {
    if (sh.Validate().ok()) {
      Check("MaxPool2DForward x", x, sh.x_size());
      Check("MaxPool2DForward y", y, sh.y_size());
      Check("MaxPool2DForward workspace", workspace, sh.workspace_size());
    }
    return cpu_->MaxPool2DForward(sh, x, y, workspace);
  }
  absl::Status MaxPool2DBackward(const Pool2DShape& sh, const float* x, const float* y,
                                 const float* workspace, const float* dy,
                                 float* dx) override {
    if (sh.Validate().ok()) {
      Check("MaxPool2DBackward x", x, sh.x_size());
      Check("MaxPool2DBackward y", y, sh.y_size());
      Check("MaxPool2DBackward workspace", workspace, sh.workspace_size());
      Check("MaxPool2DBackward dy", dy, sh.y_size());
      Check("MaxPool2DBackward dx", dx, sh.x_size());
    }
    return cpu_->MaxPool2DBackward(sh, x, y, workspace, dy, dx);
  }
  absl::Status AvgPool2DForward(const Pool2DShape& sh, const float* x, float* y) override {
    if (sh.Validate().ok()) {
      Check("AvgPool2DForward x", x, sh.x_size());
      Check("AvgPool2DForward y", y, sh.y_size());
    }
    return cpu_->AvgPool2DForward(sh, x, y);
  }
  absl::Status AvgPool2DBackward(const Pool2DShape& sh, const float* dy, float* dx) override {
    if (sh.Validate().ok()) {
      Check("AvgPool2DBackward dy", dy, sh.y_size());
      Check("AvgPool2DBackward dx", dx, sh.x_size());
    }
    return cpu_->AvgPool2DBackward(sh, dy, dx);
  }
  absl::Status BatchNormForwardTraining(const BatchNormShape& sh, const float* x,
                                        const float* gamma, const float* beta, float* y,
                                        float* mean, float* var) override {
    if (sh.Validate().ok()) {
      Check("BatchNormForwardTraining x", x, sh.x_size());
      Check("BatchNormForwardTraining gamma", gamma, sh.c);
      Check("BatchNormForwardTraining beta", beta, sh.c);
      Check("BatchNormForwardTraining y", y, sh.x_size());
      Check("BatchNormForwardTraining mean", mean, sh.c);
      Check("BatchNormForwardTraining var", var, sh.c);
    }
    return cpu_->BatchNormForwardTraining(sh, x, gamma, beta, y, mean, var);
  }
  absl::Status BatchNormForwardInference(const BatchNormShape& sh, const float* x,
                                         const float* gamma, const float* beta, const float* mean,
                                         const float* var, float* y) override {
    if (sh.Validate().ok()) {
      Check("BatchNormForwardInference x", x, sh.x_size());
      Check("BatchNormForwardInference gamma", gamma, sh.c);
      Check("BatchNormForwardInference beta", beta, sh.c);
      Check("BatchNormForwardInference mean", mean, sh.c);
      Check("BatchNormForwardInference var", var, sh.c);
      Check("BatchNormForwardInference y", y, sh.x_size());
    }
    return cpu_->BatchNormForwardInference(sh, x, gamma, beta, mean, var, y);
  }
  absl::Status BatchNormBackward(const BatchNormShape& sh, const float* x, const float* dy,
                                 const float* gamma, const float* mean, const float* var,
                                 float* dx, float* dgamma, float* dbeta) override {
    if (sh.Validate().ok()) {
      Check("BatchNormBackward x", x, sh.x_size());
      Check("BatchNormBackward dy", dy, sh.x_size());
      Check("BatchNormBackward gamma", gamma, sh.c);
      Check("BatchNormBackward mean", mean, sh.c);
      Check("BatchNormBackward var", var, sh.c);
      Check("BatchNormBackward dx", dx, sh.x_size());
      Check("BatchNormBackward dgamma", dgamma, sh.c);
      Check("BatchNormBackward dbeta", dbeta, sh.c);
    }
    return cpu_->BatchNormBackward(sh, x, dy, gamma, mean, var, dx, dgamma, dbeta);
  }
  void DropoutForward(int64_t n, float rate, uint64_t seed, const float* x, float* y,
                      float* mask) override {
    Check("DropoutForward x", x, n);
    Check("DropoutForward y", y, n);
    Check("DropoutForward mask", mask, n);
    cpu_->DropoutForward(n, rate, seed, x, y, mask);
  }
  void Mul(int64_t n, const float* a, const float* b, float* out) override {
    Check("Mul a", a, n);
    Check("Mul b", b, n);
    Check("Mul out", out, n);
    cpu_->Mul(n, a, b, out);
  }

 private:
  // Records a violation unless [p, p + n) lies in one allocation of this
  // backend's space.
  void Check(const char* what, const float* p, int64_t n) {
    if (n <= 0) return;
    Registry& r = Blocks();
    absl::MutexLock lock(&r.mu);  // also guards *violations_
    auto& blocks = r.blocks;
    auto it = blocks.upper_bound(p);
    if (it != blocks.begin()) {
      --it;
      const float* start = it->first;
      if (p >= start && p + n <= start + it->second.first && it->second.second == space_) return;
    }
    violations_->push_back(absl::StrCat(memory_space(), " ", what, ": ", n,
                                        " floats not in this device's memory"));
  }

  const int space_;
  std::vector<std::string>* const violations_;
  const std::unique_ptr<Backend> cpu_;
};

}  // namespace

int64_t FakeHostToDeviceFloats() { return host_to_device; }
int64_t FakeDeviceToDeviceFloats() { return device_to_device; }

std::unique_ptr<Backend> NewFakeDeviceBackend(int space, std::vector<std::string>* violations) {
  return std::make_unique<FakeBackend>(space, violations);
}

}  // namespace towerps::worker
