#include "worker/device/cudnn_kernels.h"

#include <cudnn.h>

#include <climits>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status.h"
#include "worker/device/cuda_util.h"
#include "worker/device/cudnn_lib.h"

namespace towerps::worker {
namespace {

// cuDNN's blend factors: float for float tensors. beta = 0 means the output
// is not read (so NaNs in it do not propagate): every output is overwritten.
constexpr float kOne = 1.0f;
constexpr float kZero = 0.0f;

// A cuDNN descriptor or handle, destroyed with the loaded library's function.
template <typename T>
using Owned = std::unique_ptr<std::remove_pointer_t<T>, cudnnStatus_t (*)(T)>;

// cuDNN's legacy API takes int dimensions.
absl::Status CheckInt(absl::string_view field, int64_t value, absl::string_view shape) {
  if (value >= 0 && value <= INT_MAX) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, "=", value, " is over cuDNN's int range (", shape, ")"));
}

using Fields = std::initializer_list<std::pair<const char*, int64_t>>;

absl::Status CheckConvInts(const Conv2DShape& s) {
  const std::string d = s.DebugString();
  for (const auto& [field, value] : Fields{{"n", s.n}, {"c", s.c}, {"h", s.h}, {"w", s.w},
                                           {"k", s.k}, {"r", s.r}, {"s", s.s}}) {
    TOWERPS_RETURN_IF_ERROR(CheckInt(field, value, d));
  }
  return absl::OkStatus();
}

absl::Status CheckPoolInts(const Pool2DShape& s) {
  const std::string d = s.DebugString();
  for (const auto& [field, value] :
       Fields{{"n", s.n}, {"c", s.c}, {"h", s.h}, {"w", s.w}, {"r", s.r}, {"s", s.s}}) {
    TOWERPS_RETURN_IF_ERROR(CheckInt(field, value, d));
  }
  return absl::OkStatus();
}

class CudnnKernelsImpl final : public CudnnKernels {
 public:
  CudnnKernelsImpl(const CudnnLib& lib, cudaStream_t stream, std::string where,
                   Owned<cudnnHandle_t> handle)
      : lib_(lib), stream_(stream), where_(std::move(where)), handle_(std::move(handle)) {}

  ~CudnnKernelsImpl() override {
    // Queued work may still use the workspace (freed next, as a member).
    if (workspace_ != nullptr) cudaStreamSynchronize(stream_);
  }

  absl::Status Conv2DForward(const Conv2DShape& shape, const float* x, const float* w,
                             const float* b, float* y) override;
  absl::Status Conv2DBackwardData(const Conv2DShape& shape, const float* dy, const float* w,
                                  float* dx) override;
  absl::Status Conv2DBackwardWeights(const Conv2DShape& shape, const float* x,
                                     const float* dy, float* dw, float* db) override;
  absl::Status MaxPool2DForward(const Pool2DShape& shape, const float* x, float* y) override;
  absl::Status MaxPool2DBackward(const Pool2DShape& shape, const float* x, const float* y,
                                 const float* dy, float* dx) override;
  absl::Status AvgPool2DForward(const Pool2DShape& shape, const float* x, float* y) override;
  absl::Status AvgPool2DBackward(const Pool2DShape& shape, const float* dy,
                                 float* dx) override;
  absl::Status BatchNormForwardTraining(const BatchNormShape& shape, const float* x,
                                        const float* gamma, const float* beta, float* y,
                                        float* mean, float* var) override;
  absl::Status BatchNormForwardInference(const BatchNormShape& shape, const float* x,
                                         const float* gamma, const float* beta,
                                         const float* mean, const float* var,
                                         float* y) override;
  absl::Status BatchNormBackward(const BatchNormShape& shape, const float* x, const float* dy,
                                 const float* gamma, float* dx, float* dgamma,
                                 float* dbeta) override;

 private:
  // The descriptors of one convolution.
  struct ConvDescs {
    Owned<cudnnTensorDescriptor_t> x, y;
    Owned<cudnnFilterDescriptor_t> w;
    Owned<cudnnConvolutionDescriptor_t> conv;
  };

