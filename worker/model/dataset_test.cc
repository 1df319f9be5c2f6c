#include "worker/model/dataset.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/process_memory.h"
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
    EXPECT_EQ(ds->input_dim(), 4);
    EXPECT_EQ(ds->features.num_elements(), 0);  // kept as bytes
    EXPECT_EQ(ds->pixels.size(), 12u);
    for (int i = 0; i < 12; ++i) EXPECT_EQ(ds->FeatureAt(i), 0.5f * i) << i;
    EXPECT_EQ(ds->labels, (std::vector<int32_t>{7, 0, 9}));
    EXPECT_EQ(ds->num_classes, 10);
    EXPECT_EQ(ds->targets.num_elements(), 0);
    EXPECT_TRUE(ds->image == (ImageShape{1, 2, 2}));

    auto two = LoadIdx(ip, lp, 1.0f, 2);
    ASSERT_TRUE(two.ok()) << two.status();
    EXPECT_EQ(two->size(), 2);
    EXPECT_EQ(two->labels.size(), 2u);
    EXPECT_EQ(two->FeatureAt(7), 7.0f);
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

  // A forged length trailer (ISIZE, which sizes the read buffer): refused by
  // the stream's own check, after reading only what the file holds.
  std::string forged = bytes;
  for (int i = 1; i <= 4; ++i) forged[forged.size() - i] = '\xff';
  ds = LoadIdx(WritePlain("img_forged.gz", forged), lp, 1.0f, 0);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ds.status().message().find("img_forged.gz: corrupt or truncated gzip stream"),
            std::string::npos)
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
  EXPECT_EQ(train->size(), 60000);
  EXPECT_EQ(train->input_dim(), 784);
  EXPECT_EQ(train->labels.size(), 60000u);
  EXPECT_EQ(train->num_classes, 10);
  EXPECT_TRUE(train->image == (ImageShape{1, 28, 28}));
  EXPECT_EQ(train->image.num_elements(), 784);
  const auto [lo, hi] = std::minmax_element(train->pixels.begin(), train->pixels.end());
  EXPECT_EQ(*lo * train->pixel_scale, 0.0f);
  EXPECT_FLOAT_EQ(*hi * train->pixel_scale, 1.0f);
  // Fashion-MNIST is balanced: 6000 of each class in the training set.
  std::vector<int> per_class(10, 0);
  for (int32_t l : train->labels) ++per_class[l];
  for (int c = 0; c < 10; ++c) EXPECT_EQ(per_class[c], 6000) << c;

  auto test = LoadFashionMnist(kFashionMnistDir, /*train=*/false, 0);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->size(), 10000);
  EXPECT_EQ(test->input_dim(), 784);

  auto few = LoadFashionMnist(kFashionMnistDir, /*train=*/false, 100);
  ASSERT_TRUE(few.ok()) << few.status();
  EXPECT_EQ(few->size(), 100);
  EXPECT_EQ(few->labels[0], test->labels[0]);
  EXPECT_EQ(few->FeatureAt(783), test->FeatureAt(783));
}

