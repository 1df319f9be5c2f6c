#include "worker/model/dataset.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tensor.h"
#include "gtest/gtest.h"
#include "worker/model/batch.h"

namespace towerps::worker {
namespace {

constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

std::string Be32(uint32_t v) {
  return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 8), static_cast<char>(v)};
}

std::string ImagesFile(uint32_t magic, uint32_t n, uint32_t rows, uint32_t cols,
                       const std::string& pixels) {
  return Be32(magic) + Be32(n) + Be32(rows) + Be32(cols) + pixels;
}

std::string LabelsFile(uint32_t magic, const std::string& labels) {
  return Be32(magic) + Be32(labels.size()) + labels;
}

std::string TempPath(const std::string& name) {
  return absl::StrCat(testing::TempDir(), "/", name);
}

std::string WritePlain(const std::string& name, const std::string& data) {
  const std::string path = TempPath(name);
  FILE* f = std::fopen(path.c_str(), "wb");
  EXPECT_NE(f, nullptr) << path;
  std::fwrite(data.data(), 1, data.size(), f);
  std::fclose(f);
  return path;
}

std::string WriteGzip(const std::string& name, const std::string& data) {
  const std::string path = TempPath(name);
  gzFile gz = gzopen(path.c_str(), "wb");
  EXPECT_NE(gz, nullptr) << path;
  gzwrite(gz, data.data(), data.size());
  gzclose(gz);
  return path;
}

// 3 images of 2x2: pixel bytes 0..11; labels 7, 0, 9.
const std::string kPixels = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
const std::string kLabels = {7, 0, 9};

TEST(LoadIdxTest, ReadsPlainAndGzipFilesIdentically) {
  const std::string images = ImagesFile(0x803, 3, 2, 2, kPixels);
  const std::string labels = LabelsFile(0x801, kLabels);
  for (bool gz : {false, true}) {
    const std::string ip =
        gz ? WriteGzip("img.gz", images) : WritePlain("img", images);
    const std::string lp =
        gz ? WriteGzip("lbl.gz", labels) : WritePlain("lbl", labels);
    auto ds = LoadIdx(ip, lp, 0.5f, 0);
    ASSERT_TRUE(ds.ok()) << ds.status();
    EXPECT_EQ(ds->size(), 3);
    EXPECT_EQ(ds->features.shape(), (std::vector<int64_t>{3, 4}));
    for (int i = 0; i < 12; ++i) EXPECT_EQ(ds->features[i], 0.5f * i) << i;
    EXPECT_EQ(ds->labels, (std::vector<int32_t>{7, 0, 9}));
    EXPECT_EQ(ds->num_classes, 10);
    EXPECT_EQ(ds->targets.num_elements(), 0);

    auto two = LoadIdx(ip, lp, 1.0f, 2);
    ASSERT_TRUE(two.ok()) << two.status();
    EXPECT_EQ(two->size(), 2);
    EXPECT_EQ(two->labels.size(), 2u);
    EXPECT_EQ(two->features[7], 7.0f);
  }
}

TEST(LoadIdxTest, MissingFileIsNotFound) {
  const std::string lp = WritePlain("lbl_ok", LabelsFile(0x801, kLabels));
  auto ds = LoadIdx(TempPath("does-not-exist"), lp, 1.0f, 0);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(ds.status().message().find("does-not-exist"), std::string::npos)
      << ds.status();
}

TEST(LoadIdxTest, TruncatedFilesAreInvalid) {
  const std::string lp = WritePlain("lbl_t", LabelsFile(0x801, kLabels));
  const std::string full = ImagesFile(0x803, 3, 2, 2, kPixels);
  const std::string ip =
      WritePlain("img_trunc", full.substr(0, full.size() - 1));
  auto ds = LoadIdx(ip, lp, 1.0f, 0);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ds.status().message().find("img_trunc: truncated"),
            std::string::npos)
      << ds.status();

  const std::string header_only = WritePlain("img_hdr", full.substr(0, 10));
  EXPECT_EQ(LoadIdx(header_only, lp, 1.0f, 0).status().code(),
            absl::StatusCode::kInvalidArgument);

  // A gzip stream cut short.
  const std::string gz_path = WriteGzip("img_full.gz", full);
  FILE* f = std::fopen(gz_path.c_str(), "rb");
  std::string bytes(4096, '\0');
  bytes.resize(std::fread(bytes.data(), 1, bytes.size(), f));
  std::fclose(f);
  const std::string cut =
      WritePlain("img_cut.gz", bytes.substr(0, bytes.size() / 2));
  ds = LoadIdx(cut, lp, 1.0f, 0);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ds.status().message().find("img_cut.gz"), std::string::npos)
      << ds.status();

  // Trailing garbage.
  const std::string extra = WritePlain("img_extra", full + "xx");
  ds = LoadIdx(extra, lp, 1.0f, 0);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ds.status().message().find("2 trailing bytes"), std::string::npos)
      << ds.status();
}