  absl::Status Check(cudnnStatus_t status, absl::string_view what) const {
    return GpuStatus(status, absl::StrCat(where_, ": ", what));
  }

  // A packed NCHW float tensor descriptor.
  absl::StatusOr<Owned<cudnnTensorDescriptor_t>> Tensor(int64_t n, int64_t c, int64_t h,
                                                        int64_t w) const;
  absl::StatusOr<ConvDescs> Convolution(const Conv2DShape& s) const;
  absl::StatusOr<Owned<cudnnPoolingDescriptor_t>> Pooling(const Pool2DShape& s,
                                                          cudnnPoolingMode_t mode) const;
  // Validates the shape and makes x's and y's descriptors.
  absl::Status PoolingDescs(const Pool2DShape& s, Owned<cudnnTensorDescriptor_t>* x,
                            Owned<cudnnTensorDescriptor_t>* y) const;
  // x [n, c, spatial, 1] and the per-channel [1, c, 1, 1].
  absl::Status BatchNormDescs(const BatchNormShape& s, Owned<cudnnTensorDescriptor_t>* x,
                              Owned<cudnnTensorDescriptor_t>* channel) const;
  absl::Status Pool(const Pool2DShape& shape, cudnnPoolingMode_t mode, const float* x,
                    float* y);

  // At least `bytes` of device memory, valid until the next call; null for 0.
  absl::StatusOr<void*> Workspace(size_t bytes);

  // Runs `run(algo, workspace, bytes)` with the first of `algos` that cuDNN
  // supports for these descriptors (`size(algo, &bytes)` asks its workspace).
  template <typename Algo, typename SizeFn, typename RunFn>
  absl::Status FirstSupported(std::initializer_list<Algo> algos, absl::string_view what,
                              SizeFn size, RunFn run);

  // Constant after construction.
  const CudnnLib& lib_;
  const cudaStream_t stream_;  // Not owned.
  const std::string where_;
  const Owned<cudnnHandle_t> handle_;

  // Freed before the handle (declared after it), after the stream is idle.
  CudaMemory workspace_;
  size_t workspace_bytes_ = 0;
};

absl::StatusOr<Owned<cudnnTensorDescriptor_t>> CudnnKernelsImpl::Tensor(int64_t n, int64_t c,
                                                                        int64_t h,
                                                                        int64_t w) const {
  cudnnTensorDescriptor_t raw = nullptr;
  TOWERPS_RETURN_IF_ERROR(Check(lib_.CreateTensorDescriptor(&raw), "cudnnCreateTensorDescriptor"));
  Owned<cudnnTensorDescriptor_t> desc(raw, lib_.DestroyTensorDescriptor);
  TOWERPS_RETURN_IF_ERROR(
      Check(lib_.SetTensor4dDescriptor(raw, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
                                       static_cast<int>(n), static_cast<int>(c),
                                       static_cast<int>(h), static_cast<int>(w)),
            absl::StrCat("cudnnSetTensor4dDescriptor [", n, ", ", c, ", ", h, ", ", w, "]")));
  return desc;
}

