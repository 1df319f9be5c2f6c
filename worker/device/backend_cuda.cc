// The CUDA backend: cuBLAS for GEMM, cuDNN for convolution, pooling and batch
// norm (worker/device/cudnn_kernels.h, loaded at run time), worker/device/cuda_kernels.cu
// for the rest, one non-blocking stream and one cuBLAS handle (and, once
// used, one cuDNN handle) per backend. Built only where the
// toolkit exists (worker/BUILD picks backend_nocuda.cc otherwise).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "worker/device/backend.h"
#include "worker/device/cublas_lib.h"
#include "worker/device/cuda_kernels.h"
#include "worker/device/cuda_util.h"
#include "worker/device/cudnn_kernels.h"
#include "worker/device/device_manager.h"

namespace towerps::worker {
namespace {

// A handle exists only once Cublas() has loaded the library.
struct CublasDeleter {
  void operator()(cublasHandle_t handle) const { Cublas()->Destroy(handle); }
};
using CublasHandle =
    std::unique_ptr<std::remove_pointer_t<cublasHandle_t>, CublasDeleter>;

// cudaMalloc(0) returns null; Allocate(0) returns a unique non-null pointer,
// as the allocators do. 256 bytes is cudaMalloc's alignment anyway.
constexpr int64_t kMinBlockBytes = 256;

int64_t Bytes(int64_t floats) {
  return floats * static_cast<int64_t>(sizeof(float));
}

// Lets the calling thread's current device, `device`, reach `peer`'s memory
// where the hardware allows, so that cudaMemcpyPeerAsync between them goes
// directly (NVLink or PCIe) instead of staging through host memory; either
// direction being enabled is enough for that. Never fails: without peer
// access the copy is still correct, only slower, so every error is cleared
// from the thread and forgotten. Peer access belongs to the two devices'
// primary contexts, which the whole process shares; enabling it again
// (another backend on the same GPU, or NCCL) answers "already enabled",
// which is what we wanted.
void EnablePeerAccess(int device, int peer) {
  int can_access = 0;
  cudaError_t err = cudaDeviceCanAccessPeer(&can_access, device, peer);
  if (err == cudaSuccess && can_access != 0) {
    err = cudaDeviceEnablePeerAccess(peer, /*flags=*/0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      cudaGetLastError();
      err = cudaSuccess;
    }
  }
  // Not a failure of the copy: keep it out of this thread's last error.
  if (err != cudaSuccess) cudaGetLastError();
}

// Not thread-safe (see Backend): one thread at a time, but not always the
// same one, so every call that touches the device first makes gpu_ the
// calling thread's current device. Synchronize, CopyToHost and memory_space
// may also come from another thread (a CopyFrom on another backend whose
// source is this one): they touch only constant members (gpu_, stream_;
// enqueueing on a stream from several threads is safe in the CUDA runtime)
// and the mutex-guarded first_error_, never cublas_ or the Loss buffers.
//
// Errors: CUDA reports a bad launch or a failed copy only to the call that
// made it (and execution errors at the next synchronization), while the
// Backend interface reports them at Synchronize, CopyToHost, CopyFrom or
// Loss. So every CUDA/cuBLAS result is checked where it is returned and the
// first failure is kept (first_error_) and returned by every later
// synchronizing call. Synchronize does not ask cudaGetLastError: that is per
// host thread, and could hold another backend's error.
class CudaBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<Backend>> Create(
      int gpu, Allocator* allocator);
  ~CudaBackend() override;

  std::string memory_space() const override {
    return absl::StrCat("cuda:", gpu_);
  }

  absl::StatusOr<float*> Allocate(int64_t n) override;
  void Free(float* p) override;
  void CopyFromHost(const float* src, int64_t n, float* dst) override;
  absl::Status CopyToHost(const float* src, int64_t n, float* dst) override;
  absl::Status CopyFrom(Backend& from, const float* src, int64_t n,
                        float* dst) override;
  absl::Status Synchronize() override { return SyncStream("Synchronize"); }

  void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
            float alpha, const float* a, const float* b, float beta,
            float* c) override;
  void AddBiasRows(int64_t rows, int64_t cols, const float* bias,
                   float* x) override;
  void SumRows(int64_t rows, int64_t cols, const float* x, float* out) override;
  void Relu(int64_t n, const float* in, float* out) override;
  void ReluGrad(int64_t n, const float* y, const float* dy, float* dx) override;
  void Axpy(int64_t n, float alpha, const float* x, float* y) override;
  void Scale(int64_t n, float alpha, float* x) override;
  void Zero(int64_t n, float* x) override;