// The real train set on huge pages (what a worker does) gives the same
// batches as before, byte for byte; where the kernel collapsed anything it
// is whole huge pages inside the set, and otherwise says why not. A float
// set (MakeOnes) likewise.
TEST(FashionMnistTest, HugePagesKeepEveryBatch) {
  auto train = LoadFashionMnist(kFashionMnistDir, /*train=*/true, 0);
  ASSERT_TRUE(train.ok()) << train.status();
  const std::vector<int64_t> perm = EpochPermutation(train->size(), 7, 0, true);
  std::vector<Batch> before(3);
  for (int b = 0; b < 3; ++b) {
    GatherBatch(*train, std::vector<int64_t>(perm.begin() + b * 500, perm.begin() + (b + 1) * 500),
                &before[b]);
  }
  const std::vector<uint8_t> bytes = train->pixels;
  const common::HugePages huge = PlaceOnHugePages(&*train);
  EXPECT_TRUE(train->pixels == bytes);
  if (huge.page > 0) {
    EXPECT_EQ(huge.bytes % huge.page, 0);
    EXPECT_LE(huge.bytes, static_cast<int64_t>(bytes.size()));
    if (huge.bytes < static_cast<int64_t>(bytes.size()) - 2 * huge.page) {
      EXPECT_FALSE(huge.error.empty()) << huge.bytes << " of " << bytes.size();
    }
  }
  for (int b = 0; b < 3; ++b) {
    Batch after;
    GatherBatch(*train, std::vector<int64_t>(perm.begin() + b * 500, perm.begin() + (b + 1) * 500),
                &after);
    ASSERT_EQ(after.features.num_elements(), before[b].features.num_elements());
    EXPECT_EQ(std::memcmp(after.features.data(), before[b].features.data(),
                          after.features.num_elements() * sizeof(float)),
              0)
        << "batch " << b;
    EXPECT_EQ(after.labels, before[b].labels);
  }

  Dataset ones = MakeOnes(4096, 1000, 1);
  const common::HugePages ones_huge = PlaceOnHugePages(&ones);
  EXPECT_LE(ones_huge.bytes, ones.features.num_elements() * int64_t{sizeof(float)});
  const float* v = ones.features.data();
  EXPECT_TRUE(std::all_of(v, v + ones.features.num_elements(), [](float x) { return x == 1.0f; }));
}

TEST(FashionMnistTest, MissingDirectoryIsNotFound) {
  auto ds = LoadFashionMnist(TempPath("no-such-dir"), true, 0);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(ds.status().message().find("train-images-idx3-ubyte.gz"),
            std::string::npos)
      << ds.status();
}

// ----- CIFAR-10 ------------------------------------------------------------

constexpr int64_t kCifarRecord = 3073;
// Pixel byte b becomes b * (1.0f / 255) as in LoadFashionMnist (which differs
// from b / 255.0f in the last bit for some b).
constexpr float kByteScale = 1.0f / 255.0f;

// The pixel byte at position p (0..3071, file order) of record r of batch
// file f: distinct enough that a misplaced plane or record shows.
unsigned char CifarPixel(int f, int64_t r, int64_t p) {
  return static_cast<unsigned char>((f * 7 + r * 13 + p * 5 + p / 1024) % 256);
}
int CifarLabel(int f, int64_t r) { return static_cast<int>((f * 3 + r) % 10); }

std::string CifarBatch(int f, int64_t records) {
  std::string out;
  for (int64_t r = 0; r < records; ++r) {
    out.push_back(static_cast<char>(CifarLabel(f, r)));
    for (int64_t p = 0; p < 3072; ++p) {
      out.push_back(static_cast<char>(CifarPixel(f, r, p)));
    }
  }
  return out;
}

// A fresh directory `name` holding data_batch_1..5.bin (file f = 0..4) and
// test_batch.bin (f = 5), `records` records each.
std::string WriteCifarDir(const std::string& name, int64_t records) {
  const std::string dir = TempPath(name);
  ::mkdir(dir.c_str(), 0755);
  for (int f = 0; f < 5; ++f) {
    WritePlain(absl::StrCat(name, "/data_batch_", f + 1, ".bin"),
               CifarBatch(f, records));
  }
  WritePlain(name + "/test_batch.bin", CifarBatch(5, records));
  return dir;
}

