#include "worker/device/gpu_info.h"

#include <cstdlib>

#include "gtest/gtest.h"

namespace towerps::worker {
namespace {

TEST(GpuInfoTest, AnswersWithoutCrashingAndDescribes) {
  GpuInfo info = QueryGpus();
  const std::string line = DescribeGpus(info);
  EXPECT_EQ(line.rfind("CUDA: ", 0), 0u) << line;
  if (info.cuda_built) {
    // The libraries answer even without a GPU.
    EXPECT_GT(info.cublas_version, 0);
    EXPECT_GT(info.nccl_version, 0) << info.nccl_note;
    if (info.devices.empty()) {
      EXPECT_FALSE(info.note.empty());
    }
    for (const auto& d : info.devices) EXPECT_GT(d.memory_bytes, 0);
  } else {
    EXPECT_TRUE(info.devices.empty());
    EXPECT_EQ(line, "CUDA: not built (CPU-only)");
  }
}

TEST(GpuInfoTest, NoGpuSaysSoPlainly) {
  GpuInfo info;
  info.cuda_built = true;
  info.note = "CUDA driver version is insufficient for CUDA runtime version";
  info.cublas_version = 130000;
  EXPECT_EQ(DescribeGpus(info), "CUDA: no GPU found, running on CPU");
  info.driver_loaded = true;  // a driver without a usable device: its words matter
  EXPECT_EQ(DescribeGpus(info),
            "CUDA: no usable GPU (CUDA driver version is insufficient for CUDA runtime "
            "version), running on CPU");
}

TEST(GpuInfoTest, DescribeListsDevices) {
  GpuInfo info;
  info.cuda_built = true;
  info.devices.push_back({0, "Test GPU", 2LL << 30});
  info.cublas_version = 130000;
  info.nccl_version = 22703;
  EXPECT_EQ(DescribeGpus(info), "CUDA: 1 GPU(s) [0: Test GPU, 2048 MiB]; cuBLAS 130000; NCCL 22703");
  info.nccl_version = 0;
  info.nccl_note = "libnccl.so.2: cannot open shared object file";
  EXPECT_EQ(DescribeGpus(info),
            "CUDA: 1 GPU(s) [0: Test GPU, 2048 MiB]; cuBLAS 130000; "
            "NCCL unavailable (libnccl.so.2: cannot open shared object file)");
}

}  // namespace
}  // namespace towerps::worker