  absl::StatusOr<LossResult> Loss(LossKind kind, int64_t n, int64_t d,
                                  const float* pred, const float* labels,
                                  const float* targets, float* dpred,
                                  int64_t grad_count) override;

  // Convolution, pooling and batch norm: cuDNN (worker/device/cudnn_kernels.h),
  // loaded on first use. The shape is checked first, so a bad shape is
  // InvalidArgument with or without cuDNN. Their errors are returned, not
  // kept in first_error_: a refused call has queued nothing.
  absl::Status BatchNormForwardTraining(const BatchNormShape& shape, const float* x,
                                        const float* gamma, const float* beta, float* y,
                                        float* mean, float* var) override {
    TOWERPS_RETURN_IF_ERROR(shape.Validate());
    TOWERPS_ASSIGN_OR_RETURN(CudnnKernels * dnn, Dnn());
    return dnn->BatchNormForwardTraining(shape, x, gamma, beta, y, mean, var);
  }
  absl::Status BatchNormForwardInference(const BatchNormShape& shape, const float* x,
                                         const float* gamma, const float* beta,
                                         const float* mean, const float* var,
                                         float* y) override {
    TOWERPS_RETURN_IF_ERROR(shape.Validate());
    TOWERPS_ASSIGN_OR_RETURN(CudnnKernels * dnn, Dnn());
    return dnn->BatchNormForwardInference(shape, x, gamma, beta, mean, var, y);
  }
  absl::Status BatchNormBackward(const BatchNormShape& shape, const float* x, const float* dy,
                                 const float* gamma, const float* /*mean*/,
                                 const float* /*var*/, float* dx, float* dgamma,
                                 float* dbeta) override {
    TOWERPS_RETURN_IF_ERROR(shape.Validate());
    TOWERPS_ASSIGN_OR_RETURN(CudnnKernels * dnn, Dnn());
    // cuDNN recomputes the statistics from x (the forward's, by contract).
    return dnn->BatchNormBackward(shape, x, dy, gamma, dx, dgamma, dbeta);
  }
  void DropoutForward(int64_t n, float rate, uint64_t seed, const float* x,
                      float* y, float* mask) override;
  void Mul(int64_t n, const float* a, const float* b, float* out) override;

  absl::Status Conv2DForward(const Conv2DShape& shape, const float* x, const float* w,
                             const float* b, float* y) override {
    TOWERPS_RETURN_IF_ERROR(shape.Validate());
    TOWERPS_ASSIGN_OR_RETURN(CudnnKernels * dnn, Dnn());
    return dnn->Conv2DForward(shape, x, w, b, y);
  }
  absl::Status Conv2DBackwardData(const Conv2DShape& shape, const float* dy, const float* w,
                                  float* dx) override {
    TOWERPS_RETURN_IF_ERROR(shape.Validate());
    TOWERPS_ASSIGN_OR_RETURN(CudnnKernels * dnn, Dnn());
    return dnn->Conv2DBackwardData(shape, dy, w, dx);
  }
  absl::Status Conv2DBackwardWeights(const Conv2DShape& shape, const float* x, const float* dy,
                                     float* dw, float* db) override {
    TOWERPS_RETURN_IF_ERROR(shape.Validate());
    TOWERPS_ASSIGN_OR_RETURN(CudnnKernels * dnn, Dnn());
    return dnn->Conv2DBackwardWeights(shape, x, dy, dw, db);
  }
  // cuDNN finds the winners from x and y: the workspace is left untouched.
  absl::Status MaxPool2DForward(const Pool2DShape& shape, const float* x, float* y,
                                float* /*workspace*/) override {
    TOWERPS_RETURN_IF_ERROR(shape.Validate());
    TOWERPS_ASSIGN_OR_RETURN(CudnnKernels * dnn, Dnn());
    return dnn->MaxPool2DForward(shape, x, y);
  }
  absl::Status MaxPool2DBackward(const Pool2DShape& shape, const float* x, const float* y,
                                 const float* /*workspace*/, const float* dy,
                                 float* dx) override {
    TOWERPS_RETURN_IF_ERROR(shape.Validate());
    TOWERPS_ASSIGN_OR_RETURN(CudnnKernels * dnn, Dnn());
    return dnn->MaxPool2DBackward(shape, x, y, dy, dx);
  }
  absl::Status AvgPool2DForward(const Pool2DShape& shape, const float* x, float* y) override {
    TOWERPS_RETURN_IF_ERROR(shape.Validate());
    TOWERPS_ASSIGN_OR_RETURN(CudnnKernels * dnn, Dnn());
    return dnn->AvgPool2DForward(shape, x, y);
  }
  absl::Status AvgPool2DBackward(const Pool2DShape& shape, const float* dy, float* dx) override {
    TOWERPS_RETURN_IF_ERROR(shape.Validate());
    TOWERPS_ASSIGN_OR_RETURN(CudnnKernels * dnn, Dnn());
    return dnn->AvgPool2DBackward(shape, dy, dx);
  }