absl::StatusOr<CudnnKernelsImpl::ConvDescs> CudnnKernelsImpl::Convolution(
    const Conv2DShape& s) const {
  TOWERPS_RETURN_IF_ERROR(s.Validate());
  TOWERPS_RETURN_IF_ERROR(CheckConvInts(s));
  TOWERPS_ASSIGN_OR_RETURN(auto x, Tensor(s.n, s.c, s.h, s.w));
  TOWERPS_ASSIGN_OR_RETURN(auto y, Tensor(s.n, s.k, s.out_h(), s.out_w()));

  cudnnFilterDescriptor_t raw_w = nullptr;
  TOWERPS_RETURN_IF_ERROR(Check(lib_.CreateFilterDescriptor(&raw_w), "cudnnCreateFilterDescriptor"));
  Owned<cudnnFilterDescriptor_t> w(raw_w, lib_.DestroyFilterDescriptor);
  // OIHW is cuDNN's NCHW filter layout: [k, c, r, s].
  TOWERPS_RETURN_IF_ERROR(Check(
      lib_.SetFilter4dDescriptor(raw_w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, static_cast<int>(s.k),
                                 static_cast<int>(s.c), static_cast<int>(s.r),
                                 static_cast<int>(s.s)),
      absl::StrCat("cudnnSetFilter4dDescriptor (", s.DebugString(), ")")));

  cudnnConvolutionDescriptor_t raw_conv = nullptr;
  TOWERPS_RETURN_IF_ERROR(
      Check(lib_.CreateConvolutionDescriptor(&raw_conv), "cudnnCreateConvolutionDescriptor"));
  Owned<cudnnConvolutionDescriptor_t> conv(raw_conv, lib_.DestroyConvolutionDescriptor);
  // Cross-correlation, as conv_shape.h defines it; FP32 arithmetic.
  TOWERPS_RETURN_IF_ERROR(
      Check(lib_.SetConvolution2dDescriptor(raw_conv, s.pad_h, s.pad_w, s.stride_h, s.stride_w,
                                            /*dilation_h=*/1, /*dilation_w=*/1,
                                            CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
            absl::StrCat("cudnnSetConvolution2dDescriptor (", s.DebugString(), ")")));
  // CUDNN_DEFAULT_MATH lets cuDNN round FP32 inputs to TF32 on Ampere and
  // later (10 mantissa bits: relative errors near 1e-3, far from the CPU
  // backend); CUDNN_FMA_MATH keeps every product in FP32.
  TOWERPS_RETURN_IF_ERROR(Check(lib_.SetConvolutionMathType(raw_conv, CUDNN_FMA_MATH),
                                "cudnnSetConvolutionMathType"));
  return ConvDescs{std::move(x), std::move(y), std::move(w), std::move(conv)};
}

absl::StatusOr<Owned<cudnnPoolingDescriptor_t>> CudnnKernelsImpl::Pooling(
    const Pool2DShape& s, cudnnPoolingMode_t mode) const {
  cudnnPoolingDescriptor_t raw = nullptr;
  TOWERPS_RETURN_IF_ERROR(Check(lib_.CreatePoolingDescriptor(&raw), "cudnnCreatePoolingDescriptor"));
  Owned<cudnnPoolingDescriptor_t> desc(raw, lib_.DestroyPoolingDescriptor);
  // A NaN in a window gives NaN (a diverging model should show it, not hide
  // it behind the window's other values).
  TOWERPS_RETURN_IF_ERROR(Check(
      lib_.SetPooling2dDescriptor(raw, mode, CUDNN_PROPAGATE_NAN, static_cast<int>(s.r),
                                  static_cast<int>(s.s), s.pad_h, s.pad_w, s.stride_h,
                                  s.stride_w),
      absl::StrCat("cudnnSetPooling2dDescriptor (", s.DebugString(), ")")));
  return desc;
}

absl::Status CudnnKernelsImpl::PoolingDescs(const Pool2DShape& s,
                                            Owned<cudnnTensorDescriptor_t>* x,
                                            Owned<cudnnTensorDescriptor_t>* y) const {
  TOWERPS_RETURN_IF_ERROR(s.Validate());
  TOWERPS_RETURN_IF_ERROR(CheckPoolInts(s));
  TOWERPS_ASSIGN_OR_RETURN(*x, Tensor(s.n, s.c, s.h, s.w));
  TOWERPS_ASSIGN_OR_RETURN(*y, Tensor(s.n, s.c, s.out_h(), s.out_w()));
  return absl::OkStatus();
}

absl::Status CudnnKernelsImpl::BatchNormDescs(const BatchNormShape& s,
                                              Owned<cudnnTensorDescriptor_t>* x,
                                              Owned<cudnnTensorDescriptor_t>* channel) const {
  TOWERPS_RETURN_IF_ERROR(s.Validate());
  const std::string d = s.DebugString();
  TOWERPS_RETURN_IF_ERROR(CheckInt("n", s.n, d));
  TOWERPS_RETURN_IF_ERROR(CheckInt("c", s.c, d));
  TOWERPS_RETURN_IF_ERROR(CheckInt("spatial", s.spatial, d));
  TOWERPS_ASSIGN_OR_RETURN(*x, Tensor(s.n, s.c, s.spatial, 1));
  TOWERPS_ASSIGN_OR_RETURN(*channel, Tensor(1, s.c, 1, 1));
  return absl::OkStatus();
}

absl::StatusOr<void*> CudnnKernelsImpl::Workspace(size_t bytes) {
  if (bytes == 0) return nullptr;
  if (bytes > workspace_bytes_) {
    // The old buffer may still be in use by queued work.
    TOWERPS_RETURN_IF_GPU_ERROR(cudaStreamSynchronize(stream_),
                                absl::StrCat(where_, ": cuDNN workspace: cudaStreamSynchronize"));
    workspace_.reset();
    workspace_bytes_ = 0;
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
      cudaGetLastError();  // An allocation failure is not sticky: clear it.
      return GpuStatus(err, absl::StrCat(where_, ": cuDNN workspace of ", bytes, " bytes"));
    }
    workspace_.reset(p);
    workspace_bytes_ = bytes;
  }
  return workspace_.get();
}

