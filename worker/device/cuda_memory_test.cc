#include "worker/device/cuda_memory.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "worker/device/device_manager.h"
#include "worker/device/gpu_info.h"
#include "worker/device/gpu_test_util.h"

namespace towerps::worker {
namespace {

TEST(CudaMemoryTest, UnavailableInCpuOnlyBuilds) {
  if (QueryGpus().cuda_built) GTEST_SKIP() << "built with CUDA";
  EXPECT_EQ(NewCudaMemoryBackend(0).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(CudaMemoryTest, NegativeGpuIsInvalid) {
  if (!QueryGpus().cuda_built) GTEST_SKIP() << "built without CUDA";
  EXPECT_EQ(NewCudaMemoryBackend(-1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

class CudaMemoryGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const GpuInfo info = QueryGpus();
    if (!info.cuda_built) GTEST_SKIP() << "built without CUDA";
    TOWERPS_SKIP_WITHOUT_GPU(info);
  }
};

TEST_F(CudaMemoryGpuTest, AllocatesUniqueBlocksIncludingEmptyOnes) {
  auto backend = NewCudaMemoryBackend(0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto a = (*backend)->Alloc(0);
  auto b = (*backend)->Alloc(0);
  auto c = (*backend)->Alloc(1 << 20);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_NE(*a, nullptr);
  EXPECT_NE(*a, *b);
  EXPECT_NE(*c, nullptr);
  (*backend)->Free(*a);
  (*backend)->Free(*b);
  (*backend)->Free(*c);
  (*backend)->Free(nullptr);
}

TEST_F(CudaMemoryGpuTest, HugeAllocationIsResourceExhausted) {
  auto backend = NewCudaMemoryBackend(0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  // 1 PiB: more than any GPU has.
  const auto p = (*backend)->Alloc(int64_t{1} << 50);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(p.status().message().find("GPU 0"), std::string::npos)
      << p.status();
  // The failure does not poison later allocations.
  const auto q = (*backend)->Alloc(1024);
  ASSERT_TRUE(q.ok()) << q.status();
  (*backend)->Free(*q);
}

TEST_F(CudaMemoryGpuTest, AllocatorLimitNamesTheDevice) {
  auto backend = NewCudaMemoryBackend(0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  Allocator allocator("/job:localhost/replica:0/task:0/device:GPU:0", kMegabyte,
                      std::move(*backend));
  auto p = allocator.Allocate(kMegabyte);
  ASSERT_TRUE(p.ok()) << p.status();
  const auto q = allocator.Allocate(1);
  EXPECT_EQ(q.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(q.status().message().find("device:GPU:0"), std::string::npos)
      << q.status();
  allocator.Deallocate(*p);
  EXPECT_EQ(allocator.bytes_in_use(), 0);
}

}  // namespace
}  // namespace towerps::worker