TEST(Cifar10Test, ReadsValuesLabelsAndChannelMajorOrder) {
  const std::string dir = WriteCifarDir("cifar_ok", 3);
  auto train = LoadCifar10(dir, /*train=*/true, 0);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ(train->size(), 15);
  EXPECT_EQ(train->input_dim(), 3072);
  EXPECT_TRUE(train->image == (ImageShape{3, 32, 32}));
  EXPECT_EQ(train->image.num_elements(), 3072);
  EXPECT_EQ(train->num_classes, 10);
  EXPECT_EQ(train->targets.num_elements(), 0);
  ASSERT_EQ(train->labels.size(), 15u);
  // The files in order data_batch_1 .. 5, records in file order; every value
  // exactly byte * kByteScale (the Fashion-MNIST convention).
  int wrong = 0;
  for (int f = 0; f < 5; ++f) {
    for (int64_t r = 0; r < 3; ++r) {
      const int64_t row = f * 3 + r;
      EXPECT_EQ(train->labels[row], CifarLabel(f, r)) << row;
      for (int64_t p = 0; p < 3072; ++p) {
        if (train->FeatureAt(row * 3072 + p) != CifarPixel(f, r, p) * kByteScale) {
          ++wrong;
        }
      }
    }
  }
  EXPECT_EQ(wrong, 0);
  // Channel-major: [c][y][x] is file byte 1 + c*1024 + y*32 + x of the record.
  const int64_t row = 4;  // data_batch_2.bin, record 1.
  for (int c : {0, 1, 2}) {
    const int64_t y = 5, x = 17;
    EXPECT_EQ(train->FeatureAt(row * 3072 + c * 1024 + y * 32 + x),
              CifarPixel(1, 1, c * 1024 + y * 32 + x) * kByteScale)
        << c;
  }
  EXPECT_EQ(train->FeatureAt(0), 0.0f);  // Byte 0.

  auto test = LoadCifar10(dir, /*train=*/false, 0);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->size(), 3);
  EXPECT_EQ(test->labels[2], CifarLabel(5, 2));
  EXPECT_EQ(test->FeatureAt(2 * 3072 + 3071), CifarPixel(5, 2, 3071) * kByteScale);
}

TEST(Cifar10Test, ExtremeBytesScaleToZeroAndOne) {
  const std::string dir = TempPath("cifar_extremes");
  ::mkdir(dir.c_str(), 0755);
  std::string record(kCifarRecord, '\0');
  record[0] = 9;
  record[1] = static_cast<char>(255);
  record[3072] = static_cast<char>(128);
  WritePlain("cifar_extremes/test_batch.bin", record);
  auto ds = LoadCifar10(dir, /*train=*/false, 0);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->labels, (std::vector<int32_t>{9}));
  EXPECT_EQ(ds->FeatureAt(0), 1.0f);
  EXPECT_EQ(ds->FeatureAt(1), 0.0f);
  EXPECT_EQ(ds->FeatureAt(3071), 128 * kByteScale);
}

TEST(Cifar10Test, MaxExamplesKeepsTheFirstInFileOrder) {
  const std::string dir = WriteCifarDir("cifar_max", 3);
  auto few = LoadCifar10(dir, /*train=*/true, 4);  // Crosses into file 2.
  ASSERT_TRUE(few.ok()) << few.status();
  EXPECT_EQ(few->size(), 4);
  EXPECT_EQ(few->input_dim(), 3072);
  EXPECT_EQ(few->labels, (std::vector<int32_t>{CifarLabel(0, 0), CifarLabel(0, 1),
                                               CifarLabel(0, 2), CifarLabel(1, 0)}));
  EXPECT_EQ(few->FeatureAt(3 * 3072 + 10), CifarPixel(1, 0, 10) * kByteScale);
  auto more = LoadCifar10(dir, /*train=*/true, 1000);  // More than there are.
  ASSERT_TRUE(more.ok()) << more.status();
  EXPECT_EQ(more->size(), 15);
  EXPECT_EQ(LoadCifar10(dir, true, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Cifar10Test, TruncatedFileNamesFileAndByte) {
  const std::string dir = WriteCifarDir("cifar_trunc", 10);
  const std::string full = CifarBatch(1, 10);
  WritePlain("cifar_trunc/data_batch_2.bin", full.substr(0, full.size() - 1));
  auto ds = LoadCifar10(dir, /*train=*/true, 0);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ds.status().message().find(
                dir + "/data_batch_2.bin: 30729 bytes is not a whole number "
                      "of 3073-byte records (truncated at byte 27657?"),
            std::string::npos)
      << ds.status();
  EXPECT_NE(ds.status().message().find("record 9"), std::string::npos)
      << ds.status();
  // max_examples does not hide a bad file further on.
  EXPECT_EQ(LoadCifar10(dir, true, 1).status().code(),
            absl::StatusCode::kInvalidArgument);

  WritePlain("cifar_trunc/test_batch.bin", "");
  auto empty = LoadCifar10(dir, /*train=*/false, 0);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(empty.status().message().find(dir + "/test_batch.bin: empty"),
            std::string::npos)
      << empty.status();
}

TEST(Cifar10Test, BadLabelNamesRecordAndByte) {
  const std::string dir = WriteCifarDir("cifar_label", 20);
  std::string data = CifarBatch(5, 20);
  data[17 * kCifarRecord] = 12;
  WritePlain("cifar_label/test_batch.bin", data);
  auto ds = LoadCifar10(dir, /*train=*/false, 0);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ds.status().message().find(
                dir + "/test_batch.bin: record 17 (byte 52241): label 12 is "
                      "not in 0..9"),
            std::string::npos)
      << ds.status();
}