template <typename Algo, typename SizeFn, typename RunFn>
absl::Status CudnnKernelsImpl::FirstSupported(std::initializer_list<Algo> algos,
                                              absl::string_view what, SizeFn size, RunFn run) {
  absl::Status status;
  for (Algo algo : algos) {
    const std::string context = absl::StrCat(what, " (algorithm ", static_cast<int>(algo), ")");
    size_t bytes = 0;
    status = Check(size(algo, &bytes), absl::StrCat(context, ": workspace size"));
    if (status.ok()) {
      absl::StatusOr<void*> workspace = Workspace(bytes);
      status = workspace.status();
      if (status.ok()) status = Check(run(algo, *workspace, bytes), context);
    }
    // NOT_SUPPORTED (no kernel for this shape) or no memory for its
    // workspace: the next algorithm may do (the last needs little or none).
    if (status.code() != absl::StatusCode::kUnimplemented &&
        status.code() != absl::StatusCode::kResourceExhausted) {
      return status;
    }
  }
  return status;
}

// ---- Convolution -------------------------------------------------------------
//
// Fixed algorithms instead of cuDNN's heuristics: implicit GEMM (no FFT or
// Winograd transforms, whose rounding is far from a plain sum of products)
// and deterministic (no atomics: the same inputs give the same bits every
// run). Each has a fallback that cuDNN supports for every 2-D NCHW float
// configuration and that needs no workspace (forward) or little; the
// backward ones (ALGO_0) sum with atomics, so they are not deterministic,
// but they run only where the first choice cannot.

absl::Status CudnnKernelsImpl::Conv2DForward(const Conv2DShape& shape, const float* x,
                                             const float* w, const float* b, float* y) {
  TOWERPS_ASSIGN_OR_RETURN(ConvDescs d, Convolution(shape));
  TOWERPS_RETURN_IF_ERROR(FirstSupported(
      {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM},
      "cudnnConvolutionForward",
      [&](cudnnConvolutionFwdAlgo_t algo, size_t* bytes) {
        return lib_.GetConvolutionForwardWorkspaceSize(handle_.get(), d.x.get(), d.w.get(),
                                                       d.conv.get(), d.y.get(), algo, bytes);
      },
      [&](cudnnConvolutionFwdAlgo_t algo, void* workspace, size_t bytes) {
        return lib_.ConvolutionForward(handle_.get(), &kOne, d.x.get(), x, d.w.get(), w,
                                       d.conv.get(), algo, workspace, bytes, &kZero, d.y.get(),
                                       y);
      }));
  if (b == nullptr) return absl::OkStatus();
  TOWERPS_ASSIGN_OR_RETURN(auto bias, Tensor(1, shape.k, 1, 1));
  // y += b, broadcast over n, rows and columns.
  return Check(lib_.AddTensor(handle_.get(), &kOne, bias.get(), b, &kOne, d.y.get(), y),
               "cudnnAddTensor (bias)");
}

