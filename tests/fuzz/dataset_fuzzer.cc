// Fuzzes the data set readers (worker/model/dataset): Fashion-MNIST's IDX
// files (plain or gzip) and CIFAR-10's binary batch files. Input: byte 0
// picks the reader (even: IDX, odd: CIFAR-10) and byte 1 is max_examples;
// for IDX, bytes 2-5 (little-endian) are the length of the images file,
// which follows, and the rest is the labels file; for CIFAR-10 the rest is
// test_batch.bin.
// Invariants: a refusal is InvalidArgument naming a file; an accepted set
// has one label in [0, 10) per feature row, rows of rows*cols (or 3072)
// values in [0, 1] kept as bytes, and no more than max_examples rows when it
// is set. IDX is also read as a shard (global batch 3, 2 workers; the
// worker is max_examples' parity), streamed: it must be refused exactly
// when the whole read is, and otherwise equal the whole set cut to the
// shard (KeepShard), both refusing an empty shard alike.
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "tests/fuzz/fuzz_util.h"
#include "worker/model/dataset.h"

namespace {

void CheckDataset(const towerps::worker::Dataset& d, int64_t max_examples) {
  // Image sets are kept as bytes: no float copy, and a whole number of rows.
  FUZZ_CHECK(d.features.num_elements() == 0, "an image set kept as floats");
  FUZZ_CHECK(d.image.is_image(), "no image shape");
  FUZZ_CHECK(d.input_dim() == d.image.num_elements(), "image shape does not match the rows");
  FUZZ_CHECK(static_cast<int64_t>(d.pixels.size()) == d.size() * d.input_dim(),
             "%zu bytes for %lld rows", d.pixels.size(), static_cast<long long>(d.size()));
  const int64_t n = d.size();
  FUZZ_CHECK(n > 0, "an empty set accepted");
  FUZZ_CHECK(max_examples == 0 || n <= max_examples, "%lld rows, max %lld",
             static_cast<long long>(n), static_cast<long long>(max_examples));
  FUZZ_CHECK(static_cast<int64_t>(d.labels.size()) == n, "%zu labels for %lld rows",
             d.labels.size(), static_cast<long long>(n));
  FUZZ_CHECK(d.num_classes == 10, "num_classes %d", d.num_classes);
  for (int32_t label : d.labels) FUZZ_CHECK(label >= 0 && label < 10, "label %d", label);
  for (int64_t i = 0; i < n * d.input_dim(); ++i) {
    const float v = d.FeatureAt(i);
    FUZZ_CHECK(v >= 0 && v <= 1, "pixel %f", v);
  }
}

void CheckRefusal(const absl::Status& s, const std::string& dir) {
  FUZZ_CHECK(s.code() == absl::StatusCode::kInvalidArgument, "%s", s.ToString().c_str());
  FUZZ_CHECK(s.message().find(dir) != std::string::npos, "not naming the file: %s",
             s.ToString().c_str());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const std::string dir = towerps::fuzz::FuzzTempDir() + "/data";
  const int64_t max_examples = data[1];
  if (data[0] % 2 == 1) {
    towerps::fuzz::WriteFuzzFile(dir + "/test_batch.bin", data + 2, size - 2);
    auto set = towerps::worker::LoadCifar10(dir, /*train=*/false, max_examples);
    if (set.ok()) {
      CheckDataset(*set, max_examples);
      FUZZ_CHECK(set->image.channels == 3 && set->image.height == 32 && set->image.width == 32,
                 "CIFAR-10 image shape");
    } else {
      CheckRefusal(set.status(), dir);
    }
    return 0;
  }
  if (size < 6) return 0;
  uint32_t images_len = 0;
  std::memcpy(&images_len, data + 2, 4);
  const size_t rest = size - 6;
  if (images_len > rest) images_len = static_cast<uint32_t>(rest);
  const std::string images = dir + "/images-idx3-ubyte";
  const std::string labels = dir + "/labels-idx1-ubyte";
  towerps::fuzz::WriteFuzzFile(images, data + 6, images_len);
  towerps::fuzz::WriteFuzzFile(labels, data + 6 + images_len, rest - images_len);
  auto set = towerps::worker::LoadIdx(images, labels, 1.0f / 255, max_examples);
  if (set.ok()) {
    CheckDataset(*set, max_examples);
  } else {
    CheckRefusal(set.status(), dir);
  }
  const towerps::worker::DataShard shard{3, 2, static_cast<int>(max_examples % 2)};
  auto part = towerps::worker::LoadIdx(images, labels, 1.0f / 255, max_examples, &shard);
  if (!set.ok()) {
    FUZZ_CHECK(!part.ok(), "the shard read accepted what the whole read refused: %s",
               set.status().ToString().c_str());
    CheckRefusal(part.status(), dir);
    return 0;
  }
  towerps::worker::Dataset want = *set;
  const absl::Status cut = towerps::worker::KeepShard(shard, &want);
  if (!cut.ok()) {
    FUZZ_CHECK(!part.ok() && part.status().message().find("shard is empty") != std::string::npos,
               "empty shard: %s", part.status().ToString().c_str());
    return 0;
  }
  FUZZ_CHECK(part.ok(), "the shard read refused what the whole read accepted: %s",
             part.status().ToString().c_str());
  FUZZ_CHECK(part->pixels == want.pixels && part->labels == want.labels &&
                 part->image == want.image && part->whole_size() == set->size(),
             "the shard read differs from the whole set cut to the shard");
  return 0;
}