 private:
  CudaBackend(int gpu, Allocator* allocator, CudaStream stream,
              const CublasLib& blas, CublasHandle cublas)
      : gpu_(gpu),
        allocator_(allocator),
        stream_(std::move(stream)),
        blas_(blas),
        cublas_(std::move(cublas)) {}

  // Keeps `status` if it is the first failure.
  void Record(const absl::Status& status) {
    if (status.ok()) return;
    absl::MutexLock lock(&error_mu_);
    if (first_error_.ok()) first_error_ = status;
  }
  absl::Status FirstError() const {
    absl::MutexLock lock(&error_mu_);
    return first_error_;
  }
  void Record(cudaError_t err, absl::string_view what) {
    if (err != cudaSuccess) {
      Record(GpuStatus(err, absl::StrCat(memory_space(), ": ", what)));
    }
  }
  void Record(cublasStatus_t status, absl::string_view what) {
    if (status != CUBLAS_STATUS_SUCCESS) {
      Record(
          GpuStatus(status, absl::StrCat(memory_space(), ": ", what)));
    }
  }
  // For worker/device/cuda_kernels.h, whose launchers return a cudaError_t as int.
  void RecordLaunch(int err, absl::string_view what) {
    Record(static_cast<cudaError_t>(err), what);
  }

  // Makes gpu_ the calling thread's device; false (recorded) on failure.
  bool SetDevice() {
    const cudaError_t err = cudaSetDevice(gpu_);
    Record(err, "cudaSetDevice");
    return err == cudaSuccess;
  }

  // Waits for the stream; returns the first error so far.
  absl::Status SyncStream(absl::string_view what) {
    if (SetDevice()) {
      Record(cudaStreamSynchronize(stream_.get()),
             absl::StrCat(what, ": cudaStreamSynchronize"));
    }
    return FirstError();
  }

  // The cuDNN kernels, created on the first call that needs them (so a
  // machine without cuDNN runs everything else); Unavailable "cuDNN
  // unavailable: ..." while it cannot be loaded (tried again on each call).
  // Also makes gpu_ the calling thread's device.
  absl::StatusOr<CudnnKernels*> Dnn() {
    TOWERPS_RETURN_IF_GPU_ERROR(cudaSetDevice(gpu_),
                                absl::StrCat(memory_space(), ": cudaSetDevice"));
    if (cudnn_ == nullptr) {
      TOWERPS_ASSIGN_OR_RETURN(cudnn_, NewCudnnKernels(stream_.get(), memory_space()));
    }
    return cudnn_.get();
  }

  // Room for `rows` per-row losses (double) and correct flags (int32) in
  // loss_scratch_.
  absl::Status ReserveLossScratch(int64_t rows);

  // Constant after construction.
  const int gpu_;
  Allocator* const allocator_;  // Not owned; null: cudaMalloc.
  const CudaStream stream_;
  const CublasLib& blas_;  // loaded for the life of the process
  // Bound to stream_; destroyed before it (declared after it).
  const CublasHandle cublas_;

  // Used only by the thread driving this backend.
  // Bound to stream_ too (and destroyed before it); null until first used.
  std::unique_ptr<CudnnKernels> cudnn_;
  // Loss's per-row results: cudaMalloc'd directly, not charged to the
  // allocator (12 bytes per row of the largest batch seen; a virtual
  // device's limit is about tensors, and this is far below its rounding).
  CudaMemory loss_scratch_;
  int64_t loss_scratch_rows_ = 0;
  std::set<int> peers_tried_;  // GPUs EnablePeerAccess was tried for
  std::vector<double> host_row_loss_;
  std::vector<int32_t> host_row_correct_;

