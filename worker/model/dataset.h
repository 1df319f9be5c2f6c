// In-memory datasets (Fashion-MNIST from IDX files, or synthetic ones) and the
// deterministic batching that data-parallel workers share.
//
// Every worker computes the same epoch permutation from (seed, epoch) and
// takes its own contiguous part of each global batch, so no coordination is
// needed to split the data.
//
// Loading functions are thread-safe (no shared state); a Dataset is a plain
// value, safe to read from many threads once loaded.
#ifndef TOWERPS_WORKER_MODEL_DATASET_H_
#define TOWERPS_WORKER_MODEL_DATASET_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "worker/model/batch.h"

namespace towerps::worker {

struct Dataset {
  // [n, input_dim].
  common::Tensor features;
  // Classification: n labels in [0, num_classes). Empty for regression.
  std::vector<int32_t> labels;
  // Regression: [n, target_dim]. Empty (no elements) for classification.
  common::Tensor targets;
  // 0 for regression.
  int num_classes = 0;

  int64_t size() const { return features.rank() == 0 ? 0 : features.dim(0); }
};

// Reads an IDX images file (magic 0x00000803: count, rows, cols, then bytes)
// and an IDX labels file (magic 0x00000801: count, then bytes), each plain or
// gzip-compressed (detected by the magic bytes 1f 8b). Pixels become
// byte * scale, flattened to [n, rows * cols]; num_classes is 10.
// max_examples > 0 keeps only the first max_examples; 0 keeps all.
//
// Returns NotFound when a file does not exist; InvalidArgument, naming the
// file and the problem, when a magic number is wrong, a dimension is zero, a
// file is truncated or has trailing bytes (or its gzip stream is corrupt), the
// two counts differ, a label is >= 10, or max_examples < 0.
absl::StatusOr<Dataset> LoadIdx(const std::string& images_path,
                                const std::string& labels_path, float scale,
                                int64_t max_examples);

// Loads Fashion-MNIST from `dir`: train-images-idx3-ubyte and
// train-labels-idx1-ubyte (train) or t10k-* (test), each either plain or
// with a .gz suffix (a plain file wins). Pixels are scaled to [0, 1].
// Errors as for LoadIdx; NotFound names both candidate paths.
absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, bool train,
                                         int64_t max_examples);

// The two files LoadFashionMnist reads: {images, labels}, without reading
// them. NotFound names both candidate paths of the first one missing.
absl::StatusOr<std::pair<std::string, std::string>> FindFashionMnistFiles(
    const std::string& dir, bool train);

// n examples whose features [n, input_dim] and targets [n, target_dim] are all
// 1.0; no labels. REQUIRES: all arguments >= 0.
Dataset MakeOnes(int64_t n, int64_t input_dim, int64_t target_dim);

// Global batches per epoch: ceil(n / global_batch); 0 when n == 0.
// REQUIRES: global_batch > 0 (returns 0 otherwise).
int64_t StepsPerEpoch(int64_t n, int64_t global_batch);

// The order of examples in `epoch`: a permutation of [0, n), a function of
// (n, seed, epoch) only, identical on every worker and platform (it uses
// std::mt19937_64 and its own index mapping, not std:: distributions). With
// shuffle == false, the identity.
std::vector<int64_t> EpochPermutation(int64_t n, uint64_t seed, int64_t epoch,
                                      bool shuffle);

// The indices worker `worker` of `num_workers` trains on at `step`. Global
// batch `step` is perm[step * G, min((step + 1) * G, n)); it is cut into
// num_workers contiguous parts whose sizes differ by at most one, the larger
// ones first. A short last batch may leave some workers empty; a step past
// the epoch gives every worker an empty slice.
// REQUIRES: global_batch > 0, step >= 0, 0 <= worker < num_workers.
std::vector<int64_t> WorkerSlice(const std::vector<int64_t>& perm,
                                 int64_t global_batch, int64_t step,
                                 int num_workers, int worker);

// Copies the rows `indices` of `dataset` into `out` (features, and labels or
// targets, whichever the dataset has), reusing out's buffers.
// REQUIRES: every index in [0, dataset.size()).
void GatherBatch(const Dataset& dataset, const std::vector<int64_t>& indices,
                 Batch* out);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_MODEL_DATASET_H_
