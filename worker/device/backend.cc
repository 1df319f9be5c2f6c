#include "worker/device/backend.h"

#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/device/cpu_batch_norm.h"
#include "worker/device/cpu_gemm.h"
#include "worker/device/cpu_pool.h"
#include "worker/device/cpu_team.h"
#include "worker/device/cpu_threads.h"
#include "worker/device/device_manager.h"
#include "worker/device/dnnl_kernels.h"
#include "worker/device/dropout_mask.h"
#include "worker/device/loss_kernels.h"

namespace towerps::worker {
namespace {

// CBLAS takes `int` sizes (OpenBLAS' default LP64 interface). The layers' sizes
// are far below 2^31 elements per dimension; a larger one is our bug.
int ToBlasInt(int64_t v) { return static_cast<int>(v); }

constexpr int64_t kMaxChunk = int64_t{1} << 30;

// Below this many elements, one thread is as fast as waking the team.
constexpr int64_t kMinSplitElements = int64_t{1} << 15;

// Calls slice(begin, end) over [0, n) in contiguous slices shared out over
// the CPU math team (cpu_team.h) when n is large enough; the slices start
// at multiples of 16 floats, so in a 64-byte-aligned buffer (the
// allocator's) no two threads write the same cache line. For elementwise
// ops, whose bits do not depend on the split. (cpu_pool and cpu_batch_norm
// keep the same 2^15 threshold for their own splits.)
template <typename F>
void ForEachSlice(int64_t n, F slice) {
  const int threads = n < kMinSplitElements ? 1 : CpuMathThreads();
  RunOnTeam(threads, [&](int part, int parts) {
    constexpr int64_t kLine = 16;  // floats
    const int64_t begin = part == 0 ? 0 : (n * part / parts) / kLine * kLine;
    const int64_t end = part + 1 == parts ? n : (n * (part + 1) / parts) / kLine * kLine;
    if (begin < end) slice(begin, end);
  });
}

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(Allocator* allocator) : allocator_(allocator) {}

  std::string memory_space() const override { return "cpu"; }