  // The first failure. Guarded: Synchronize() and CopyToHost() may come
  // from another thread (a CopyFrom on another backend waits for and reads
  // from this one), while the thread driving this backend records.
  mutable absl::Mutex error_mu_;
  absl::Status first_error_ ABSL_GUARDED_BY(error_mu_);
};

absl::StatusOr<std::unique_ptr<Backend>> CudaBackend::Create(
    int gpu, Allocator* allocator) {
  if (gpu < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA backend: bad GPU index ", gpu));
  }
  const std::string where = absl::StrCat("cuda:", gpu);
  std::string why;
  const CublasLib* blas = Cublas(&why);
  if (blas == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(where, ": cuBLAS unavailable: ", why));
  }
  TOWERPS_RETURN_IF_GPU_ERROR(cudaSetDevice(gpu), where + ": cudaSetDevice");
  cudaStream_t raw_stream = nullptr;
  TOWERPS_RETURN_IF_GPU_ERROR(
      cudaStreamCreateWithFlags(&raw_stream, cudaStreamNonBlocking),
      where + ": cudaStreamCreateWithFlags");
  CudaStream stream(raw_stream);
  cublasHandle_t raw_handle = nullptr;
  TOWERPS_RETURN_IF_GPU_ERROR(blas->Create(&raw_handle),
                              where + ": cublasCreate");
  CublasHandle cublas(raw_handle);
  TOWERPS_RETURN_IF_GPU_ERROR(blas->SetStream(cublas.get(), stream.get()),
                              where + ": cublasSetStream");
  // FP32 GEMM in FP32: CUBLAS_DEFAULT_MATH makes cublasSgemm compute in
  // CUBLAS_COMPUTE_32F, which never rounds inputs to TF32 or BF16 (those need
  // CUBLAS_TF32_TENSOR_OP_MATH or CUBLAS_FP32_EMULATED_BF16X9_MATH, which we
  // never set). It is the handle's default already; setting it says so and
  // guards against a changed default. CUBLAS_PEDANTIC_MATH would add nothing
  // to accuracy for SGEMM and may choose slower kernels.
  TOWERPS_RETURN_IF_GPU_ERROR(
      blas->SetMathMode(cublas.get(), CUBLAS_DEFAULT_MATH),
      where + ": cublasSetMathMode");
  return std::unique_ptr<Backend>(
      new CudaBackend(gpu, allocator, std::move(stream), *blas, std::move(cublas)));
}

CudaBackend::~CudaBackend() {
  // Pending work may still use the scratch buffer; finish it before the
  // scratch, the cuBLAS handle and the stream go (in that order: members).
  if (cudaSetDevice(gpu_) == cudaSuccess) cudaStreamSynchronize(stream_.get());
}

// ---- Memory and copies ---------------------------------------------------

absl::StatusOr<float*> CudaBackend::Allocate(int64_t n) {
  if (n < 0 || n > INT64_MAX / static_cast<int64_t>(sizeof(float))) {
    return absl::InvalidArgumentError(
        absl::StrCat(memory_space(), ": cannot allocate ", n, " floats"));
  }
  const int64_t bytes = Bytes(n);
  TOWERPS_RETURN_IF_GPU_ERROR(cudaSetDevice(gpu_),
                              absl::StrCat(memory_space(), ": cudaSetDevice"));
  if (allocator_ != nullptr) {
    TOWERPS_ASSIGN_OR_RETURN(void* p, allocator_->Allocate(bytes));
    // A kernel given host memory, or another GPU's, fails far from the
    // cause; an allocator wired to the wrong MemoryBackend is caught here.
    cudaPointerAttributes attributes;
    const cudaError_t err = cudaPointerGetAttributes(&attributes, p);
    if (err != cudaSuccess || attributes.type != cudaMemoryTypeDevice ||
        attributes.device != gpu_) {
      if (err != cudaSuccess) cudaGetLastError();
      allocator_->Deallocate(p);
      return absl::FailedPreconditionError(absl::StrCat(
          memory_space(),
          ": the allocator handed out memory that is not device memory of GPU ",
          gpu_, " (its MemoryBackend should be NewCudaMemoryBackend(",
          gpu_, "))"));
    }
    return static_cast<float*>(p);
  }
  void* p = nullptr;
  const cudaError_t err =
      cudaMalloc(&p, static_cast<size_t>(std::max(bytes, kMinBlockBytes)));
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // Not sticky: clear it for this thread.
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
      cudaGetLastError();
    }
    return absl::ResourceExhaustedError(
        absl::StrCat(memory_space(), ": cannot allocate ", bytes,
                     " bytes: ", cudaGetErrorString(err), " (", free_bytes,
                     " of ", total_bytes, " bytes free on the GPU)"));
  }
  TOWERPS_RETURN_IF_GPU_ERROR(
      err, absl::StrCat(memory_space(), ": cudaMalloc of ", bytes, " bytes"));
  return static_cast<float*>(p);
}