TEST(LoadIdxTest, WrongMagicIsInvalid) {
  const std::string ip =
      WritePlain("img_m", ImagesFile(0x803, 3, 2, 2, kPixels));
  const std::string lp = WritePlain("lbl_m", LabelsFile(0x801, kLabels));
  // Labels file passed as images and the other way round.
  auto ds = LoadIdx(lp, ip, 1.0f, 0);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ds.status().message().find("lbl_m: bad magic number 0x00000801, "
                                       "want 0x00000803"),
            std::string::npos)
      << ds.status();
  const std::string bad_labels =
      WritePlain("lbl_m2", LabelsFile(0x802, kLabels));
  ds = LoadIdx(ip, bad_labels, 1.0f, 0);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ds.status().message().find("lbl_m2: bad magic"), std::string::npos)
      << ds.status();
}

TEST(LoadIdxTest, CountMismatchAndBadLabelAreInvalid) {
  const std::string ip =
      WritePlain("img_c", ImagesFile(0x803, 3, 2, 2, kPixels));
  const std::string lp = WritePlain("lbl_c", LabelsFile(0x801, {1, 2}));
  auto ds = LoadIdx(ip, lp, 1.0f, 0);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ds.status().message().find("has 3 images but"), std::string::npos)
      << ds.status();
  EXPECT_NE(ds.status().message().find("has 2 labels"), std::string::npos);

  const std::string bad = WritePlain("lbl_10", LabelsFile(0x801, {1, 10, 2}));
  ds = LoadIdx(ip, bad, 1.0f, 0);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ds.status().message().find("label 10 of example 1"),
            std::string::npos)
      << ds.status();

  const std::string zero_rows =
      WritePlain("img_z", ImagesFile(0x803, 3, 0, 2, ""));
  EXPECT_EQ(LoadIdx(zero_rows, WritePlain("lbl_z", LabelsFile(0x801, kLabels)),
                    1.0f, 0)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadIdx(ip, lp, 1.0f, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FashionMnistTest, LoadsRealTrainAndTestSets) {
  auto train = LoadFashionMnist(kFashionMnistDir, /*train=*/true, 0);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ(train->features.shape(), (std::vector<int64_t>{60000, 784}));
  EXPECT_EQ(train->labels.size(), 60000u);
  EXPECT_EQ(train->num_classes, 10);
  const auto [lo, hi] = std::minmax_element(train->features.span().begin(),
                                            train->features.span().end());
  EXPECT_EQ(*lo, 0.0f);
  EXPECT_FLOAT_EQ(*hi, 1.0f);
  // Fashion-MNIST is balanced: 6000 of each class in the training set.
  std::vector<int> per_class(10, 0);
  for (int32_t l : train->labels) ++per_class[l];
  for (int c = 0; c < 10; ++c) EXPECT_EQ(per_class[c], 6000) << c;

  auto test = LoadFashionMnist(kFashionMnistDir, /*train=*/false, 0);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->size(), 10000);
  EXPECT_EQ(test->features.dim(1), 784);

  auto few = LoadFashionMnist(kFashionMnistDir, /*train=*/false, 100);
  ASSERT_TRUE(few.ok()) << few.status();
  EXPECT_EQ(few->size(), 100);
  EXPECT_EQ(few->labels[0], test->labels[0]);
  EXPECT_EQ(few->features[783], test->features[783]);
}

TEST(FashionMnistTest, MissingDirectoryIsNotFound) {
  auto ds = LoadFashionMnist(TempPath("no-such-dir"), true, 0);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(ds.status().message().find("train-images-idx3-ubyte.gz"),
            std::string::npos)
      << ds.status();
}

