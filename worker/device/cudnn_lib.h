// cuDNN, loaded at run time with dlopen instead of linked.
//
// cuDNN is not part of the CUDA toolkit proper and is needed only for
// convolution, pooling and batch norm on the GPU; linking it would stop every
// CUDA binary (worker, ps, the GPU tests) from starting on a machine without
// libcudnn.so.9, and its engine libraries are hundreds of megabytes. Loading
// it on first use leaves the rest of the CUDA backend working and turns its
// absence into a clear answer ("cuDNN unavailable: ...") from the calls that
// need it. As worker/device/nccl_lib.h does for NCCL.
//
// Only the legacy (v7/v8-style) entry points that cuDNN 9 still has, types
// from the toolkit's <cudnn.h>. libcudnn.so.9 is cuDNN 9's small front
// library: it loads its own sub-libraries (ops, cnn, engines) from its folder
// when first needed.
//
// CUDA builds only. Thread-safe.
#ifndef TOWERPS_WORKER_DEVICE_CUDNN_LIB_H_
#define TOWERPS_WORKER_DEVICE_CUDNN_LIB_H_

#include <cudnn.h>

#include <cstddef>
#include <string>

namespace towerps::worker {

// The cuDNN entry points this project uses, resolved from one library.
struct CudnnLib {
  std::string path;    // as passed to dlopen
  size_t version = 0;  // cudnnGetVersion's answer, e.g. 91900 for 9.19.0
  decltype(&cudnnGetErrorString) GetErrorString = nullptr;
  decltype(&cudnnCreate) Create = nullptr;
  decltype(&cudnnDestroy) Destroy = nullptr;
  decltype(&cudnnSetStream) SetStream = nullptr;
  // Descriptors.
  decltype(&cudnnCreateTensorDescriptor) CreateTensorDescriptor = nullptr;
  decltype(&cudnnSetTensor4dDescriptor) SetTensor4dDescriptor = nullptr;
  decltype(&cudnnDestroyTensorDescriptor) DestroyTensorDescriptor = nullptr;
  decltype(&cudnnCreateFilterDescriptor) CreateFilterDescriptor = nullptr;
  decltype(&cudnnSetFilter4dDescriptor) SetFilter4dDescriptor = nullptr;
  decltype(&cudnnDestroyFilterDescriptor) DestroyFilterDescriptor = nullptr;
  decltype(&cudnnCreateConvolutionDescriptor) CreateConvolutionDescriptor = nullptr;
  decltype(&cudnnSetConvolution2dDescriptor) SetConvolution2dDescriptor = nullptr;
  decltype(&cudnnSetConvolutionMathType) SetConvolutionMathType = nullptr;
  decltype(&cudnnDestroyConvolutionDescriptor) DestroyConvolutionDescriptor = nullptr;
  decltype(&cudnnCreatePoolingDescriptor) CreatePoolingDescriptor = nullptr;
  decltype(&cudnnSetPooling2dDescriptor) SetPooling2dDescriptor = nullptr;
  decltype(&cudnnDestroyPoolingDescriptor) DestroyPoolingDescriptor = nullptr;
  // Convolution.
  decltype(&cudnnGetConvolutionForwardWorkspaceSize) GetConvolutionForwardWorkspaceSize =
      nullptr;
  decltype(&cudnnConvolutionForward) ConvolutionForward = nullptr;
  decltype(&cudnnGetConvolutionBackwardDataWorkspaceSize)
      GetConvolutionBackwardDataWorkspaceSize = nullptr;
  decltype(&cudnnConvolutionBackwardData) ConvolutionBackwardData = nullptr;
  decltype(&cudnnGetConvolutionBackwardFilterWorkspaceSize)
      GetConvolutionBackwardFilterWorkspaceSize = nullptr;
  decltype(&cudnnConvolutionBackwardFilter) ConvolutionBackwardFilter = nullptr;
  decltype(&cudnnConvolutionBackwardBias) ConvolutionBackwardBias = nullptr;
  decltype(&cudnnAddTensor) AddTensor = nullptr;
  decltype(&cudnnScaleTensor) ScaleTensor = nullptr;
  // Pooling.
  decltype(&cudnnPoolingForward) PoolingForward = nullptr;
  decltype(&cudnnPoolingBackward) PoolingBackward = nullptr;
  // Batch normalization.
  decltype(&cudnnBatchNormalizationForwardTraining) BatchNormalizationForwardTraining =
      nullptr;
  decltype(&cudnnBatchNormalizationForwardInference) BatchNormalizationForwardInference =
      nullptr;
  decltype(&cudnnBatchNormalizationBackward) BatchNormalizationBackward = nullptr;
};

// The process's cuDNN: loaded once, on first call, as "libcudnn.so.9" (the
// dynamic loader's search: LD_LIBRARY_PATH, the ld cache), else from the
// toolkit's library folders. nullptr when it cannot be loaded; then `why`
// (if not null) says what failed, e.g. "libcudnn.so.9: cannot open shared
// object file". The library stays loaded for the life of the process.
// Loading needs no GPU.
const CudnnLib* Cudnn(std::string* why = nullptr);

// Loads the library at `path` now (not cached; for tests). False, with
// `why` set, when it cannot be opened, lacks an entry point, or is not
// cuDNN 9.
bool LoadCudnnFrom(const std::string& path, CudnnLib* lib, std::string* why);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_DEVICE_CUDNN_LIB_H_
