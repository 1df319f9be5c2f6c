#include "worker/model/dataset.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/model/dataset_internal.h"

namespace towerps::worker {
namespace {

// How a global batch of `size` examples is cut among the workers: worker
// w's part starts at `start` and holds `len` (contiguous parts whose sizes
// differ by at most one, the larger ones first). WorkerSlice, ShardSlice
// and ShardSize all cut this way.
struct Part {
  int64_t start;
  int64_t len;
};
Part CutBatch(int64_t size, int num_workers, int worker) {
  const int64_t base = size / num_workers;
  const int64_t extra = size % num_workers;
  return {worker * base + std::min<int64_t>(worker, extra), base + (worker < extra ? 1 : 0)};
}

// SplitMix64's finalizer.
uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace

namespace dataset_internal {

absl::Status CheckShard(const DataShard& shard) {
  if (shard.global_batch <= 0 || shard.num_workers <= 0 || shard.worker < 0 ||
      shard.worker >= shard.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data shard: global batch ", shard.global_batch, ", worker ", shard.worker, " of ",
        shard.num_workers, " is not a shard"));
  }
  return absl::OkStatus();
}

absl::Status EmptyShardError(const DataShard& shard, int64_t n) {
  return absl::InvalidArgumentError(absl::StrCat(
      "data.shard: worker ", shard.worker, "'s shard is empty (", n, " examples, global batch ",
      shard.global_batch, ", ", shard.num_workers,
      " workers): every worker needs at least one example of each global batch"));
}

}  // namespace dataset_internal

using dataset_internal::CheckShard;
using dataset_internal::EmptyShardError;

int ShardOwner(int64_t i, int64_t n, int64_t global_batch, int num_workers) {
  const int64_t b = i / global_batch;
  const int64_t r = i % global_batch;
  const int64_t size = std::min(global_batch, n - b * global_batch);
  const int64_t base = size / num_workers;
  const int64_t extra = size % num_workers;
  // WorkerSlice's cut: `extra` parts of base + 1 first, then parts of base
  // (base > 0 whenever r reaches them).
  if (r < extra * (base + 1)) return static_cast<int>(r / (base + 1));
  return static_cast<int>(extra + (r - extra * (base + 1)) / base);
}

int64_t ShardSize(int64_t n, int64_t global_batch, int num_workers, int worker) {
  if (n <= 0 || global_batch <= 0 || num_workers <= 0) return 0;
  const int64_t full = n / global_batch;
  return full * CutBatch(global_batch, num_workers, worker).len +
         CutBatch(n - full * global_batch, num_workers, worker).len;
}

absl::Status KeepShard(const DataShard& shard, Dataset* dataset) {
  TOWERPS_RETURN_IF_ERROR(CheckShard(shard));
  const int64_t n = dataset->size();
  const int64_t width = dataset->input_dim();
  const int64_t target_width = dataset->targets.rank() == 2 ? dataset->targets.dim(1) : 0;
  int64_t k = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (ShardOwner(i, n, shard.global_batch, shard.num_workers) != shard.worker) continue;
    // Rows move down in place (k <= i), whole rows at a time.
    if (!dataset->pixels.empty()) {
      std::memmove(dataset->pixels.data() + k * width, dataset->pixels.data() + i * width, width);
    } else if (width > 0) {
      std::memmove(dataset->features.data() + k * width, dataset->features.data() + i * width,
                   width * sizeof(float));
    }
    if (!dataset->labels.empty()) dataset->labels[k] = dataset->labels[i];
    if (target_width > 0) {
      std::memmove(dataset->targets.data() + k * target_width,
                   dataset->targets.data() + i * target_width, target_width * sizeof(float));
    }
    ++k;
  }
  if (k == 0) return EmptyShardError(shard, n);
  if (!dataset->pixels.empty()) {
    dataset->pixels.resize(k * width);
    dataset->pixels.shrink_to_fit();
  } else if (width > 0) {
    common::Tensor rows({k, width});
    std::memcpy(rows.data(), dataset->features.data(), k * width * sizeof(float));
    dataset->features = std::move(rows);
  }
  if (!dataset->labels.empty()) {
    dataset->labels.resize(k);
    dataset->labels.shrink_to_fit();
  }
  if (target_width > 0) {
    common::Tensor rows({k, target_width});
    std::memcpy(rows.data(), dataset->targets.data(), k * target_width * sizeof(float));
    dataset->targets = std::move(rows);
  }
  dataset->whole_set_size = n;
  return absl::OkStatus();
}

Dataset MakeOnes(int64_t n, int64_t input_dim, int64_t target_dim) {
  Dataset out;
  out.features = common::Tensor({n, input_dim});
  out.features.Fill(1.0f);
  out.targets = common::Tensor({n, target_dim});
  out.targets.Fill(1.0f);
  return out;
}