absl::Status CudnnKernelsImpl::Conv2DBackwardData(const Conv2DShape& shape, const float* dy,
                                                  const float* w, float* dx) {
  TOWERPS_ASSIGN_OR_RETURN(ConvDescs d, Convolution(shape));
  return FirstSupported(
      {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, CUDNN_CONVOLUTION_BWD_DATA_ALGO_0},
      "cudnnConvolutionBackwardData",
      [&](cudnnConvolutionBwdDataAlgo_t algo, size_t* bytes) {
        return lib_.GetConvolutionBackwardDataWorkspaceSize(handle_.get(), d.w.get(), d.y.get(),
                                                            d.conv.get(), d.x.get(), algo, bytes);
      },
      [&](cudnnConvolutionBwdDataAlgo_t algo, void* workspace, size_t bytes) {
        return lib_.ConvolutionBackwardData(handle_.get(), &kOne, d.w.get(), w, d.y.get(), dy,
                                            d.conv.get(), algo, workspace, bytes, &kZero,
                                            d.x.get(), dx);
      });
}

absl::Status CudnnKernelsImpl::Conv2DBackwardWeights(const Conv2DShape& shape, const float* x,
                                                     const float* dy, float* dw, float* db) {
  TOWERPS_ASSIGN_OR_RETURN(ConvDescs d, Convolution(shape));
  TOWERPS_RETURN_IF_ERROR(FirstSupported(
      {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0},
      "cudnnConvolutionBackwardFilter",
      [&](cudnnConvolutionBwdFilterAlgo_t algo, size_t* bytes) {
        return lib_.GetConvolutionBackwardFilterWorkspaceSize(
            handle_.get(), d.x.get(), d.y.get(), d.conv.get(), d.w.get(), algo, bytes);
      },
      [&](cudnnConvolutionBwdFilterAlgo_t algo, void* workspace, size_t bytes) {
        return lib_.ConvolutionBackwardFilter(handle_.get(), &kOne, d.x.get(), x, d.y.get(), dy,
                                              d.conv.get(), algo, workspace, bytes, &kZero,
                                              d.w.get(), dw);
      }));
  if (db == nullptr) return absl::OkStatus();
  TOWERPS_ASSIGN_OR_RETURN(auto bias, Tensor(1, shape.k, 1, 1));
  return Check(lib_.ConvolutionBackwardBias(handle_.get(), &kOne, d.y.get(), dy, &kZero,
                                            bias.get(), db),
               "cudnnConvolutionBackwardBias");
}

// ---- Pooling -----------------------------------------------------------------

absl::Status CudnnKernelsImpl::Pool(const Pool2DShape& shape, cudnnPoolingMode_t mode,
                                    const float* x, float* y) {
  Owned<cudnnTensorDescriptor_t> xd(nullptr, lib_.DestroyTensorDescriptor);
  Owned<cudnnTensorDescriptor_t> yd(nullptr, lib_.DestroyTensorDescriptor);
  TOWERPS_RETURN_IF_ERROR(PoolingDescs(shape, &xd, &yd));
  TOWERPS_ASSIGN_OR_RETURN(auto pool, Pooling(shape, mode));
  return Check(lib_.PoolingForward(handle_.get(), pool.get(), &kOne, xd.get(), x, &kZero,
                                   yd.get(), y),
               absl::StrCat("cudnnPoolingForward (", shape.DebugString(), ")"));
}

// Max pooling: the deterministic mode (backward routes each window's
// gradient to one winner, without atomics). cuDNN never lets padding win.
absl::Status CudnnKernelsImpl::MaxPool2DForward(const Pool2DShape& shape, const float* x,
                                                float* y) {
  return Pool(shape, CUDNN_POOLING_MAX_DETERMINISTIC, x, y);
}

