#include "worker/device/gpu_info.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace towerps::worker {
namespace {

// The first mapping of this process (/proc/self/maps) whose path has `name`
// in it, e.g. "/libcublas.so." (not our own libcublas_lib.so of fastbuild),
// or "" when there is none.
std::string MappedLine(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(name) != std::string::npos) return line;
  }
  return "";
}

TEST(GpuInfoTest, AnswersWithoutCrashingAndDescribes) {
  GpuInfo info = QueryGpus();
  const std::string line = DescribeGpus(info);
  EXPECT_EQ(line.rfind("CUDA: ", 0), 0u) << line;
  if (info.cuda_built) {
    if (info.devices.empty()) {
      EXPECT_FALSE(info.note.empty());
      // Without a GPU the GPU libraries stay out of the process: cuBLAS
      // alone is ~150 MB of resident memory.
      EXPECT_EQ(info.cublas_version, 0);
      EXPECT_EQ(info.nccl_version, 0);
      EXPECT_EQ(MappedLine("/libcublas.so."), "");
      EXPECT_EQ(MappedLine("/libcublasLt.so."), "");
      EXPECT_EQ(MappedLine("/libnccl.so."), "");
    } else {
      EXPECT_GT(info.cublas_version, 0) << info.cublas_note;
      EXPECT_GT(info.nccl_version, 0) << info.nccl_note;
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
  info.cublas_version = 0;
  info.cublas_note = "libcublas.so.13: cannot open shared object file";
  EXPECT_EQ(DescribeGpus(info),
            "CUDA: 1 GPU(s) [0: Test GPU, 2048 MiB]; "
            "cuBLAS unavailable (libcublas.so.13: cannot open shared object file); "
            "NCCL unavailable (libnccl.so.2: cannot open shared object file)");
}

}  // namespace
}  // namespace towerps::worker
