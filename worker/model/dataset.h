// In-memory datasets (Fashion-MNIST from IDX files, CIFAR-10 from its binary
// batch files, or synthetic ones) and the
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
#include "common/process_memory.h"
#include "common/tensor.h"
#include "worker/model/batch.h"

namespace towerps::worker {

// The layout of one example's features when they are an image: a feature
// row holds channels * height * width values, channel-major (CHW: all of
// channel 0 row by row, then channel 1, ...). All zero when the features are
// not an image (synthetic sets).
struct ImageShape {
  int64_t channels = 0;
  int64_t height = 0;
  int64_t width = 0;

  bool is_image() const { return channels > 0 && height > 0 && width > 0; }
  int64_t num_elements() const { return channels * height * width; }
  bool operator==(const ImageShape& o) const {
    return channels == o.channels && height == o.height && width == o.width;
  }
};

struct Dataset {
  // The features, one row of input_dim() values per example, kept one of
  // two ways:
  //  - `features` [n, input_dim] in float32 (synthetic and regression sets);
  //  - `pixels`: n * input_dim bytes, row after row, whose values are
  //    byte * pixel_scale (the image sets read from files). A quarter of the
  //    memory of floats (Fashion-MNIST's training set: 47 MB, not 188 MB),
  //    the same values: GatherBatch makes them floats a batch at a time.
  // Exactly one of them is non-empty in a loaded set.
  common::Tensor features;
  std::vector<uint8_t> pixels;
  float pixel_scale = 0;
  // What a feature row is: 1x28x28 for Fashion-MNIST, 3x32x32 for CIFAR-10,
  // not an image (all zero) for ONES. When is_image(), its num_elements()
  // is input_dim.
  ImageShape image;
  // Classification: n labels in [0, num_classes). Empty for regression.
  std::vector<int32_t> labels;
  // Regression: [n, target_dim]. Empty (no elements) for classification.
  common::Tensor targets;
  // 0 for regression.
  int num_classes = 0;
  // When this is one worker's shard of a set (DataSpec.shard), the size of
  // the whole set, which the steps per epoch count; 0 when it is the whole.
  int64_t whole_set_size = 0;

  // Values per example (0 for an empty set).
  int64_t input_dim() const {
    if (!pixels.empty()) return image.num_elements();
    return features.rank() == 2 ? features.dim(1) : 0;
  }
  // Examples.
  int64_t size() const {
    if (!pixels.empty()) return static_cast<int64_t>(pixels.size()) / image.num_elements();
    return features.rank() == 0 ? 0 : features.dim(0);
  }
  // Examples in the whole set this one is a shard of (or is).
  int64_t whole_size() const { return whole_set_size > 0 ? whole_set_size : size(); }
  // Feature `i` of the whole set in row-major order (row * input_dim() +
  // column), as a float, however it is kept. REQUIRES: i < size() * input_dim().
  float FeatureAt(int64_t i) const {
    return pixels.empty() ? features[i] : pixels[i] * pixel_scale;
  }
};

// One worker's share of a sharded training set (DataSpec.shard): worker
// `worker` of `num_workers` keeps only the examples that its part of each
// global batch would hold if the set were never shuffled, i.e. example i
// belongs to the worker whose WorkerSlice of global batch i / global_batch
// (in file order) holds it. Each worker then shuffles its own shard every
// epoch and takes its part of every global batch from it (ShardSlice), so
// each step has the same per-worker batch sizes as without shards. With one
// worker the shard is the whole set and training is exactly as without.
struct DataShard {
  int64_t global_batch = 0;  // > 0
  int num_workers = 1;       // > 0
  int worker = 0;            // in [0, num_workers)
};

// The worker that holds example i of a set of n under `shard`'s batch size
// and worker count. REQUIRES: 0 <= i < n, global_batch > 0, num_workers > 0.
int ShardOwner(int64_t i, int64_t n, int64_t global_batch, int num_workers);

// Examples of a set of n in the shard of `worker` (ShardOwner's count).
int64_t ShardSize(int64_t n, int64_t global_batch, int num_workers, int worker);

// Keeps only the rows of `dataset` that `shard` owns (in their order),
// freeing the rest, and sets whole_set_size. InvalidArgument, naming the
// worker and the sizes, when the shard would be empty (fewer examples per
// batch than workers).
absl::Status KeepShard(const DataShard& shard, Dataset* dataset);

// Reads an IDX images file (magic 0x00000803: count, rows, cols, then bytes)
// and an IDX labels file (magic 0x00000801: count, then bytes), each plain or
// gzip-compressed (detected by the magic bytes 1f 8b). Pixels are kept as
// bytes (`pixels`, row after row) whose values are byte * scale
// (`pixel_scale`), input_dim rows * cols; image is 1 x rows x cols;
// num_classes is 10.
// max_examples > 0 keeps only the first max_examples; 0 keeps all.
//
// Returns NotFound when a file does not exist; InvalidArgument, naming the
// file and the problem, when a magic number is wrong, a dimension is zero, a
// file is truncated or has trailing bytes (or its gzip stream is corrupt), the
// two counts differ, a label is >= 10, or max_examples < 0.
// With `shard`, only that shard's rows of the first max_examples are kept,
// streamed from the file (the whole set is never in memory at once); every
// check above is still made on the whole file.
absl::StatusOr<Dataset> LoadIdx(const std::string& images_path,
                                const std::string& labels_path, float scale,
                                int64_t max_examples, const DataShard* shard = nullptr);

// Loads Fashion-MNIST from `dir`: train-images-idx3-ubyte and
// train-labels-idx1-ubyte (train) or t10k-* (test), each either plain or
// with a .gz suffix (a plain file wins). Pixels are scaled to [0, 1].
// Errors as for LoadIdx; NotFound names both candidate paths.
absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, bool train,
                                         int64_t max_examples,
                                         const DataShard* shard = nullptr);