TEST(MakeOnesTest, AllOnes) {
  Dataset ds = MakeOnes(5, 3, 2);
  EXPECT_EQ(ds.size(), 5);
  EXPECT_EQ(ds.features.shape(), (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(ds.targets.shape(), (std::vector<int64_t>{5, 2}));
  for (float v : ds.features.span()) EXPECT_EQ(v, 1.0f);
  for (float v : ds.targets.span()) EXPECT_EQ(v, 1.0f);
  EXPECT_TRUE(ds.labels.empty());
  EXPECT_EQ(ds.num_classes, 0);
}

TEST(BatchingTest, StepsPerEpoch) {
  EXPECT_EQ(StepsPerEpoch(60000, 256), 235);
  EXPECT_EQ(StepsPerEpoch(256, 256), 1);
  EXPECT_EQ(StepsPerEpoch(257, 256), 2);
  EXPECT_EQ(StepsPerEpoch(0, 256), 0);
  EXPECT_EQ(StepsPerEpoch(10, 0), 0);
}

TEST(BatchingTest, EpochPermutationIsDeterministicAndVariesByEpoch) {
  const auto a = EpochPermutation(1000, 1, 0, true);
  const auto b = EpochPermutation(1000, 1, 0, true);
  const auto c = EpochPermutation(1000, 1, 1, true);
  const auto d = EpochPermutation(1000, 2, 0, true);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, d);
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(sorted, identity);
  EXPECT_NE(a, identity);
  EXPECT_EQ(EpochPermutation(1000, 1, 3, false), identity);
  EXPECT_TRUE(EpochPermutation(0, 1, 0, true).empty());
}

TEST(BatchingTest, WorkerSlicesPartitionEveryGlobalBatch) {
  for (int64_t n : {0, 1, 7, 100, 101}) {
    const auto perm = EpochPermutation(n, 5, 0, true);
    for (int64_t g : {1, 3, 10, 32}) {
      for (int workers : {1, 2, 3, 4, 5}) {
        const int64_t steps = StepsPerEpoch(n, g);
        std::vector<int64_t> all;
        for (int64_t step = 0; step < steps; ++step) {
          std::vector<int64_t> joined;
          std::vector<size_t> sizes;
          for (int w = 0; w < workers; ++w) {
            const auto slice = WorkerSlice(perm, g, step, workers, w);
            sizes.push_back(slice.size());
            joined.insert(joined.end(), slice.begin(), slice.end());
          }
          const int64_t begin = step * g;
          const int64_t end = std::min(begin + g, n);
          EXPECT_EQ(joined, std::vector<int64_t>(perm.begin() + begin,
                                                 perm.begin() + end))
              << "n=" << n << " g=" << g << " workers=" << workers
              << " step=" << step;
          EXPECT_LE(*std::max_element(sizes.begin(), sizes.end()) -
                        *std::min_element(sizes.begin(), sizes.end()),
                    1u);
          EXPECT_TRUE(std::is_sorted(sizes.rbegin(), sizes.rend()));
          all.insert(all.end(), joined.begin(), joined.end());
        }
        EXPECT_EQ(all, perm);
        EXPECT_TRUE(WorkerSlice(perm, g, steps, workers, 0).empty());
      }
    }
  }
  // 10 examples, batch 4, 3 workers: the last batch [8, 10) gives 1, 1, 0.
  std::vector<int64_t> identity(10);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(WorkerSlice(identity, 4, 0, 3, 0), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(WorkerSlice(identity, 4, 0, 3, 2), (std::vector<int64_t>{3}));
  EXPECT_EQ(WorkerSlice(identity, 4, 2, 3, 1), (std::vector<int64_t>{9}));
  EXPECT_TRUE(WorkerSlice(identity, 4, 2, 3, 2).empty());
}

TEST(BatchingTest, GatherBatchCopiesRowsAndReusesBuffers) {
  Dataset ds;
  ds.features = common::Tensor({4, 2}, {0, 1, 10, 11, 20, 21, 30, 31});
  ds.labels = {5, 6, 7, 8};
  ds.num_classes = 10;
  Batch batch;
  GatherBatch(ds, {3, 1, 2}, &batch);
  EXPECT_EQ(batch.size(), 3);
  EXPECT_EQ(batch.features.shape(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(batch.features[0], 30);
  EXPECT_EQ(batch.features[1], 31);
  EXPECT_EQ(batch.features[2], 10);
  EXPECT_EQ(batch.features[5], 21);
  EXPECT_EQ(batch.labels, (std::vector<int32_t>{8, 6, 7}));
  EXPECT_EQ(batch.targets.num_elements(), 0);
  const float* buffer = batch.features.data();
  GatherBatch(ds, {0, 0}, &batch);
  EXPECT_EQ(batch.features.data(), buffer);
  EXPECT_EQ(batch.size(), 2);
  EXPECT_EQ(batch.features[3], 1);
  EXPECT_EQ(batch.labels, (std::vector<int32_t>{5, 5}));

  Dataset ones = MakeOnes(3, 2, 4);
  ones.targets[4] = 7;  // Row 1, column 0.
  GatherBatch(ones, {1}, &batch);
  EXPECT_TRUE(batch.labels.empty());
  EXPECT_EQ(batch.targets.shape(), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(batch.targets[0], 7);
  EXPECT_EQ(batch.targets[1], 1);
}

}  // namespace
}  // namespace towerps::worker
