// For GPU tests: skip without a usable GPU, unless a GPU is required.
//
// tests/gpu/run.sh sets TOWERPS_REQUIRE_GPU=1 on a machine whose nvidia-smi
// lists a GPU; there a GPU that CUDA cannot use (a driver older than the
// runtime, a stub libcuda) fails the tests instead of skipping them all and
// passing.
#ifndef TOWERPS_WORKER_DEVICE_GPU_TEST_UTIL_H_
#define TOWERPS_WORKER_DEVICE_GPU_TEST_UTIL_H_

#include <cstdlib>
#include <cstring>

#include "gtest/gtest.h"
#include "worker/device/gpu_info.h"

namespace towerps::worker {

inline bool GpuRequired() {
  const char* v = std::getenv("TOWERPS_REQUIRE_GPU");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

}  // namespace towerps::worker

// In a test body or SetUp: returns (skipping, or failing when a GPU is
// required) when `info` (a GpuInfo) lists no GPU.
#define TOWERPS_SKIP_WITHOUT_GPU(info)                                      \
  do {                                                                      \
    if ((info).devices.empty()) {                                           \
      if (::towerps::worker::GpuRequired()) {                               \
        FAIL() << "TOWERPS_REQUIRE_GPU=1 but CUDA sees no GPU: "            \
               << (info).note;                                              \
      }                                                                     \
      GTEST_SKIP() << "no GPU: " << (info).note;                            \
    }                                                                       \
  } while (0)

#endif  // TOWERPS_WORKER_DEVICE_GPU_TEST_UTIL_H_
