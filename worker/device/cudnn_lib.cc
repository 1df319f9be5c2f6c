#include "worker/device/cudnn_lib.h"

#include "absl/strings/str_cat.h"
#include "worker/device/dynamic_lib.h"

namespace towerps::worker {

bool LoadCudnnFrom(const std::string& path, CudnnLib* lib, std::string* why) {
  void* handle = OpenLibrary(path, why);
  if (handle == nullptr) return false;
  CudnnLib l;
  l.path = path;
  std::string error;
  decltype(&cudnnGetVersion) get_version = nullptr;
  // One chain: the first missing symbol stops it and is named.
  const bool ok =
      Resolve(handle, "cudnnGetVersion", &get_version, &error) &&
      Resolve(handle, "cudnnGetErrorString", &l.GetErrorString, &error) &&
      Resolve(handle, "cudnnCreate", &l.Create, &error) &&
      Resolve(handle, "cudnnDestroy", &l.Destroy, &error) &&
      Resolve(handle, "cudnnSetStream", &l.SetStream, &error) &&
      Resolve(handle, "cudnnCreateTensorDescriptor", &l.CreateTensorDescriptor, &error) &&
      Resolve(handle, "cudnnSetTensor4dDescriptor", &l.SetTensor4dDescriptor, &error) &&
      Resolve(handle, "cudnnDestroyTensorDescriptor", &l.DestroyTensorDescriptor, &error) &&
      Resolve(handle, "cudnnCreateFilterDescriptor", &l.CreateFilterDescriptor, &error) &&
      Resolve(handle, "cudnnSetFilter4dDescriptor", &l.SetFilter4dDescriptor, &error) &&
      Resolve(handle, "cudnnDestroyFilterDescriptor", &l.DestroyFilterDescriptor, &error) &&
      Resolve(handle, "cudnnCreateConvolutionDescriptor", &l.CreateConvolutionDescriptor,
              &error) &&
      Resolve(handle, "cudnnSetConvolution2dDescriptor", &l.SetConvolution2dDescriptor,
              &error) &&
      Resolve(handle, "cudnnSetConvolutionMathType", &l.SetConvolutionMathType, &error) &&
      Resolve(handle, "cudnnDestroyConvolutionDescriptor", &l.DestroyConvolutionDescriptor,
              &error) &&
      Resolve(handle, "cudnnCreatePoolingDescriptor", &l.CreatePoolingDescriptor, &error) &&
      Resolve(handle, "cudnnSetPooling2dDescriptor", &l.SetPooling2dDescriptor, &error) &&
      Resolve(handle, "cudnnDestroyPoolingDescriptor", &l.DestroyPoolingDescriptor, &error) &&
      Resolve(handle, "cudnnGetConvolutionForwardWorkspaceSize",
              &l.GetConvolutionForwardWorkspaceSize, &error) &&
      Resolve(handle, "cudnnConvolutionForward", &l.ConvolutionForward, &error) &&
      Resolve(handle, "cudnnGetConvolutionBackwardDataWorkspaceSize",
              &l.GetConvolutionBackwardDataWorkspaceSize, &error) &&
      Resolve(handle, "cudnnConvolutionBackwardData", &l.ConvolutionBackwardData, &error) &&
      Resolve(handle, "cudnnGetConvolutionBackwardFilterWorkspaceSize",
              &l.GetConvolutionBackwardFilterWorkspaceSize, &error) &&
      Resolve(handle, "cudnnConvolutionBackwardFilter", &l.ConvolutionBackwardFilter,
              &error) &&
      Resolve(handle, "cudnnConvolutionBackwardBias", &l.ConvolutionBackwardBias, &error) &&
      Resolve(handle, "cudnnAddTensor", &l.AddTensor, &error) &&
      Resolve(handle, "cudnnScaleTensor", &l.ScaleTensor, &error) &&
      Resolve(handle, "cudnnPoolingForward", &l.PoolingForward, &error) &&
      Resolve(handle, "cudnnPoolingBackward", &l.PoolingBackward, &error) &&
      Resolve(handle, "cudnnBatchNormalizationForwardTraining",
              &l.BatchNormalizationForwardTraining, &error) &&
      Resolve(handle, "cudnnBatchNormalizationForwardInference",
              &l.BatchNormalizationForwardInference, &error) &&
      Resolve(handle, "cudnnBatchNormalizationBackward", &l.BatchNormalizationBackward,
              &error);
  if (ok) {
    // Needs no GPU. The header's types and enums are cuDNN 9's; another
    // major version would disagree with them silently.
    l.version = get_version();
    if (l.version / 10000 != CUDNN_MAJOR) {
      error = absl::StrCat("version ", l.version, " is not cuDNN ", CUDNN_MAJOR,
                           " (built against ", CUDNN_VERSION, ")");
    }
  }
  if (!error.empty()) {
    CloseLibrary(handle);
    if (why != nullptr) *why = path + ": " + error;
    return false;
  }
  *lib = std::move(l);
  return true;
}

const CudnnLib* Cudnn(std::string* why) {
  return LoadOnce<CudnnLib>("libcudnn.so.9", &LoadCudnnFrom, why);
}

}  // namespace towerps::worker
