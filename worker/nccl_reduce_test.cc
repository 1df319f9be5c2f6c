// NCCL all-reduce over every visible GPU (one is enough: a 1-rank group).
// Tagged "gpu" in worker/BUILD; the GPU test skips itself without CUDA or a
// GPU.
#include "worker/nccl_reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/gpu_info.h"
#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "worker/backend.h"

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

TEST(NcclGroupTest, AllReduceSumsOverEveryVisibleGpu) {
  if (!NcclGroup::Available()) GTEST_SKIP() << "NCCL unavailable";
  const common::GpuInfo info = common::QueryGpus();
  TOWERPS_SKIP_WITHOUT_GPU(info);
  std::vector<int> gpus;
  for (const auto& device : info.devices) gpus.push_back(device.index);
  const int ranks = static_cast<int>(gpus.size());

  auto group = NcclGroup::Create(gpus);
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ((*group)->size(), ranks);
  if (ranks == 1) {
    // Said in the output, since it limits what this test shows.
    std::printf("note: 1 GPU, so 1 rank: NCCL runs, but a sum over one rank "
                "equals its input\n");
  }
  // The backends only provide device memory and copies here.
  std::vector<std::unique_ptr<Backend>> backends;
  for (int gpu : gpus) {
    auto backend = NewCudaBackend(gpu);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backends.push_back(std::move(*backend));
  }

  for (int64_t n : {int64_t{1}, int64_t{1000003}}) {
    std::vector<float*> buffers(ranks);
    for (int r = 0; r < ranks; ++r) {
      auto p = backends[r]->Allocate(n);
      ASSERT_TRUE(p.ok()) << p.status();
      buffers[r] = *p;
      std::vector<float> host(n);
      for (int64_t i = 0; i < n; ++i) host[i] = Value(r, i);
      backends[r]->CopyFromHost(host.data(), n, buffers[r]);  // Synchronous.
    }
    const absl::Status status = (*group)->AllReduceSum(buffers, n);
    ASSERT_TRUE(status.ok()) << status;
    for (int r = 0; r < ranks; ++r) {
      std::vector<float> got(n);
      ASSERT_TRUE(backends[r]->CopyToHost(buffers[r], n, got.data()).ok());
      for (int64_t i = 0; i < n; ++i) {
        float want = 0.0f;
        for (int s = 0; s < ranks; ++s) want += Value(s, i);
        ASSERT_EQ(got[i], want) << "rank " << r << " element " << i;
      }
      backends[r]->Free(buffers[r]);
    }
  }

  EXPECT_TRUE((*group)->AllReduceSum(std::vector<float*>(ranks), 0).ok());
  EXPECT_EQ((*group)->AllReduceSum(std::vector<float*>(ranks + 1), 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*group)->AllReduceSum(std::vector<float*>(ranks), -1).code(),
            absl::StatusCode::kInvalidArgument);
}

// Several variables in one call (one NCCL group), sizes mixed, one empty;
// a malformed op anywhere refuses the whole call before anything runs.
TEST(NcclGroupTest, ManyOpsInOneGroupEachSumOverTheRanks) {
  if (!NcclGroup::Available()) GTEST_SKIP() << "NCCL unavailable";
  const common::GpuInfo info = common::QueryGpus();
  TOWERPS_SKIP_WITHOUT_GPU(info);
  std::vector<int> gpus;
  for (const auto& device : info.devices) gpus.push_back(device.index);
  const int ranks = static_cast<int>(gpus.size());
  auto group = NcclGroup::Create(gpus);
  ASSERT_TRUE(group.ok()) << group.status();
  std::vector<std::unique_ptr<Backend>> backends;
  for (int gpu : gpus) {
    auto backend = NewCudaBackend(gpu);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backends.push_back(std::move(*backend));
  }
  const std::vector<int64_t> sizes = {300, 1, 0, 65537, 12};
  std::vector<NcclGroup::Op> ops;
  for (size_t k = 0; k < sizes.size(); ++k) {
    NcclGroup::Op op{{}, sizes[k]};
    for (int r = 0; r < ranks; ++r) {
      auto p = backends[r]->Allocate(std::max<int64_t>(sizes[k], 1));
      ASSERT_TRUE(p.ok()) << p.status();
      std::vector<float> host(sizes[k]);
      // Offset by k so that a mix-up between ops shows.
      for (int64_t i = 0; i < sizes[k]; ++i) host[i] = Value(r, i) + 1000.0f * k;
      backends[r]->CopyFromHost(host.data(), sizes[k], *p);
      op.buffers.push_back(*p);
    }
    ops.push_back(op);
  }
  std::vector<NcclGroup::Op> bad = ops;
  bad.back().buffers.pop_back();
  EXPECT_EQ((*group)->AllReduceSum(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = ops;
  bad[1].n = -1;
  EXPECT_EQ((*group)->AllReduceSum(bad).code(), absl::StatusCode::kInvalidArgument);

  // The refused calls left the buffers alone: one real call sums once.
  const absl::Status status = (*group)->AllReduceSum(ops);
  ASSERT_TRUE(status.ok()) << status;
  for (size_t k = 0; k < sizes.size(); ++k) {
    for (int r = 0; r < ranks; ++r) {
      std::vector<float> got(sizes[k]);
      ASSERT_TRUE(backends[r]->CopyToHost(ops[k].buffers[r], sizes[k], got.data()).ok());
      for (int64_t i = 0; i < sizes[k]; ++i) {
        float want = 0.0f;
        for (int s = 0; s < ranks; ++s) want += Value(s, i) + 1000.0f * k;
        ASSERT_EQ(got[i], want) << "op " << k << " rank " << r << " element " << i;
      }
      backends[r]->Free(ops[k].buffers[r]);
    }
  }
}

}  // namespace
}  // namespace towerps::worker
