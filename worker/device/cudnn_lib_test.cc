#include "worker/device/cudnn_lib.h"

#include <string>

#include "gtest/gtest.h"

namespace towerps::worker {
namespace {

// The machines that build with CUDA here have cuDNN 9 installed with the
// toolkit; loading it and resolving its symbols needs no GPU.
TEST(CudnnLibTest, LoadsTheInstalledLibraryOnce) {
  std::string why;
  const CudnnLib* lib = Cudnn(&why);
  ASSERT_NE(lib, nullptr) << why;
  EXPECT_EQ(lib->version / 10000, 9u) << lib->version;
  EXPECT_EQ(Cudnn(), lib);
  EXPECT_STREQ(lib->GetErrorString(CUDNN_STATUS_SUCCESS), "CUDNN_STATUS_SUCCESS");
  EXPECT_STRNE(lib->GetErrorString(CUDNN_STATUS_BAD_PARAM), "CUDNN_STATUS_SUCCESS");
}

// Descriptors are host objects: they work without a GPU, which checks that
// the resolved pointers really are the functions their names say.
TEST(CudnnLibTest, DescriptorsWorkWithoutAGpu) {
  const CudnnLib* lib = Cudnn();
  ASSERT_NE(lib, nullptr);
  cudnnTensorDescriptor_t desc = nullptr;
  ASSERT_EQ(lib->CreateTensorDescriptor(&desc), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(lib->SetTensor4dDescriptor(desc, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 3, 5, 7, 5),
            CUDNN_STATUS_SUCCESS);
  EXPECT_NE(lib->SetTensor4dDescriptor(desc, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 0, 5, 7, 5),
            CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(lib->DestroyTensorDescriptor(desc), CUDNN_STATUS_SUCCESS);

  cudnnPoolingDescriptor_t pool = nullptr;
  ASSERT_EQ(lib->CreatePoolingDescriptor(&pool), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(lib->SetPooling2dDescriptor(pool, CUDNN_POOLING_MAX_DETERMINISTIC,
                                        CUDNN_NOT_PROPAGATE_NAN, 3, 3, 1, 1, 2, 2),
            CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(lib->DestroyPoolingDescriptor(pool), CUDNN_STATUS_SUCCESS);
}

TEST(CudnnLibTest, AMissingLibraryIsAnAnswerNotACrash) {
  CudnnLib lib;
  std::string why;
  EXPECT_FALSE(LoadCudnnFrom("/nonexistent/libcudnn.so.9", &lib, &why));
  EXPECT_NE(why.find("/nonexistent/libcudnn.so.9"), std::string::npos) << why;
  EXPECT_EQ(lib.ConvolutionForward, nullptr);
}

TEST(CudnnLibTest, ALibraryWithoutCudnnIsRefusedNamingTheSymbol) {
  // libc is loadable but has no cuDNN in it.
  CudnnLib lib;
  std::string why;
  EXPECT_FALSE(LoadCudnnFrom("libc.so.6", &lib, &why));
  EXPECT_NE(why.find("cudnnGetVersion"), std::string::npos) << why;
}

}  // namespace
}  // namespace towerps::worker