TEST(Cifar10Test, MissingFileOrDirectoryIsNotFound) {
  const std::string dir = WriteCifarDir("cifar_missing", 1);
  ASSERT_EQ(std::remove((dir + "/data_batch_3.bin").c_str()), 0);
  auto ds = LoadCifar10(dir, /*train=*/true, 0);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(ds.status().message().find(dir + "/data_batch_3.bin does not exist"),
            std::string::npos)
      << ds.status();
  EXPECT_NE(ds.status().message().find("CIFAR-10 binary"), std::string::npos)
      << ds.status();
  // The test set is still there.
  EXPECT_TRUE(LoadCifar10(dir, /*train=*/false, 0).ok());

  const std::string empty_dir = TempPath("cifar_empty_dir");
  ::mkdir(empty_dir.c_str(), 0755);
  auto none = LoadCifar10(empty_dir, /*train=*/false, 0);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find(empty_dir + "/test_batch.bin"),
            std::string::npos)
      << none.status();

  auto no_dir = FindCifar10Files(TempPath("no-such-cifar"), /*train=*/true);
  EXPECT_EQ(no_dir.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(no_dir.status().message().find("data_batch_1.bin"), std::string::npos)
      << no_dir.status();

  auto files = FindCifar10Files(WriteCifarDir("cifar_find", 1), true);
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->size(), 5u);
  EXPECT_EQ(files->back(), TempPath("cifar_find") + "/data_batch_5.bin");
}