void CudaBackend::Free(float* p) {
  if (p == nullptr) return;
  // Kernels still queued may use the block.
  if (SetDevice()) {
    Record(cudaStreamSynchronize(stream_.get()), "Free: cudaStreamSynchronize");
  }
  if (allocator_ != nullptr) {
    allocator_->Deallocate(p);
  } else {
    Record(cudaFree(p), "cudaFree");
  }
}

void CudaBackend::CopyFromHost(const float* src, int64_t n, float* dst) {
  if (n <= 0 || !SetDevice()) return;
  Record(cudaMemcpyAsync(dst, src, Bytes(n), cudaMemcpyHostToDevice,
                         stream_.get()),
         "CopyFromHost: cudaMemcpyAsync");
  // The caller may reuse `src` as soon as we return. (A copy from pageable
  // memory is staged before cudaMemcpyAsync returns, but pinned memory is
  // read later; waiting is correct for both.)
  Record(cudaStreamSynchronize(stream_.get()),
         "CopyFromHost: cudaStreamSynchronize");
}

absl::Status CudaBackend::CopyToHost(const float* src, int64_t n, float* dst) {
  if (n > 0 && SetDevice()) {
    // Ordered after every kernel queued so far on the stream.
    Record(cudaMemcpyAsync(dst, src, Bytes(n), cudaMemcpyDeviceToHost,
                           stream_.get()),
           "CopyToHost: cudaMemcpyAsync");
  }
  return SyncStream("CopyToHost");
}

absl::Status CudaBackend::CopyFrom(Backend& from, const float* src, int64_t n,
                                   float* dst) {
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(memory_space(), ": CopyFrom of ", n, " floats"));
  }
  // src must be complete: from's kernels run on from's stream.
  TOWERPS_RETURN_IF_ERROR(common::Annotate(
      from.Synchronize(),
      absl::StrCat(memory_space(), ": CopyFrom ", from.memory_space())));
  if (n == 0) return SyncStream("CopyFrom");
  auto* other = dynamic_cast<CudaBackend*>(&from);
  if (from.host_memory()) {
    if (SetDevice()) {
      Record(cudaMemcpyAsync(dst, src, Bytes(n), cudaMemcpyHostToDevice,
                             stream_.get()),
             "CopyFrom cpu: cudaMemcpyAsync");
    }
  } else if (other != nullptr && other->gpu_ == gpu_) {
    if (SetDevice()) {
      Record(cudaMemcpyAsync(dst, src, Bytes(n), cudaMemcpyDeviceToDevice,
                             stream_.get()),
             "CopyFrom: cudaMemcpyAsync");
    }
  } else if (other != nullptr) {
    // Works with or without peer access (the driver stages through host
    // memory when the GPUs cannot reach each other); with it, it is direct.
    if (SetDevice()) {
      // Once per peer for this backend (CopyFrom runs on the owning thread).
      if (peers_tried_.insert(other->gpu_).second) EnablePeerAccess(gpu_, other->gpu_);
      Record(cudaMemcpyPeerAsync(dst, gpu_, src, other->gpu_, Bytes(n),
                                 stream_.get()),
             absl::StrCat("CopyFrom ", from.memory_space(),
                          ": cudaMemcpyPeerAsync"));
    }
  } else {
    // Some other kind of device: through the host.
    std::vector<float> staging(n);
    TOWERPS_RETURN_IF_ERROR(from.CopyToHost(src, n, staging.data()));
    CopyFromHost(staging.data(), n, dst);
  }
  // Done before returning: once we return, from's owner may overwrite src (or
  // the host buffer) with no ordering against this stream.
  return SyncStream("CopyFrom");
}