absl::Status CudnnKernelsImpl::MaxPool2DBackward(const Pool2DShape& shape, const float* x,
                                                 const float* y, const float* dy, float* dx) {
  Owned<cudnnTensorDescriptor_t> xd(nullptr, lib_.DestroyTensorDescriptor);
  Owned<cudnnTensorDescriptor_t> yd(nullptr, lib_.DestroyTensorDescriptor);
  TOWERPS_RETURN_IF_ERROR(PoolingDescs(shape, &xd, &yd));
  TOWERPS_ASSIGN_OR_RETURN(auto pool, Pooling(shape, CUDNN_POOLING_MAX_DETERMINISTIC));
  return Check(lib_.PoolingBackward(handle_.get(), pool.get(), &kOne, yd.get(), y, yd.get(), dy,
                                    xd.get(), x, &kZero, xd.get(), dx),
               absl::StrCat("cudnnPoolingBackward (max, ", shape.DebugString(), ")"));
}

// Average pooling: the count excludes padding, as the contract says.
absl::Status CudnnKernelsImpl::AvgPool2DForward(const Pool2DShape& shape, const float* x,
                                                float* y) {
  return Pool(shape, CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING, x, y);
}

absl::Status CudnnKernelsImpl::AvgPool2DBackward(const Pool2DShape& shape, const float* dy,
                                                 float* dx) {
  Owned<cudnnTensorDescriptor_t> xd(nullptr, lib_.DestroyTensorDescriptor);
  Owned<cudnnTensorDescriptor_t> yd(nullptr, lib_.DestroyTensorDescriptor);
  TOWERPS_RETURN_IF_ERROR(PoolingDescs(shape, &xd, &yd));
  TOWERPS_ASSIGN_OR_RETURN(auto pool, Pooling(shape, CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING));
  // cuDNN's signature asks for the forward's y and x, which an average's
  // gradient does not depend on (and the contract does not pass): dy and dx
  // stand in, with the right shapes.
  return Check(lib_.PoolingBackward(handle_.get(), pool.get(), &kOne, yd.get(), dy, yd.get(), dy,
                                    xd.get(), dx, &kZero, xd.get(), dx),
               absl::StrCat("cudnnPoolingBackward (average, ", shape.DebugString(), ")"));
}

// ---- Batch normalization -------------------------------------------------------
//
// CUDNN_BATCHNORM_SPATIAL: per channel over n and the spatial positions (for
// spatial = 1, over the batch: the same as per-activation on [n, c]).

absl::Status CudnnKernelsImpl::BatchNormForwardTraining(const BatchNormShape& shape,
                                                        const float* x, const float* gamma,
                                                        const float* beta, float* y,
                                                        float* mean, float* var) {
  Owned<cudnnTensorDescriptor_t> xd(nullptr, lib_.DestroyTensorDescriptor);
  Owned<cudnnTensorDescriptor_t> cd(nullptr, lib_.DestroyTensorDescriptor);
  TOWERPS_RETURN_IF_ERROR(BatchNormDescs(shape, &xd, &cd));
  const size_t channel_bytes = static_cast<size_t>(shape.c) * sizeof(float);
  // cuDNN's saved statistics are the mean and the INVERSE standard deviation;
  // its running statistics, with an average factor of 1, are this batch's
  // mean and UNBIASED variance (times m / (m - 1), m = n * spatial). So mean
  // and var are passed as the running statistics, zeroed first (the update
  // is (1 - factor) * old + factor * new, and 0 * NaN would be NaN), and var
  // is scaled back to the biased variance below. (Computing it from the
  // inverse standard deviation, 1 / invstd^2 - epsilon, would cancel
  // catastrophically when the variance is small next to epsilon.)
  TOWERPS_RETURN_IF_GPU_ERROR(cudaMemsetAsync(mean, 0, channel_bytes, stream_),
                              absl::StrCat(where_, ": BatchNormForwardTraining: cudaMemsetAsync"));
  TOWERPS_RETURN_IF_GPU_ERROR(cudaMemsetAsync(var, 0, channel_bytes, stream_),
                              absl::StrCat(where_, ": BatchNormForwardTraining: cudaMemsetAsync"));
  TOWERPS_RETURN_IF_ERROR(
      Check(lib_.BatchNormalizationForwardTraining(
                handle_.get(), CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, xd.get(), x, xd.get(), y,
                cd.get(), gamma, beta, /*exponentialAverageFactor=*/1.0, mean, var,
                shape.epsilon, /*resultSaveMean=*/nullptr, /*resultSaveInvVariance=*/nullptr),
            absl::StrCat("cudnnBatchNormalizationForwardTraining (", shape.DebugString(), ")")));
  const int64_t m = shape.n * shape.spatial;
  if (m == 1) {
    // One value per channel: the biased variance is exactly 0 (the unbiased
    // one, which cuDNN wrote, is undefined).
    return GpuStatus(cudaMemsetAsync(var, 0, channel_bytes, stream_),
                     absl::StrCat(where_, ": BatchNormForwardTraining: cudaMemsetAsync"));
  }
  const float to_biased =
      static_cast<float>(static_cast<double>(m - 1) / static_cast<double>(m));
  return Check(lib_.ScaleTensor(handle_.get(), cd.get(), var, &to_biased),
               "cudnnScaleTensor (unbiased to biased variance)");
}