TEST(MakeOnesTest, AllOnes) {
  Dataset ds = MakeOnes(5, 3, 2);
  EXPECT_FALSE(ds.image.is_image());
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

// An image set kept as bytes gives the same floats a float set holding
// byte * scale would: every byte value, at Fashion-MNIST's scale.
TEST(BatchingTest, GatherBatchOfBytesGivesByteTimesScale) {
  Dataset ds;
  ds.image = ImageShape{1, 16, 16};
  ds.pixel_scale = 1.0f / 255.0f;
  for (int b = 0; b < 256; ++b) ds.pixels.push_back(static_cast<uint8_t>(b));  // row 0
  for (int b = 255; b >= 0; --b) ds.pixels.push_back(static_cast<uint8_t>(b));  // row 1
  ds.labels = {3, 4};
  ds.num_classes = 10;
  EXPECT_EQ(ds.size(), 2);
  EXPECT_EQ(ds.input_dim(), 256);
  Batch batch;
  GatherBatch(ds, {1, 0, 1}, &batch);
  EXPECT_EQ(batch.features.shape(), (std::vector<int64_t>{3, 256}));
  for (int b = 0; b < 256; ++b) {
    const float want = static_cast<float>(b) * (1.0f / 255.0f);
    EXPECT_EQ(batch.features[256 + b], want) << b;        // row 0
    EXPECT_EQ(batch.features[255 - b], want) << b;        // row 1
    EXPECT_EQ(batch.features[2 * 256 + 255 - b], want) << b;
    EXPECT_EQ(ds.FeatureAt(b), want) << b;
  }
  EXPECT_EQ(batch.labels, (std::vector<int32_t>{4, 3, 4}));
}

// Batches longer than the rows GatherBatch fetches ahead, rows whose width
// is no multiple of a cache line, rows repeated and out of order: every
// value is its byte times the scale.
TEST(BatchingTest, GatherBatchOfManyScatteredByteRows) {
  Dataset ds;
  ds.image = ImageShape{1, 10, 10};
  ds.pixel_scale = 1.0f / 255.0f;
  const int rows = 37;
  for (int r = 0; r < rows; ++r) {
    for (int b = 0; b < 100; ++b) ds.pixels.push_back(static_cast<uint8_t>((r * 31 + b * 7) % 256));
  }
  ds.labels.assign(rows, 0);
  std::vector<int64_t> indices;
  for (int i = 0; i < 29; ++i) indices.push_back((i * 17 + 5) % rows);
  indices.push_back(indices.front());
  for (size_t n : {size_t{1}, size_t{4}, size_t{5}, indices.size()}) {
    const std::vector<int64_t> some(indices.begin(), indices.begin() + n);
    Batch batch;
    GatherBatch(ds, some, &batch);
    ASSERT_EQ(batch.features.shape(), (std::vector<int64_t>{static_cast<int64_t>(n), 100}));
    for (size_t i = 0; i < n; ++i) {
      for (int b = 0; b < 100; ++b) {
        const float want = static_cast<float>((some[i] * 31 + b * 7) % 256) * (1.0f / 255.0f);
        ASSERT_EQ(batch.features[i * 100 + b], want) << "batch of " << n << ", row " << i;
      }
    }
  }
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

// Shards (DataSpec.shard) over many shapes: worker w's shard is exactly what
// its WorkerSlices hold when the set is not shuffled; each epoch its
// ShardSlices take every example of the shard once, with the per-step sizes
// of WorkerSlice; one worker's shard is the whole set.
TEST(ShardTest, ShardsFollowTheWorkerSlicesOfTheUnshuffledSet) {
  for (int64_t n : {1, 2, 5, 9, 10, 11, 37, 64}) {
    for (int64_t g : {1, 2, 3, 4, 7, 10}) {
      for (int workers : {1, 2, 3, 5}) {
        std::vector<int64_t> identity(n);
        std::iota(identity.begin(), identity.end(), 0);
        const int64_t steps = StepsPerEpoch(n, g);
        std::vector<int64_t> owned(workers, 0);
        for (int64_t step = 0; step < steps; ++step) {
          for (int w = 0; w < workers; ++w) {
            for (int64_t i : WorkerSlice(identity, g, step, workers, w)) {
              ASSERT_EQ(ShardOwner(i, n, g, workers), w)
                  << "n=" << n << " g=" << g << " workers=" << workers << " i=" << i;
              ++owned[w];
            }
          }
        }
        for (int w = 0; w < workers; ++w) {
          const int64_t size = ShardSize(n, g, workers, w);
          ASSERT_EQ(size, owned[w]) << "n=" << n << " g=" << g << " workers=" << workers;
          for (int64_t epoch : {0, 1}) {
            const auto perm = EpochPermutation(size, 3 + w, epoch, true);
            std::vector<int64_t> seen;
            for (int64_t step = 0; step < steps; ++step) {
              const auto slice = ShardSlice(perm, n, g, step, workers, w);
              ASSERT_EQ(slice.size(), WorkerSlice(identity, g, step, workers, w).size())
                  << "n=" << n << " g=" << g << " workers=" << workers << " step=" << step;
              seen.insert(seen.end(), slice.begin(), slice.end());
            }
            EXPECT_TRUE(ShardSlice(perm, n, g, steps, workers, w).empty());
            std::sort(seen.begin(), seen.end());
            std::vector<int64_t> all(size);
            std::iota(all.begin(), all.end(), 0);
            ASSERT_EQ(seen, all) << "n=" << n << " g=" << g << " workers=" << workers
                                 << " worker=" << w;
          }
        }
        if (workers == 1) {
          const auto perm = EpochPermutation(n, 5, 1, true);
          for (int64_t step = 0; step < steps; ++step) {
            EXPECT_EQ(ShardSlice(perm, n, g, step, 1, 0), WorkerSlice(perm, g, step, 1, 0));
          }
        }
      }
    }
  }
}

TEST(ShardTest, KeepShardKeepsTheOwnedRowsInOrderAndFreesTheRest) {
  // 7 rows of 2 floats (row i: 10i, 10i + 1), labels i; global batch 3, 2
  // workers: batches {0,1,2} {3,4,5} {6} cut 2+1, 2+1, 1+0.
  Dataset ds;
  ds.features = common::Tensor({7, 2});
  for (int i = 0; i < 14; ++i) ds.features[i] = 10 * (i / 2) + i % 2;
  for (int i = 0; i < 7; ++i) ds.labels.push_back(i);
  ds.num_classes = 10;
  Dataset w0 = ds, w1 = ds;
  ASSERT_TRUE(KeepShard({3, 2, 0}, &w0).ok());
  ASSERT_TRUE(KeepShard({3, 2, 1}, &w1).ok());
  EXPECT_EQ(w0.labels, (std::vector<int32_t>{0, 1, 3, 4, 6}));
  EXPECT_EQ(w1.labels, (std::vector<int32_t>{2, 5}));
  EXPECT_EQ(w0.size(), 5);
  EXPECT_EQ(w1.size(), 2);
  EXPECT_EQ(w0.whole_size(), 7);
  EXPECT_EQ(w1.whole_size(), 7);
  EXPECT_EQ(w1.features.shape(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(w1.features[0], 20);
  EXPECT_EQ(w1.features[3], 51);
  EXPECT_EQ(w0.features[9], 61);

  Dataset ones = MakeOnes(4, 2, 3);
  for (int i = 0; i < 12; ++i) ones.targets[i] = i;
  ASSERT_TRUE(KeepShard({2, 2, 1}, &ones).ok());  // rows 1 and 3
  EXPECT_EQ(ones.targets.shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ones.targets[0], 3);
  EXPECT_EQ(ones.targets[5], 11);

  // Fewer examples per batch than workers: worker 2 would get nothing.
  Dataset tiny = MakeOnes(4, 2, 1);
  const absl::Status st = KeepShard({2, 3, 2}, &tiny);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("worker 2's shard is empty"), std::string::npos) << st;
  EXPECT_EQ(KeepShard({0, 2, 0}, &tiny).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KeepShard({2, 2, 2}, &tiny).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShardTest, LoadIdxStreamsOnlyTheShardAndStillChecksTheWholeFile) {
  // 9 images of 2x3, pixel bytes distinct; labels i % 10.
  std::string pixels, labels;
  for (int i = 0; i < 9 * 6; ++i) pixels.push_back(static_cast<char>(i));
  for (int i = 0; i < 9; ++i) labels.push_back(static_cast<char>(i % 10));
  const std::string images = ImagesFile(0x803, 9, 2, 3, pixels);
  for (bool gz : {false, true}) {
    const std::string ip = gz ? WriteGzip("s_img.gz", images) : WritePlain("s_img", images);
    const std::string lp = gz ? WriteGzip("s_lbl.gz", LabelsFile(0x801, labels))
                              : WritePlain("s_lbl", LabelsFile(0x801, labels));
    auto whole = LoadIdx(ip, lp, 0.5f, 0);
    ASSERT_TRUE(whole.ok()) << whole.status();
    for (int64_t max : {0, 8}) {
      const int64_t n = max > 0 ? max : 9;
      for (int w = 0; w < 3; ++w) {
        const DataShard shard{4, 3, w};
        auto ds = LoadIdx(ip, lp, 0.5f, max, &shard);
        ASSERT_TRUE(ds.ok()) << ds.status();
        Dataset want = *whole;
        want.pixels.resize(n * 6);
        want.labels.resize(n);
        ASSERT_TRUE(KeepShard(shard, &want).ok());
        EXPECT_EQ(ds->size(), ShardSize(n, 4, 3, w));
        EXPECT_EQ(ds->whole_size(), n);
        EXPECT_EQ(ds->pixels, want.pixels) << "gz=" << gz << " max=" << max << " w=" << w;
        EXPECT_EQ(ds->labels, want.labels);
        EXPECT_EQ(ds->pixel_scale, 0.5f);
        EXPECT_TRUE(ds->image == (ImageShape{1, 2, 3}));
      }
    }
  }
  const DataShard shard{4, 3, 1};
  const std::string lp = WritePlain("s_lbl2", LabelsFile(0x801, labels));
  auto ds = LoadIdx(WritePlain("s_trunc", images.substr(0, images.size() - 1)), lp, 1, 0, &shard);
  EXPECT_NE(ds.status().message().find("s_trunc: truncated: 69 bytes, the header promises 70"),
            std::string::npos)
      << ds.status();
  ds = LoadIdx(WritePlain("s_extra", images + "xyz"), lp, 1, 0, &shard);
  EXPECT_NE(ds.status().message().find("3 trailing bytes"), std::string::npos) << ds.status();
  ds = LoadIdx(lp, lp, 1, 0, &shard);
  EXPECT_NE(ds.status().message().find("bad magic number 0x00000801"), std::string::npos)
      << ds.status();
  ds = LoadIdx(WritePlain("s_short", images.substr(0, 10)), lp, 1, 0, &shard);
  EXPECT_NE(ds.status().message().find("shorter than the 16-byte IDX header"), std::string::npos)
      << ds.status();
  std::string bad = labels;
  bad[7] = 10;  // Not in this worker's shard: still refused.
  ds = LoadIdx(WritePlain("s_img3", images), WritePlain("s_bad", LabelsFile(0x801, bad)), 1, 0,
               &shard);
  EXPECT_NE(ds.status().message().find("label 10 of example 7"), std::string::npos)
      << ds.status();
  ds = LoadIdx(WritePlain("s_img4", images), WritePlain("s_lbl8", LabelsFile(0x801, labels.substr(0, 8))),
               1, 0, &shard);
  EXPECT_NE(ds.status().message().find("has 9 images but"), std::string::npos) << ds.status();
  // A gzip stream cut short.
  const std::string gz_path = WriteGzip("s_full.gz", images);
  FILE* f = std::fopen(gz_path.c_str(), "rb");
  std::string bytes(4096, '\0');
  bytes.resize(std::fread(bytes.data(), 1, bytes.size(), f));
  std::fclose(f);
  ds = LoadIdx(WritePlain("s_cut.gz", bytes.substr(0, bytes.size() - 6)), lp, 1, 0, &shard);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ds.status().message().find("s_cut.gz"), std::string::npos) << ds.status();
  const DataShard empty{2, 3, 2};
  ds = LoadIdx(WritePlain("s_img5", ImagesFile(0x803, 2, 2, 3, pixels.substr(0, 12))),
               WritePlain("s_lbl5", LabelsFile(0x801, labels.substr(0, 2))), 1, 0, &empty);
  EXPECT_NE(ds.status().message().find("worker 2's shard is empty"), std::string::npos)
      << ds.status();
}

TEST(ShardTest, RealFashionMnistShardsPartitionTheSet) {
  auto whole = LoadFashionMnist(kFashionMnistDir, /*train=*/true, 0);
  ASSERT_TRUE(whole.ok()) << whole.status();
  int64_t total = 0;
  for (int w = 0; w < 2; ++w) {
    const DataShard shard{256, 2, w};
    auto ds = LoadFashionMnist(kFashionMnistDir, /*train=*/true, 0, &shard);
    ASSERT_TRUE(ds.ok()) << ds.status();
    EXPECT_EQ(ds->whole_size(), 60000);
    EXPECT_EQ(ds->size(), ShardSize(60000, 256, 2, w));
    EXPECT_EQ(ds->pixels.capacity(), ds->pixels.size());  // room for the shard only
    Dataset want = *whole;
    ASSERT_TRUE(KeepShard(shard, &want).ok());
    EXPECT_TRUE(ds->pixels == want.pixels) << w;
    EXPECT_EQ(ds->labels, want.labels);
    total += ds->size();
  }
  EXPECT_EQ(total, 60000);
}

}  // namespace
}  // namespace towerps::worker