// ---- Kernels ---------------------------------------------------------------

void CudaBackend::Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n,
                       int64_t k, float alpha, const float* a, const float* b,
                       float beta, float* c) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // C = beta * C, and exact zeros (not 0 * NaN) for beta == 0, as on the
    // CPU.
    if (beta == 0.0f) {
      Zero(m * n, c);
    } else {
      Scale(m * n, beta, c);
    }
    return;
  }
  // cuBLAS takes int sizes; layers are far below 2^31 per dimension, so a
  // larger one is a caller's bug, reported at the next synchronization.
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX) {
    Record(absl::InvalidArgumentError(
        absl::StrCat(memory_space(), ": Gemm [", m, ", ", n, ", ", k,
                     "] has a dimension over cuBLAS's int range")));
    return;
  }
  if (!SetDevice()) return;
  // cuBLAS is column-major: a row-major [r, c] matrix is the column-major
  // [c, r] matrix of its transpose. So row-major C = op(A) op(B) is
  // column-major C^T = op(B)^T op(A)^T: swap the operands (and m with n),
  // keep each one's transpose flag. Leading dimensions are the row-major row
  // lengths: A is stored [m, k] ([k, m] when trans_a), B [k, n] ([n, k]).
  const int lda = static_cast<int>(trans_a ? m : k);
  const int ldb = static_cast<int>(trans_b ? k : n);
  // With beta == 0 cuBLAS does not read C (documented), so NaNs in it do not
  // propagate.
  Record(blas_.Sgemm(cublas_.get(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                     trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
                     static_cast<int>(m), static_cast<int>(k), &alpha, b, ldb,
                     a, lda, &beta, c, static_cast<int>(n)),
         "cublasSgemm");
}

void CudaBackend::AddBiasRows(int64_t rows, int64_t cols, const float* bias,
                              float* x) {
  if (rows == 0 || cols == 0 || !SetDevice()) return;
  RecordLaunch(internal::LaunchAddBiasRows(stream_.get(), rows, cols, bias, x),
               "AddBiasRows");
}

void CudaBackend::SumRows(int64_t rows, int64_t cols, const float* x,
                          float* out) {
  if (cols == 0 || !SetDevice()) return;
  RecordLaunch(internal::LaunchSumRows(stream_.get(), rows, cols, x, out),
               "SumRows");
}

void CudaBackend::Relu(int64_t n, const float* in, float* out) {
  if (n == 0 || !SetDevice()) return;
  RecordLaunch(internal::LaunchRelu(stream_.get(), n, in, out), "Relu");
}

void CudaBackend::ReluGrad(int64_t n, const float* y, const float* dy,
                           float* dx) {
  if (n == 0 || !SetDevice()) return;
  RecordLaunch(internal::LaunchReluGrad(stream_.get(), n, y, dy, dx),
               "ReluGrad");
}

void CudaBackend::DropoutForward(int64_t n, float rate, uint64_t seed,
                                 const float* x, float* y, float* mask) {
  if (n == 0 || !SetDevice()) return;
  RecordLaunch(
      internal::LaunchDropout(stream_.get(), n, rate, seed, x, y, mask),
      "DropoutForward");
}

void CudaBackend::Mul(int64_t n, const float* a, const float* b, float* out) {
  if (n == 0 || !SetDevice()) return;
  RecordLaunch(internal::LaunchMul(stream_.get(), n, a, b, out), "Mul");
}

void CudaBackend::Axpy(int64_t n, float alpha, const float* x, float* y) {
  if (n == 0 || !SetDevice()) return;
  RecordLaunch(internal::LaunchAxpy(stream_.get(), n, alpha, x, y), "Axpy");
}

void CudaBackend::Scale(int64_t n, float alpha, float* x) {
  if (n == 0 || !SetDevice()) return;
  RecordLaunch(internal::LaunchScale(stream_.get(), n, alpha, x), "Scale");
}

void CudaBackend::Zero(int64_t n, float* x) {
  if (n == 0 || !SetDevice()) return;
  Record(cudaMemsetAsync(x, 0, Bytes(n), stream_.get()),
         "Zero: cudaMemsetAsync");
}

// ---- Losses ----------------------------------------------------------------