absl::Status CudnnKernelsImpl::BatchNormForwardInference(const BatchNormShape& shape,
                                                         const float* x, const float* gamma,
                                                         const float* beta, const float* mean,
                                                         const float* var, float* y) {
  Owned<cudnnTensorDescriptor_t> xd(nullptr, lib_.DestroyTensorDescriptor);
  Owned<cudnnTensorDescriptor_t> cd(nullptr, lib_.DestroyTensorDescriptor);
  TOWERPS_RETURN_IF_ERROR(BatchNormDescs(shape, &xd, &cd));
  return Check(lib_.BatchNormalizationForwardInference(
                   handle_.get(), CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, xd.get(), x, xd.get(),
                   y, cd.get(), gamma, beta, mean, var, shape.epsilon),
               absl::StrCat("cudnnBatchNormalizationForwardInference (", shape.DebugString(), ")"));
}

absl::Status CudnnKernelsImpl::BatchNormBackward(const BatchNormShape& shape, const float* x,
                                                 const float* dy, const float* gamma, float* dx,
                                                 float* dgamma, float* dbeta) {
  Owned<cudnnTensorDescriptor_t> xd(nullptr, lib_.DestroyTensorDescriptor);
  Owned<cudnnTensorDescriptor_t> cd(nullptr, lib_.DestroyTensorDescriptor);
  TOWERPS_RETURN_IF_ERROR(BatchNormDescs(shape, &xd, &cd));
  // No saved mean and inverse standard deviation: cuDNN computes them from x,
  // which is what the forward computed them from.
  return Check(lib_.BatchNormalizationBackward(
                   handle_.get(), CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, &kOne, &kZero,
                   xd.get(), x, xd.get(), dy, xd.get(), dx, cd.get(), gamma, dgamma, dbeta,
                   shape.epsilon, /*savedMean=*/nullptr, /*savedInvVariance=*/nullptr),
               absl::StrCat("cudnnBatchNormalizationBackward (", shape.DebugString(), ")"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudnnKernels>> NewCudnnKernels(cudaStream_t stream,
                                                              const std::string& where) {
  std::string why;
  const CudnnLib* lib = Cudnn(&why);
  if (lib == nullptr) {
    return absl::UnavailableError(absl::StrCat(where, ": cuDNN unavailable: ", why));
  }
  cudnnHandle_t raw = nullptr;
  TOWERPS_RETURN_IF_GPU_ERROR(lib->Create(&raw), absl::StrCat(where, ": cudnnCreate"));
  Owned<cudnnHandle_t> handle(raw, lib->Destroy);
  TOWERPS_RETURN_IF_GPU_ERROR(lib->SetStream(raw, stream), absl::StrCat(where, ": cudnnSetStream"));
  return std::unique_ptr<CudnnKernels>(
      new CudnnKernelsImpl(*lib, stream, where, std::move(handle)));
}

}  // namespace towerps::worker
