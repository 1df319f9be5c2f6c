// NCCL all-reduce over every visible GPU (one is enough: a 1-rank group).
// Tagged "gpu" in worker/BUILD; the GPU test skips itself without CUDA or a
// GPU.
#include "worker/device/nccl_reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/device/backend.h"
#include "worker/device/gpu_info.h"
#include "worker/device/gpu_test_util.h"

namespace towerps::worker {
namespace {

TEST(NcclGroupTest, DuplicateGpusAreRejected) {
  const auto group = NcclGroup::Create({0, 1, 0});
  if (!NcclGroup::Available()) {
    EXPECT_EQ(group.status().code(), absl::StatusCode::kUnavailable);
    return;
  }
  // Checked before touching any GPU, so this runs without one.
  EXPECT_EQ(group.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(
      group.status().message().find("NCCL does not allow two ranks on one GPU"),
      std::string::npos)
      << group.status();
}

TEST(NcclGroupTest, EmptyOrNegativeIsInvalid) {
  if (!NcclGroup::Available()) GTEST_SKIP() << "NCCL unavailable";
  EXPECT_EQ(NcclGroup::Create({}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclGroup::Create({-1}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Rank r's value at i: small integers and halves, so every order of
// summation gives the exact sum.
float Value(int r, int64_t i) {
  return static_cast<float>((r + 1) * (i % 97 - 48)) + 0.5f * r;
}

// A group over every visible GPU, with one backend per GPU for device
// memory and copies.
class NcclOnGpusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!NcclGroup::Available()) GTEST_SKIP() << "NCCL unavailable";
    const GpuInfo info = QueryGpus();
    TOWERPS_SKIP_WITHOUT_GPU(info);
    std::vector<int> gpus;
    for (const auto& device : info.devices) gpus.push_back(device.index);
    ranks_ = static_cast<int>(gpus.size());
    auto group = NcclGroup::Create(gpus);
    ASSERT_TRUE(group.ok()) << group.status();
    group_ = std::move(*group);
    EXPECT_EQ(group_->size(), ranks_);
    if (ranks_ == 1) {
      // Said in the output, since it limits what these tests show.
      std::printf("note: 1 GPU, so 1 rank: NCCL runs, but a sum over one rank "
                  "equals its input\n");
    }
    for (int gpu : gpus) {
      auto backend = NewCudaBackend(gpu);
      ASSERT_TRUE(backend.ok()) << backend.status();
      backends_.push_back(std::move(*backend));
    }
  }

  // Rank r's buffer of n floats holding Value(r, i) + offset.
  float* Upload(int r, int64_t n, float offset) {
    auto p = backends_[r]->Allocate(std::max<int64_t>(n, 1));
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return nullptr;
    std::vector<float> host(n);
    for (int64_t i = 0; i < n; ++i) host[i] = Value(r, i) + offset;
    backends_[r]->CopyFromHost(host.data(), n, *p);  // Synchronous.
    return *p;
  }

  // Rank r's buffer holds the sum over ranks of Upload(., n, offset)'s
  // values; then frees it.
  void ExpectSumAndFree(int r, float* buffer, int64_t n, float offset,
                        const std::string& what) {
    std::vector<float> got(n);
    ASSERT_TRUE(backends_[r]->CopyToHost(buffer, n, got.data()).ok());
    for (int64_t i = 0; i < n; ++i) {
      float want = 0.0f;
      for (int s = 0; s < ranks_; ++s) want += Value(s, i) + offset;
      ASSERT_EQ(got[i], want) << what << " rank " << r << " element " << i;
    }
    backends_[r]->Free(buffer);
  }

  int ranks_ = 0;
  std::unique_ptr<NcclGroup> group_;
  std::vector<std::unique_ptr<Backend>> backends_;
};

TEST_F(NcclOnGpusTest, AllReduceSumsOverEveryVisibleGpu) {
  for (int64_t n : {int64_t{1}, int64_t{1000003}}) {
    std::vector<float*> buffers(ranks_);
    for (int r = 0; r < ranks_; ++r) buffers[r] = Upload(r, n, 0.0f);
    const absl::Status status = group_->AllReduceSum(buffers, n);
    ASSERT_TRUE(status.ok()) << status;
    for (int r = 0; r < ranks_; ++r) {
      ExpectSumAndFree(r, buffers[r], n, 0.0f, "n=" + std::to_string(n));
    }
  }
  EXPECT_TRUE(group_->AllReduceSum(std::vector<float*>(ranks_), 0).ok());
  EXPECT_EQ(group_->AllReduceSum(std::vector<float*>(ranks_ + 1), 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(group_->AllReduceSum(std::vector<float*>(ranks_), -1).code(),
            absl::StatusCode::kInvalidArgument);
}

// Several variables in one call (one NCCL group), sizes mixed, one empty;
// a malformed op anywhere refuses the whole call before anything runs.
TEST_F(NcclOnGpusTest, ManyOpsInOneGroupEachSumOverTheRanks) {
  const std::vector<int64_t> sizes = {300, 1, 0, 65537, 12};
  std::vector<NcclGroup::Op> ops;
  for (size_t k = 0; k < sizes.size(); ++k) {
    NcclGroup::Op op{{}, sizes[k]};
    // Offset by k so that a mix-up between ops shows.
    for (int r = 0; r < ranks_; ++r) op.buffers.push_back(Upload(r, sizes[k], 1000.0f * k));
    ops.push_back(op);
  }
  std::vector<NcclGroup::Op> bad = ops;
  bad.back().buffers.pop_back();
  EXPECT_EQ(group_->AllReduceSum(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = ops;
  bad[1].n = -1;
  EXPECT_EQ(group_->AllReduceSum(bad).code(), absl::StatusCode::kInvalidArgument);

  // The refused calls left the buffers alone: one real call sums once.
  const absl::Status status = group_->AllReduceSum(ops);
  ASSERT_TRUE(status.ok()) << status;
  for (size_t k = 0; k < sizes.size(); ++k) {
    for (int r = 0; r < ranks_; ++r) {
      ExpectSumAndFree(r, ops[k].buffers[r], sizes[k], 1000.0f * k, "op " + std::to_string(k));
    }
  }
}

}  // namespace
}  // namespace towerps::worker