absl::Status CudaBackend::ReserveLossScratch(int64_t rows) {
  if (rows <= loss_scratch_rows_) return absl::OkStatus();
  // The old buffer is idle: every Loss waits for the stream before returning.
  loss_scratch_.reset();
  loss_scratch_rows_ = 0;
  void* p = nullptr;
  TOWERPS_RETURN_IF_GPU_ERROR(
      cudaMalloc(
          &p, static_cast<size_t>(rows * (sizeof(double) + sizeof(int32_t)))),
      absl::StrCat(memory_space(), ": Loss scratch for ", rows, " rows"));
  loss_scratch_.reset(p);
  loss_scratch_rows_ = rows;
  return absl::OkStatus();
}

absl::StatusOr<LossResult> CudaBackend::Loss(LossKind kind, int64_t n,
                                             int64_t d, const float* pred,
                                             const float* labels,
                                             const float* targets, float* dpred,
                                             int64_t grad_count) {
  const bool classification = kind == LossKind::kSoftmaxCrossEntropy;
  if (!classification && kind != LossKind::kMse && kind != LossKind::kMae) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss: unknown loss kind ", static_cast<int>(kind)));
  }
  if (n < 0 || d < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss: bad shape [", n, ", ", d, "]"));
  }
  LossResult result;
  if (n == 0) {
    TOWERPS_RETURN_IF_ERROR(SyncStream("Loss"));
    return result;
  }
  if (classification ? labels == nullptr : targets == nullptr) {
    return absl::InvalidArgumentError(
        classification ? "loss: softmax cross-entropy needs labels"
                       : "loss: MSE and MAE need targets");
  }
  // No class a label could name; the kernel would otherwise read logits of
  // an empty row. After the n == 0 case, as the CPU backend accepts an empty
  // batch of any width.
  if (classification && d == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss: softmax cross-entropy over 0 classes (logits [", n, ", 0])"));
  }
  // As worker/device/loss_kernels.cc (the CPU backend).
  if (grad_count <= 0) grad_count = std::max<int64_t>(n, 1);
  if (!SetDevice()) return FirstError();
  TOWERPS_RETURN_IF_ERROR(ReserveLossScratch(n));
  double* row_loss = static_cast<double*>(loss_scratch_.get());
  int32_t* row_correct = reinterpret_cast<int32_t*>(row_loss + n);
  host_row_loss_.resize(n);
  if (classification) {
    RecordLaunch(internal::LaunchSoftmaxCrossEntropy(
                     stream_.get(), n, d, pred, labels,
                     1.0 / static_cast<double>(grad_count), dpred, row_loss,
                     row_correct),
                 "Loss (softmax cross-entropy)");
    host_row_correct_.resize(n);
    Record(cudaMemcpyAsync(host_row_correct_.data(), row_correct,
                           n * sizeof(int32_t), cudaMemcpyDeviceToHost,
                           stream_.get()),
           "Loss: cudaMemcpyAsync");
  } else {
    const double inv_d = d > 0 ? 1.0 / static_cast<double>(d) : 0.0;
    const double inv_nd =
        d > 0 ? 1.0 / (static_cast<double>(grad_count) * static_cast<double>(d))
              : 0.0;
    RecordLaunch(
        internal::LaunchRegression(stream_.get(), kind == LossKind::kMae, n, d, pred,
                                   targets, inv_d, inv_nd, dpred, row_loss),
        kind == LossKind::kMae ? "Loss (MAE)" : "Loss (MSE)");
  }
  Record(cudaMemcpyAsync(host_row_loss_.data(), row_loss, n * sizeof(double),
                         cudaMemcpyDeviceToHost, stream_.get()),
         "Loss: cudaMemcpyAsync");
  TOWERPS_RETURN_IF_ERROR(SyncStream("Loss"));
  // In row order, as the CPU backend sums, so equal per-row values give
  // equal sums.
  for (int64_t i = 0; i < n; ++i) {
    if (classification) {
      if (host_row_correct_[i] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("loss: the label of example ", i,
                         " is not a class index in [0, ", d, ")"));
      }
      result.correct += host_row_correct_[i];
    }
    result.loss_sum += host_row_loss_[i];
  }
  return result;
}

}  // namespace

bool CudaBackendBuilt() { return true; }

absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(
    int gpu, Allocator* allocator) {
  return CudaBackend::Create(gpu, allocator);
}

}  // namespace towerps::worker