  absl::StatusOr<float*> Allocate(int64_t n) override {
    if (n < 0) return absl::InvalidArgumentError("cannot allocate a negative size");
    const int64_t bytes = n * static_cast<int64_t>(sizeof(float));
    if (allocator_ != nullptr) {
      absl::StatusOr<void*> p = allocator_->Allocate(bytes);
      if (!p.ok()) return p.status();
      return static_cast<float*>(*p);
    }
    // 64-byte aligned, as the allocators' host memory is.
    void* p = std::aligned_alloc(64, std::max<int64_t>(64, (bytes + 63) / 64 * 64));
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("host: cannot allocate ", bytes, " bytes"));
    }
    return static_cast<float*>(p);
  }

  void Free(float* p) override {
    if (p == nullptr) return;
    if (allocator_ != nullptr) {
      allocator_->Deallocate(p);
    } else {
      std::free(p);
    }
  }

  void CopyFromHost(const float* src, int64_t n, float* dst) override {
    if (n > 0 && src != dst) std::memcpy(dst, src, n * sizeof(float));
  }

  absl::Status CopyToHost(const float* src, int64_t n, float* dst) override {
    if (n > 0 && src != dst) std::memcpy(dst, src, n * sizeof(float));
    return absl::OkStatus();
  }

  absl::Status CopyFrom(Backend& from, const float* src, int64_t n,
                        float* dst) override {
    if (from.host_memory()) {
      CopyFromHost(src, n, dst);
      return absl::OkStatus();
    }
    return from.CopyToHost(src, n, dst);
  }

  absl::Status Synchronize() override { return absl::OkStatus(); }

  void Zero(int64_t n, float* x) override {
    if (n > 0) std::memset(x, 0, n * sizeof(float));
  }

  absl::StatusOr<LossResult> Loss(LossKind kind, int64_t n, int64_t d,
                                  const float* pred, const float* labels,
                                  const float* targets, float* dpred,
                                  int64_t grad_count) override {
    LossResult r;
    absl::Status s =
        HostLoss(kind, n, d, pred, labels, targets, dpred, grad_count, &r);
    if (!s.ok()) return s;
    return r;
  }

  void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
            float alpha, const float* a, const float* b, float beta,
            float* c) override {
    if (m == 0 || n == 0) return;
    if (k == 0) {
      // BLAS would leave C alone when k == 0 only for beta == 1; make the
      // contract (C = beta * C) explicit and avoid 0 * NaN for beta == 0.
      if (beta == 0.0f) {
        std::fill(c, c + m * n, 0.0f);
      } else {
        Scale(m * n, beta, c);
      }
      return;
    }
    // The same bits at any thread count (cpu_gemm.h).
    CpuGemm(CpuMathThreads(), trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
  }

  void AddBiasRows(int64_t rows, int64_t cols, const float* bias,
                   float* x) override {
    // One saxpy per row; rows are contiguous, so this streams through memory
    // once.
    for (int64_t r = 0; r < rows; ++r) {
      cblas_saxpy(ToBlasInt(cols), 1.0f, bias, 1, x + r * cols, 1);
    }
  }

  void SumRows(int64_t rows, int64_t cols, const float* x,
               float* out) override {
    if (cols == 0) return;
    if (rows == 0) {
      std::fill(out, out + cols, 0.0f);
      return;
    }
    // out = x^T * ones: one gemv over the whole matrix.
    if (static_cast<int64_t>(ones_.size()) < rows) ones_.assign(rows, 1.0f);
    cblas_sgemv(CblasRowMajor, CblasTrans, ToBlasInt(rows), ToBlasInt(cols),
                1.0f, x, ToBlasInt(cols), ones_.data(), 1, 0.0f, out, 1);
  }

  // Selects with every operand loaded unconditionally, which the vectorizer
  // (-O3, see BUILD) turns into SIMD max and blends: as a branch per element
  // on activations about half positive, these two loops were 40% of
  // cnn_small's step (perf, worker_throughput). Large tensors are shared
  // out over the team: on one thread, ReLU and its gradient were 2.8% of
  // ResNet-20's samples at 2 threads while the other thread waited.
  void Relu(int64_t n, const float* in, float* out) override {
    ForEachSlice(n, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) out[i] = std::max(in[i], 0.0f);
    });
  }

  void ReluGrad(int64_t n, const float* y, const float* dy,
                float* dx) override {
    ForEachSlice(n, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const float g = dy[i];
        dx[i] = y[i] > 0.0f ? g : 0.0f;
      }
    });
  }

  // Axpy and Scale run over whole flattened variables, which may exceed an
  // `int`; they go in chunks.
  void Axpy(int64_t n, float alpha, const float* x, float* y) override {
    for (int64_t i = 0; i < n; i += kMaxChunk) {
      cblas_saxpy(ToBlasInt(std::min(kMaxChunk, n - i)), alpha, x + i, 1, y + i,
                  1);
    }
  }

  void Scale(int64_t n, float alpha, float* x) override {
    for (int64_t i = 0; i < n; i += kMaxChunk) {
      cblas_sscal(ToBlasInt(std::min(kMaxChunk, n - i)), alpha, x + i, 1);
    }
  }

  absl::Status Conv2DForward(const Conv2DShape& shape, const float* x,
                             const float* w, const float* b,
                             float* y) override {
    absl::StatusOr<DnnlKernels*> k = Dnnl();
    if (!k.ok()) return k.status();
    return (*k)->Conv2DForward(shape, x, w, b, y);
  }

  absl::Status Conv2DBackwardData(const Conv2DShape& shape, const float* dy,
                                  const float* w, float* dx) override {
    absl::StatusOr<DnnlKernels*> k = Dnnl();
    if (!k.ok()) return k.status();
    return (*k)->Conv2DBackwardData(shape, dy, w, dx);
  }

  absl::Status Conv2DBackwardWeights(const Conv2DShape& shape, const float* x,
                                     const float* dy, float* dw,
                                     float* db) override {
    absl::StatusOr<DnnlKernels*> k = Dnnl();
    if (!k.ok()) return k.status();
    return (*k)->Conv2DBackwardWeights(shape, x, dy, dw, db);
  }

  // Pooling: our own NCHW kernels (cpu_pool.h says why not oneDNN's).
  static absl::Status MaxPoolShapeFits(const Pool2DShape& shape) {
    if (absl::Status st = shape.Validate(); !st.ok()) return st;
    if (!CpuMaxPool2DFits(shape)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Pool2DShape: h * w = ", shape.h * shape.w,
          " pixels per plane, more than the CPU backend's max pooling records (2^31 - 1)"));
    }
    return absl::OkStatus();
  }

  absl::Status MaxPool2DForward(const Pool2DShape& shape, const float* x,
                                float* y, float* workspace) override {
    if (absl::Status st = MaxPoolShapeFits(shape); !st.ok()) return st;
    CpuMaxPool2DForward(shape, x, y, workspace, CpuMathThreads());
    return absl::OkStatus();
  }

  // The winners come from the forward's workspace; x and y are not needed.
  absl::Status MaxPool2DBackward(const Pool2DShape& shape, const float* x,
                                 const float* y, const float* workspace,
                                 const float* dy, float* dx) override {
    if (absl::Status st = MaxPoolShapeFits(shape); !st.ok()) return st;
    CpuMaxPool2DBackward(shape, workspace, dy, dx, CpuMathThreads());
    return absl::OkStatus();
  }

  absl::Status AvgPool2DForward(const Pool2DShape& shape, const float* x,
                                float* y) override {
    if (absl::Status st = shape.Validate(); !st.ok()) return st;
    CpuAvgPool2DForward(shape, x, y, CpuMathThreads());
    return absl::OkStatus();
  }

  absl::Status AvgPool2DBackward(const Pool2DShape& shape, const float* dy,
                                 float* dx) override {
    if (absl::Status st = shape.Validate(); !st.ok()) return st;
    CpuAvgPool2DBackward(shape, dy, dx, CpuMathThreads());
    return absl::OkStatus();
  }

  // Batch norm: our own (cpu_batch_norm.h says why not oneDNN's).
  absl::Status BatchNormForwardTraining(const BatchNormShape& shape,
                                        const float* x, const float* gamma,
                                        const float* beta, float* y,
                                        float* mean, float* var) override {
    if (absl::Status st = shape.Validate(); !st.ok()) return st;
    CpuBatchNormForwardTraining(shape, x, gamma, beta, y, mean, var, CpuMathThreads());
    return absl::OkStatus();
  }

  absl::Status BatchNormForwardInference(const BatchNormShape& shape,
                                         const float* x, const float* gamma,
                                         const float* beta, const float* mean,
                                         const float* var, float* y) override {
    if (absl::Status st = shape.Validate(); !st.ok()) return st;
    CpuBatchNormForwardInference(shape, x, gamma, beta, mean, var, y, CpuMathThreads());
    return absl::OkStatus();
  }

  absl::Status BatchNormBackward(const BatchNormShape& shape, const float* x,
                                 const float* dy, const float* gamma,
                                 const float* mean, const float* var,
                                 float* dx, float* dgamma,
                                 float* dbeta) override {
    if (absl::Status st = shape.Validate(); !st.ok()) return st;
    CpuBatchNormBackward(shape, x, dy, gamma, mean, var, dx, dgamma, dbeta, CpuMathThreads());
    return absl::OkStatus();
  }

  // One pass: each mask value is drawn, stored and applied before the next
  // element is read, so `y` may alias `x`.
  void DropoutForward(int64_t n, float rate, uint64_t seed, const float* x,
                      float* y, float* mask) override {
    for (int64_t i = 0; i < n; ++i) {
      const float m = DropoutMaskValue(seed, static_cast<uint64_t>(i), rate);
      mask[i] = m;
      y[i] = x[i] * m;
    }
  }

  // Element i reads a[i] and b[i] before writing out[i], so aliasing is
  // safe; the compiler vectorizes it behind a run-time overlap check.
  void Mul(int64_t n, const float* a, const float* b, float* out) override {
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
  }

 private:
  // Created on the first convolution call, so backends of models without
  // convolutions (every MLP) never start oneDNN.
  absl::StatusOr<DnnlKernels*> Dnnl() {
    if (dnnl_ == nullptr) {
      absl::StatusOr<std::unique_ptr<DnnlKernels>> k = NewDnnlKernels();
      if (!k.ok()) return k.status();
      dnnl_ = *std::move(k);
    }
    return dnnl_.get();
  }

  Allocator* const allocator_;  // Not owned; may be null.
  // All ones; grows to the largest row count SumRows has seen.
  std::vector<float> ones_;
  std::unique_ptr<DnnlKernels> dnnl_;  // Null until first used.
};

}  // namespace

std::unique_ptr<Backend> NewCpuBackend(Allocator* allocator) {
  return std::make_unique<CpuBackend>(allocator);
}

}  // namespace towerps::worker