// The two files LoadFashionMnist reads: {images, labels}, without reading
// them. NotFound names both candidate paths of the first one missing.
absl::StatusOr<std::pair<std::string, std::string>> FindFashionMnistFiles(
    const std::string& dir, bool train);

// CIFAR-10, binary version (the cifar-10-batches-bin folder of
// cifar-10-binary.tar.gz): the training set is data_batch_1.bin ..
// data_batch_5.bin in `dir`, read in that order; the test set is
// test_batch.bin. Each file is a sequence of 3073-byte records: one label
// byte (0..9), then 3072 pixel bytes, 1024 red, 1024 green, 1024 blue, each
// 32x32 row-major (10000 records per file in the real set; any positive
// count is accepted). Pixels are kept as bytes scaled to [0, 1] (pixel_scale
// 1.0f / 255, as for Fashion-MNIST) in file order, which is channel-major:
// input_dim 3072, image 3x32x32, num_classes 10.
// All five training files must exist: a missing one would silently shrink
// the set. max_examples > 0 keeps only the first max_examples (in file
// order); 0 keeps all. Every file is checked in full either way.
//
// Returns NotFound, naming the path, when a file (or `dir`) does not exist;
// InvalidArgument, naming the file, when a file is empty, is not a whole
// number of records (naming the incomplete record and the byte where it
// starts), or holds a label > 9 (naming the record and its byte offset), or
// when max_examples < 0; DataLoss when a file cannot be read.
// With `shard`, the set is read and checked whole, then cut to the shard
// (KeepShard).
absl::StatusOr<Dataset> LoadCifar10(const std::string& dir, bool train,
                                    int64_t max_examples, const DataShard* shard = nullptr);

// The files LoadCifar10 reads, in order, without reading them: the five
// data_batch_*.bin (train) or test_batch.bin (test). NotFound names the first
// missing path and the files expected.
absl::StatusOr<std::vector<std::string>> FindCifar10Files(
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

// The positions in `shard_perm` (a permutation of a shard, of the whole set
// of n examples) that worker `worker` trains on at `step`: as many as its
// WorkerSlice of that global batch would hold, taken in order from the
// shard, its part of a full batch per step. Empty past the epoch.
// REQUIRES: as WorkerSlice.
std::vector<int64_t> ShardSlice(const std::vector<int64_t>& shard_perm, int64_t n,
                                int64_t global_batch, int64_t step, int num_workers,
                                int worker);

// Puts the set's features (pixels or floats) on transparent huge pages
// (common::BackWithHugePages): a shuffled epoch reads its rows at random,
// and on 4 KiB pages nearly every row of a batch costs a TLB miss and a walk
// of page tables the compute has pushed out of the caches meanwhile. The
// values do not change.
common::HugePages PlaceOnHugePages(Dataset* dataset);

// Copies the rows `indices` of `dataset` into `out` (features, and labels or
// targets, whichever the dataset has), reusing out's buffers.
// REQUIRES: every index in [0, dataset.size()).
void GatherBatch(const Dataset& dataset, const std::vector<int64_t>& indices,
                 Batch* out);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_MODEL_DATASET_H_