int64_t StepsPerEpoch(int64_t n, int64_t global_batch) {
  if (global_batch <= 0 || n <= 0) return 0;
  return (n + global_batch - 1) / global_batch;
}

std::vector<int64_t> EpochPermutation(int64_t n, uint64_t seed, int64_t epoch,
                                      bool shuffle) {
  std::vector<int64_t> perm(std::max<int64_t>(n, 0));
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  if (!shuffle) return perm;
  std::mt19937_64 gen(Mix(Mix(seed) + static_cast<uint64_t>(epoch)));
  // Fisher-Yates; j = floor(word * (i + 1) / 2^64) is uniform enough for any
  // n far below 2^64, and the same everywhere.
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>((static_cast<unsigned __int128>(gen()) *
                                         static_cast<uint64_t>(i + 1)) >>
                                        64);
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

std::vector<int64_t> WorkerSlice(const std::vector<int64_t>& perm,
                                 int64_t global_batch, int64_t step,
                                 int num_workers, int worker) {
  const int64_t n = static_cast<int64_t>(perm.size());
  if (global_batch <= 0 || num_workers <= 0 || step < 0) return {};
  const int64_t begin = std::min(step * global_batch, n);
  const int64_t end = std::min(begin + global_batch, n);
  const Part part = CutBatch(end - begin, num_workers, worker);
  return std::vector<int64_t>(perm.begin() + begin + part.start,
                              perm.begin() + begin + part.start + part.len);
}

std::vector<int64_t> ShardSlice(const std::vector<int64_t>& shard_perm, int64_t n,
                                int64_t global_batch, int64_t step, int num_workers,
                                int worker) {
  if (global_batch <= 0 || num_workers <= 0 || step < 0 || step * global_batch >= n) return {};
  const int64_t size = std::min(global_batch, n - step * global_batch);
  const int64_t len = CutBatch(size, num_workers, worker).len;
  // Every earlier step was a full batch: its part of one, per step.
  const int64_t full = CutBatch(global_batch, num_workers, worker).len;
  const int64_t m = static_cast<int64_t>(shard_perm.size());
  const int64_t begin = std::min(step * full, m);
  const int64_t end = std::min(begin + len, m);
  return std::vector<int64_t>(shard_perm.begin() + begin, shard_perm.begin() + end);
}

common::HugePages PlaceOnHugePages(Dataset* dataset) {
  if (!dataset->pixels.empty()) {
    return common::BackWithHugePages(dataset->pixels.data(), dataset->pixels.size());
  }
  return common::BackWithHugePages(dataset->features.data(),
                                   dataset->features.num_elements() * sizeof(float));
}

void GatherBatch(const Dataset& dataset, const std::vector<int64_t>& indices,
                 Batch* out) {
  const int64_t k = static_cast<int64_t>(indices.size());
  const int64_t width = dataset.input_dim();
  out->features.Resize({k, width});
  if (!dataset.pixels.empty()) {
    // byte * scale, exactly as a float set's loader would have stored it.
    // The rows are scattered over the set (a shuffled epoch): each one's
    // first bytes miss the caches, and the conversion waits on memory. So
    // the rows a few ahead are fetched while this one is converted
    // (gather_batch_benchmark measures it).
    constexpr int64_t kAhead = 4;
    constexpr int64_t kLine = 64;
    const float scale = dataset.pixel_scale;
    const uint8_t* pixels = dataset.pixels.data();
    for (int64_t i = 0; i < std::min(k, kAhead); ++i) {
      for (int64_t b = 0; b < width; b += kLine) __builtin_prefetch(pixels + indices[i] * width + b);
    }
    for (int64_t i = 0; i < k; ++i) {
      if (i + kAhead < k) {
        const uint8_t* next = pixels + indices[i + kAhead] * width;
        for (int64_t b = 0; b < width; b += kLine) __builtin_prefetch(next + b);
      }
      const uint8_t* src = pixels + indices[i] * width;
      float* dst = out->features.data() + i * width;
      for (int64_t j = 0; j < width; ++j) dst[j] = src[j] * scale;
    }
  } else {
    for (int64_t i = 0; i < k; ++i) {
      std::memcpy(out->features.data() + i * width,
                  dataset.features.data() + indices[i] * width,
                  width * sizeof(float));
    }
  }
  out->labels.clear();
  if (!dataset.labels.empty()) {
    out->labels.resize(k);
    for (int64_t i = 0; i < k; ++i) out->labels[i] = dataset.labels[indices[i]];
  }
  if (dataset.targets.num_elements() > 0 && dataset.targets.rank() == 2) {
    const int64_t tw = dataset.targets.dim(1);
    out->targets.Resize({k, tw});
    for (int64_t i = 0; i < k; ++i) {
      std::memcpy(out->targets.data() + i * tw,
                  dataset.targets.data() + indices[i] * tw, tw * sizeof(float));
    }
  } else if (out->targets.num_elements() > 0) {
    out->targets = common::Tensor();
  }
}

}  // namespace towerps::worker
