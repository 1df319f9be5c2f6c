#include "worker/device/cublas_lib.h"

#include <string>

#include "gtest/gtest.h"

namespace towerps::worker {
namespace {

// Whether cuBLAS was in the process before main, whatever order the tests
// run in: nothing in this test binary links it.
const bool kLoadedAtStart = CublasLoaded();

// The machines that build with CUDA have cuBLAS with the toolkit; loading
// it and resolving its symbols needs no GPU.
TEST(CublasLibTest, LoadsTheInstalledLibraryOnceAndOnlyWhenAsked) {
  EXPECT_FALSE(kLoadedAtStart);
  std::string why;
  const CublasLib* lib = Cublas(&why);
  ASSERT_NE(lib, nullptr) << why;
  EXPECT_TRUE(CublasLoaded());
  EXPECT_EQ(lib->version / 10000, CUBLAS_VER_MAJOR) << lib->version;
  EXPECT_EQ(Cublas(), lib);
  // Status names are host-side: they show the pointers are the functions
  // their names say.
  EXPECT_STREQ(lib->GetStatusName(CUBLAS_STATUS_SUCCESS), "CUBLAS_STATUS_SUCCESS");
  EXPECT_STREQ(lib->GetStatusName(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE");
  EXPECT_NE(std::string(lib->GetStatusString(CUBLAS_STATUS_ALLOC_FAILED)), "");
}

TEST(CublasLibTest, AMissingLibraryIsAnAnswerNotACrash) {
  CublasLib lib;
  std::string why;
  EXPECT_FALSE(LoadCublasFrom("/nonexistent/libcublas.so.13", &lib, &why));
  EXPECT_NE(why.find("/nonexistent/libcublas.so.13"), std::string::npos) << why;
  EXPECT_EQ(lib.Sgemm, nullptr);
}

TEST(CublasLibTest, ALibraryWithoutCublasIsRefusedNamingTheSymbol) {
  CublasLib lib;
  std::string why;
  EXPECT_FALSE(LoadCublasFrom("libc.so.6", &lib, &why));
  EXPECT_NE(why.find("cublasGetProperty"), std::string::npos) << why;
}

}  // namespace
}  // namespace towerps::worker
