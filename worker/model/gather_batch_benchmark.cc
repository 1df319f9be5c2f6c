// GatherBatch's speed on Fashion-MNIST's training set (the worker gathers
// every step's batch on its training thread, between the step's compute and
// the next): microseconds per batch at a few batch sizes, rows in a shuffled
// epoch's order, against a plain row-by-row loop with no prefetching (what
// GatherBatch was) in the same run; `wrong` counts values that differ from
// the plain loop's.
//  - warm: batch after batch, the set on 4 KiB pages: the page tables and
//    much of the set stay in the caches between batches.
//  - cold: as in training, where a step's compute fills the caches between
//    two batches: 64 MiB of other memory written before each batch (not
//    timed), the set on 4 KiB pages, then on huge pages (PlaceOnHugePages,
//    what the worker does: fewer TLB misses, and fewer page-table walks to
//    memory).
//
//   bazel run -c opt //worker/model:gather_batch_benchmark [-- /usr/share/datasets/fashion-mnist]
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "worker/model/batch.h"
#include "worker/model/dataset.h"

namespace {

// The reference: each row's bytes times the scale, one row after another.
void PlainGather(const towerps::worker::Dataset& d, const std::vector<int64_t>& indices,
                 std::vector<float>* out) {
  const int64_t width = d.input_dim();
  out->resize(indices.size() * width);
  for (size_t i = 0; i < indices.size(); ++i) {
    const uint8_t* src = d.pixels.data() + indices[i] * width;
    float* dst = out->data() + i * width;
    for (int64_t j = 0; j < width; ++j) dst[j] = src[j] * d.pixel_scale;
  }
}

// Seconds per batch with the caches emptied before each (`evict` written
// through, untimed), over at most 200 batches.
template <typename Fn>
double ColdSecondsPerBatch(int batches, std::vector<char>* evict, const Fn& fn) {
  batches = std::min(batches, 200);
  double seconds = 0;
  for (int b = 0; b < batches; ++b) {
    for (size_t i = 0; i < evict->size(); i += 64) (*evict)[i] += 1;
    const auto start = std::chrono::steady_clock::now();
    fn(b);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return seconds / batches;
}

template <typename Fn>
double SecondsPerBatch(int batches, const Fn& fn) {
  fn(0);  // warm: pages, buffers
  const auto start = std::chrono::steady_clock::now();
  for (int b = 0; b < batches; ++b) fn(b);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
         batches;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
  auto data = towerps::worker::LoadFashionMnist(dir, /*train=*/true, 0);
  if (!data.ok()) {
    std::fprintf(stderr, "gather_batch_benchmark: %s\n", std::string(data.status().message()).c_str());
    return 2;
  }
  const int64_t n = data->size();
  // The same set on 4 KiB pages: its buffer advised MADV_NOHUGEPAGE before
  // its pages are first touched (whatever the system's THP setting).
  towerps::worker::Dataset small = *data;
  small.pixels = std::vector<uint8_t>();
  small.pixels.reserve(data->pixels.size());
  madvise(reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(small.pixels.data()) & ~uintptr_t{4095}),
          data->pixels.size() + 4096, MADV_NOHUGEPAGE);
  small.pixels.assign(data->pixels.begin(), data->pixels.end());
  const towerps::common::HugePages huge = towerps::worker::PlaceOnHugePages(&*data);
  const std::vector<int64_t> perm = towerps::worker::EpochPermutation(n, 1, 0, true);
  std::printf("Fashion-MNIST train: %lld rows of %lld bytes; rows in a shuffled epoch's order\n",
              static_cast<long long>(n), static_cast<long long>(data->input_dim()));
  std::printf("huge pages: %.1f of %.1f MB%s%s\n", huge.bytes / 1e6, data->pixels.size() / 1e6,
              huge.error.empty() ? "" : "; ", huge.error.c_str());
  std::printf("%6s %8s %12s %12s %8s %12s %12s %8s %6s\n", "batch", "batches", "plain_us",
              "gather_us", "speedup", "cold_4k_us", "cold_huge_us", "speedup", "wrong");
  std::vector<char> evict(size_t{64} << 20, 1);
  int64_t wrong_total = 0;
  for (const int64_t batch : {32, 128, 256, 1024}) {
    const int batches = static_cast<int>(n / batch);
    auto slice = [&](int b) {
      return std::vector<int64_t>(perm.begin() + b * batch, perm.begin() + (b + 1) * batch);
    };
    std::vector<std::vector<int64_t>> slices;
    for (int b = 0; b < batches; ++b) slices.push_back(slice(b));
    std::vector<float> plain;
    towerps::worker::Batch out;
    auto gather_small = [&](int b) { towerps::worker::GatherBatch(small, slices[b], &out); };
    auto gather_huge = [&](int b) { towerps::worker::GatherBatch(*data, slices[b], &out); };
    const double plain_s = SecondsPerBatch(batches, [&](int b) { PlainGather(small, slices[b], &plain); });
    const double gather_s = SecondsPerBatch(batches, gather_small);
    const double cold_small_s = ColdSecondsPerBatch(batches, &evict, gather_small);
    const double cold_huge_s = ColdSecondsPerBatch(batches, &evict, gather_huge);
    int64_t wrong = 0;
    for (int b = 0; b < batches; b += 97) {
      PlainGather(small, slices[b], &plain);
      for (const auto* set : {&small, &*data}) {
        towerps::worker::GatherBatch(*set, slices[b], &out);
        for (size_t i = 0; i < plain.size(); ++i) wrong += plain[i] != out.features.data()[i];
      }
    }
    std::printf("%6lld %8d %12.1f %12.1f %8.2f %12.1f %12.1f %8.2f %6lld\n",
                static_cast<long long>(batch), batches, plain_s * 1e6, gather_s * 1e6,
                plain_s / gather_s, cold_small_s * 1e6, cold_huge_s * 1e6,
                cold_small_s / cold_huge_s, static_cast<long long>(wrong));
    wrong_total += wrong;
  }
  return wrong_total == 0 ? 0 : 1;
}
