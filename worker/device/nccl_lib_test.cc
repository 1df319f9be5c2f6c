#include "worker/device/nccl_lib.h"

#include <string>

#include "gtest/gtest.h"

namespace towerps::worker {
namespace {

// The machines that build with CUDA here have NCCL installed with the
// toolkit; loading needs no GPU.
TEST(NcclLibTest, LoadsTheInstalledLibraryOnce) {
  std::string why;
  const NcclLib* lib = Nccl(&why);
  ASSERT_NE(lib, nullptr) << why;
  EXPECT_GE(lib->version, 20000) << "NCCL 2.x versions are major*10000+...";
  EXPECT_EQ(Nccl(), lib);
  EXPECT_STREQ(lib->GetErrorString(ncclSuccess), "no error");
  EXPECT_NE(std::string(lib->GetErrorString(ncclInvalidUsage)), "no error");
}

TEST(NcclLibTest, AMissingLibraryIsAnAnswerNotACrash) {
  NcclLib lib;
  std::string why;
  EXPECT_FALSE(LoadNcclFrom("/nonexistent/libnccl.so.2", &lib, &why));
  EXPECT_NE(why.find("/nonexistent/libnccl.so.2"), std::string::npos) << why;
  EXPECT_EQ(lib.AllReduce, nullptr);
}

TEST(NcclLibTest, ALibraryWithoutNcclIsRefusedNamingTheSymbol) {
  // libdl/libc is loadable but has no NCCL in it.
  NcclLib lib;
  std::string why;
  EXPECT_FALSE(LoadNcclFrom("libc.so.6", &lib, &why));
  EXPECT_NE(why.find("ncclGetVersion"), std::string::npos) << why;
}

}  // namespace
}  // namespace towerps::worker
