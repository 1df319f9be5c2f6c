// Reading data sets from their files: Fashion-MNIST from IDX files (gzipped
// or not, whole or one worker's shard streamed), CIFAR-10 from its binary
// batch files. Every size and label is checked against the file before it
// is trusted; errors name the file and what was wrong. The rest of
// dataset.h (shards, epochs, batches) is in dataset.cc.
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/status.h"
#include "worker/model/dataset.h"
#include "worker/model/dataset_internal.h"

namespace towerps::worker {
namespace {

using dataset_internal::CheckShard;
using dataset_internal::EmptyShardError;

constexpr uint32_t kImagesMagic = 0x00000803;
constexpr uint32_t kLabelsMagic = 0x00000801;
constexpr int kIdxClasses = 10;
constexpr size_t kChunk = 1 << 20;

constexpr int kCifarClasses = 10;
constexpr int64_t kCifarChannels = 3;
constexpr int64_t kCifarSide = 32;
constexpr int64_t kCifarPixels = kCifarChannels * kCifarSide * kCifarSide;
constexpr int64_t kCifarRecord = 1 + kCifarPixels;  // The label byte first.
constexpr int kCifarTrainFiles = 5;

// How many bytes the open file `f` of `file_bytes` will give when read whole
// (gzip: its ISIZE trailer, the inflated size mod 2^32, bounded by deflate's
// largest ratio so that a forged trailer cannot reserve more than the file
// could give). A hint for reserve(): growing a 47 MB buffer by doubling
// held ~96 MB at its peak.
size_t ExpectedBytes(FILE* f, int64_t file_bytes, bool gzipped) {
  if (!gzipped) return static_cast<size_t>(std::max<int64_t>(0, file_bytes));
  unsigned char trailer[4];
  if (file_bytes < 18 || std::fseek(f, -4, SEEK_END) != 0 ||
      std::fread(trailer, 1, 4, f) != 4) {
    return 0;
  }
  const uint64_t isize = uint64_t{trailer[0]} | (uint64_t{trailer[1]} << 8) |
                         (uint64_t{trailer[2]} << 16) | (uint64_t{trailer[3]} << 24);
  constexpr uint64_t kMaxDeflateRatio = 1032;
  return static_cast<size_t>(std::min(isize, kMaxDeflateRatio * static_cast<uint64_t>(file_bytes)));
}

// Reads a whole file into `data` (std::string or std::vector<uint8_t>),
// inflating it when it starts with the gzip magic bytes.
template <typename Bytes>
absl::Status ReadMaybeGzippedInto(const std::string& path, Bytes* data) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  }
  unsigned char head[2] = {0, 0};
  const size_t head_len = std::fread(head, 1, 2, f);
  const bool gzipped = head_len == 2 && head[0] == 0x1f && head[1] == 0x8b;
  struct stat st;
  const int64_t file_bytes = ::fstat(fileno(f), &st) == 0 ? st.st_size : 0;
  data->clear();
  data->reserve(ExpectedBytes(f, file_bytes, gzipped));
  if (!gzipped) {
    data->insert(data->end(), head, head + head_len);
    std::fseek(f, static_cast<long>(head_len), SEEK_SET);
    char buf[1 << 16];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) data->insert(data->end(), buf, buf + n);
    const bool failed = std::ferror(f) != 0;
    std::fclose(f);
    if (failed) {
      return absl::DataLossError(absl::StrCat("error reading ", path));
    }
    return absl::OkStatus();
  }
  std::fclose(f);

  gzFile gz = gzopen(path.c_str(), "rb");
  if (gz == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  }
  gzbuffer(gz, kChunk);
  std::string chunk(kChunk, '\0');
  while (true) {
    const int n = gzread(gz, chunk.data(), static_cast<unsigned>(kChunk));
    if (n <= 0) break;
    data->insert(data->end(), chunk.data(), chunk.data() + n);
  }
  int errnum = Z_OK;
  const char* message = gzerror(gz, &errnum);
  const std::string error = message == nullptr ? "" : message;
  gzclose(gz);
  // A truncated stream reports Z_BUF_ERROR ("unexpected end of file").
  if (errnum != Z_OK && errnum != Z_STREAM_END) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": corrupt or truncated gzip stream (", error, ")"));
  }
  return absl::OkStatus();
}

// Reads a whole file as it is on disk (no gzip detection: CIFAR-10 errors
// name byte offsets in the file itself).
absl::StatusOr<std::string> ReadPlainFile(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  }
  std::string data;
  struct stat st;
  if (::fstat(fileno(f), &st) == 0 && st.st_size > 0) data.reserve(st.st_size);
  std::string chunk(kChunk, '\0');
  size_t n;
  while ((n = std::fread(chunk.data(), 1, chunk.size(), f)) > 0) {
    data.append(chunk.data(), n);
  }
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return absl::DataLossError(absl::StrCat("error reading ", path));
  return data;
}

// Checks one CIFAR-10 batch file: a positive whole number of records, every
// label in 0..9. InvalidArgument, as for a corrupt IDX file.
absl::Status CheckCifarBatch(const std::string& path, const std::string& data) {
  const int64_t size = static_cast<int64_t>(data.size());
  if (size == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": empty; a CIFAR-10 batch file holds ", kCifarRecord,
        "-byte records (1 label byte, then ", kCifarPixels, " pixel bytes)"));
  }
  if (size % kCifarRecord != 0) {
    const int64_t record = size / kCifarRecord;
    const int64_t start = record * kCifarRecord;
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", size, " bytes is not a whole number of ", kCifarRecord,
        "-byte records (truncated at byte ", start, "? record ", record,
        " starts there and has only ", size - start, " of its ", kCifarRecord,
        " bytes)"));
  }
  const auto* bytes = reinterpret_cast<const unsigned char*>(data.data());
  for (int64_t r = 0; r < size / kCifarRecord; ++r) {
    const int label = bytes[r * kCifarRecord];
    if (label >= kCifarClasses) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": record ", r, " (byte ", r * kCifarRecord,
                       "): label ", label, " is not in 0..",
                       kCifarClasses - 1));
    }
  }
  return absl::OkStatus();
}

uint32_t BigEndian32(absl::string_view data, size_t offset) {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data() + offset);
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) |
         (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// Checks the header of an IDX file of `dims` dimensions, given its first
// bytes (`data`, the whole file or at least its header; `file_bytes` is the
// whole file's size where known, for the message on a short file). On
// success fills `shape` (dims entries) and returns the size the header
// promises, header included.
absl::StatusOr<unsigned __int128> CheckIdxHeader(const std::string& path, absl::string_view data,
                                                 uint32_t magic, int dims,
                                                 std::vector<uint64_t>* shape) {
  const size_t header = 4 + 4 * static_cast<size_t>(dims);
  // The magic first: a file of the wrong kind should say so, not "truncated".
  if (data.size() >= 4 && BigEndian32(data, 0) != magic) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: bad magic number 0x%08x, want 0x%08x", path,
                        BigEndian32(data, 0), magic));
  }
  if (data.size() < header) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": truncated: ", data.size(),
                     " bytes, shorter than the ", header, "-byte IDX header"));
  }
  unsigned __int128 expected = header;
  unsigned __int128 elements = 1;
  shape->clear();
  for (int i = 0; i < dims; ++i) {
    const uint32_t d = BigEndian32(data, 4 + 4 * i);
    if (d == 0 && i > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": dimension ", i, " is 0"));
    }
    shape->push_back(d);
    elements *= d;
  }
  return expected + elements;
}

// Checks the header of an IDX file of `dims` dimensions and its size.
// On success fills `shape` (dims entries).
absl::Status ParseIdxHeader(const std::string& path, absl::string_view data,
                            uint32_t magic, int dims,
                            std::vector<uint64_t>* shape) {
  TOWERPS_ASSIGN_OR_RETURN(const unsigned __int128 expected,
                           CheckIdxHeader(path, data, magic, dims, shape));
  if (data.size() < expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": truncated: ", data.size(), " bytes, the header promises ",
        static_cast<uint64_t>(expected)));
  }
  if (data.size() > expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", data.size() - static_cast<uint64_t>(expected),
                     " trailing bytes after the data"));
  }
  return absl::OkStatus();
}

// The images of an IDX file streamed: keeps rows [0, limit) whose
// keep[row] is true, appended to *out, and checks the whole file as
// ParseIdxHeader does (header, length, trailing bytes, gzip stream). Plain
// files are read as they are (zlib passes them through).
absl::Status StreamIdxImages(const std::string& path, int64_t limit,
                             const std::vector<bool>& keep, int64_t kept,
                             std::vector<uint64_t>* shape, std::vector<uint8_t>* out) {
  gzFile gz = gzopen(path.c_str(), "rb");
  if (gz == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  }
  gzbuffer(gz, kChunk);
  // Reads up to n bytes; a short count means the end of the file, or a
  // broken gzip stream (then the error says so).
  auto read = [&](void* dst, size_t n, size_t* got) -> absl::Status {
    *got = 0;
    while (*got < n) {
      const int r = gzread(gz, static_cast<char*>(dst) + *got,
                           static_cast<unsigned>(std::min<size_t>(n - *got, kChunk)));
      if (r <= 0) break;
      *got += static_cast<size_t>(r);
    }
    int errnum = Z_OK;
    const char* message = gzerror(gz, &errnum);
    if (errnum != Z_OK && errnum != Z_STREAM_END) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": corrupt or truncated gzip stream (", message == nullptr ? "" : message, ")"));
    }
    return absl::OkStatus();
  };
  auto body = [&]() -> absl::Status {
    constexpr size_t kHeader = 16;
    unsigned char header[kHeader];
    size_t got = 0;
    TOWERPS_RETURN_IF_ERROR(read(header, kHeader, &got));
    TOWERPS_ASSIGN_OR_RETURN(
        const unsigned __int128 expected,
        CheckIdxHeader(path, absl::string_view(reinterpret_cast<const char*>(header), got),
                       kImagesMagic, 3, shape));
    // The data is read as bytes, a chunk at a time (a row may be larger
    // than any buffer a forged header could ask for), and each kept row's
    // bytes are copied out as they pass.
    const unsigned __int128 row = static_cast<unsigned __int128>((*shape)[1]) * (*shape)[2];
    const unsigned __int128 data_bytes = expected - kHeader;
    // Room for the kept rows, but never more than the file could hold
    // (plain: its size; gzip: deflate's largest ratio of it).
    struct stat st;
    const uint64_t file_bytes = ::stat(path.c_str(), &st) == 0 ? st.st_size : 0;
    constexpr uint64_t kMaxDeflateRatio = 1032;
    const uint64_t ratio = gzdirect(gz) ? 1 : kMaxDeflateRatio;
    out->clear();
    out->reserve(static_cast<size_t>(
        std::min<unsigned __int128>(row * static_cast<uint64_t>(kept),
                                    static_cast<unsigned __int128>(file_bytes) * ratio)));
    std::vector<uint8_t> block(kChunk);
    unsigned __int128 pos = 0;  // bytes of the data read
    while (pos < data_bytes) {
      const size_t want = static_cast<size_t>(
          std::min<unsigned __int128>(kChunk, data_bytes - pos));
      TOWERPS_RETURN_IF_ERROR(read(block.data(), want, &got));
      for (size_t off = 0; off < got;) {
        const unsigned __int128 at = pos + off;
        const unsigned __int128 i = at / row;
        const size_t take =
            static_cast<size_t>(std::min<unsigned __int128>(got - off, row - at % row));
        if (i < static_cast<unsigned __int128>(limit) && keep[static_cast<size_t>(i)]) {
          out->insert(out->end(), block.data() + off, block.data() + off + take);
        }
        off += take;
      }
      pos += got;
      if (got < want) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": truncated: ", static_cast<uint64_t>(kHeader + pos),
            " bytes, the header promises ", static_cast<uint64_t>(expected)));
      }
    }
    uint64_t trailing = 0;
    do {
      TOWERPS_RETURN_IF_ERROR(read(block.data(), block.size(), &got));
      trailing += got;
    } while (got == block.size());
    if (trailing > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", trailing, " trailing bytes after the data"));
    }
    return absl::OkStatus();
  };
  const absl::Status st = body();
  gzclose(gz);
  return st;
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Sharded LoadIdx: the labels whole (they are small), the images streamed.
absl::StatusOr<Dataset> LoadIdxShard(const std::string& images_path,
                                     const std::string& labels_path, float scale,
                                     int64_t max_examples, const DataShard& shard) {
  TOWERPS_RETURN_IF_ERROR(CheckShard(shard));
  std::string labels;
  TOWERPS_RETURN_IF_ERROR(ReadMaybeGzippedInto(labels_path, &labels));
  std::vector<uint64_t> label_shape;
  TOWERPS_RETURN_IF_ERROR(ParseIdxHeader(labels_path, labels, kLabelsMagic, 1, &label_shape));
  const int64_t label_count = static_cast<int64_t>(label_shape[0]);
  const int64_t n = max_examples > 0 ? std::min(label_count, max_examples) : label_count;
  std::vector<bool> keep(static_cast<size_t>(n));
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    keep[i] = ShardOwner(i, n, shard.global_batch, shard.num_workers) == shard.worker;
    kept += keep[i] ? 1 : 0;
  }
  std::vector<uint64_t> image_shape;
  std::vector<uint8_t> images;
  TOWERPS_RETURN_IF_ERROR(StreamIdxImages(images_path, n, keep, kept, &image_shape, &images));
  if (image_shape[0] != label_shape[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat(images_path, " has ", image_shape[0], " images but ",
                     labels_path, " has ", label_shape[0], " labels"));
  }
  constexpr size_t kLabelsOffset = 8;
  for (int64_t i = 0; i < label_count; ++i) {
    const unsigned char label = static_cast<unsigned char>(labels[kLabelsOffset + i]);
    if (label >= kIdxClasses) {
      return absl::InvalidArgumentError(
          absl::StrCat(labels_path, ": label ", int{label}, " of example ", i,
                       " is not below ", kIdxClasses));
    }
  }
  if (kept == 0) return EmptyShardError(shard, n);
  Dataset out;
  out.num_classes = kIdxClasses;
  out.image = ImageShape{1, static_cast<int64_t>(image_shape[1]),
                         static_cast<int64_t>(image_shape[2])};
  out.pixels = std::move(images);
  out.pixel_scale = scale;
  out.labels.reserve(kept);
  for (int64_t i = 0; i < n; ++i) {
    if (keep[i]) out.labels.push_back(static_cast<unsigned char>(labels[kLabelsOffset + i]));
  }
  out.whole_set_size = n;
  return out;
}

}  // namespace

absl::StatusOr<Dataset> LoadIdx(const std::string& images_path,
                                const std::string& labels_path, float scale,
                                int64_t max_examples, const DataShard* shard) {
  if (max_examples < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_examples must be >= 0, got ", max_examples));
  }
  if (shard != nullptr) return LoadIdxShard(images_path, labels_path, scale, max_examples, *shard);
  // The images are read into the buffer the set keeps (no copy of them).
  std::vector<uint8_t> images;
  TOWERPS_RETURN_IF_ERROR(ReadMaybeGzippedInto(images_path, &images));
  std::string labels;
  TOWERPS_RETURN_IF_ERROR(ReadMaybeGzippedInto(labels_path, &labels));
  std::vector<uint64_t> image_shape;
  std::vector<uint64_t> label_shape;
  TOWERPS_RETURN_IF_ERROR(
      ParseIdxHeader(images_path,
                     absl::string_view(reinterpret_cast<const char*>(images.data()), images.size()),
                     kImagesMagic, 3, &image_shape));
  TOWERPS_RETURN_IF_ERROR(
      ParseIdxHeader(labels_path, labels, kLabelsMagic, 1, &label_shape));
  if (image_shape[0] != label_shape[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat(images_path, " has ", image_shape[0], " images but ",
                     labels_path, " has ", label_shape[0], " labels"));
  }
  const int64_t count = static_cast<int64_t>(image_shape[0]);
  const int64_t pixels = static_cast<int64_t>(image_shape[1] * image_shape[2]);
  constexpr size_t kLabelsOffset = 8;
  constexpr size_t kImagesOffset = 16;
  for (int64_t i = 0; i < count; ++i) {
    const unsigned char label =
        static_cast<unsigned char>(labels[kLabelsOffset + i]);
    if (label >= kIdxClasses) {
      return absl::InvalidArgumentError(
          absl::StrCat(labels_path, ": label ", int{label}, " of example ", i,
                       " is not below ", kIdxClasses));
    }
  }

  const int64_t n = max_examples > 0 ? std::min(count, max_examples) : count;
  Dataset out;
  out.num_classes = kIdxClasses;
  out.image = ImageShape{1, static_cast<int64_t>(image_shape[1]),
                         static_cast<int64_t>(image_shape[2])};
  images.erase(images.begin(), images.begin() + kImagesOffset);
  images.resize(n * pixels);
  if (images.capacity() > 2 * images.size()) images.shrink_to_fit();  // max_examples
  out.pixels = std::move(images);
  out.pixel_scale = scale;
  out.labels.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    out.labels[i] = static_cast<unsigned char>(labels[kLabelsOffset + i]);
  }
  return out;
}

absl::StatusOr<std::pair<std::string, std::string>> FindFashionMnistFiles(
    const std::string& dir, bool train) {
  const std::string prefix = absl::StrCat(dir, "/", train ? "train" : "t10k");
  std::string paths[2] = {prefix + "-images-idx3-ubyte",
                          prefix + "-labels-idx1-ubyte"};
  for (std::string& path : paths) {
    if (FileExists(path)) continue;
    const std::string gz = path + ".gz";
    if (!FileExists(gz)) {
      return absl::NotFoundError(absl::StrCat("Fashion-MNIST: neither ", path,
                                              " nor ", gz, " exists"));
    }
    path = gz;
  }
  return std::make_pair(paths[0], paths[1]);
}

absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, bool train,
                                         int64_t max_examples, const DataShard* shard) {
  TOWERPS_ASSIGN_OR_RETURN(auto paths, FindFashionMnistFiles(dir, train));
  return LoadIdx(paths.first, paths.second, 1.0f / 255.0f, max_examples, shard);
}

absl::StatusOr<std::vector<std::string>> FindCifar10Files(
    const std::string& dir, bool train) {
  std::vector<std::string> paths;
  if (train) {
    for (int i = 1; i <= kCifarTrainFiles; ++i) {
      paths.push_back(absl::StrCat(dir, "/data_batch_", i, ".bin"));
    }
  } else {
    paths.push_back(absl::StrCat(dir, "/test_batch.bin"));
  }
  for (const std::string& path : paths) {
    if (FileExists(path)) continue;
    return absl::NotFoundError(absl::StrCat(
        "CIFAR-10: ", path, " does not exist",
        FileExists(dir) ? "" : absl::StrCat(" (nor does ", dir, ")"),
        "; expected the CIFAR-10 binary version (data_batch_1.bin .. "
        "data_batch_5.bin and test_batch.bin) in ",
        dir));
  }
  return paths;
}

absl::StatusOr<Dataset> LoadCifar10(const std::string& dir, bool train,
                                    int64_t max_examples, const DataShard* shard) {
  if (max_examples < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_examples must be >= 0, got ", max_examples));
  }
  TOWERPS_ASSIGN_OR_RETURN(const std::vector<std::string> paths,
                           FindCifar10Files(dir, train));
  // Every file is read and checked, so that a bad file is reported whatever
  // max_examples is, one at a time: its kept rows are copied out and the
  // file let go before the next is read (all five at once held a second
  // copy of the set).
  Dataset out;
  out.num_classes = kCifarClasses;
  out.image = ImageShape{kCifarChannels, kCifarSide, kCifarSide};
  out.pixel_scale = 1.0f / 255.0f;  // As LoadFashionMnist.
  int64_t expected = 0;  // records, from the files' sizes: room made once
  for (const std::string& path : paths) {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0) expected += st.st_size / kCifarRecord;
  }
  if (max_examples > 0) expected = std::min(expected, max_examples);
  out.labels.reserve(expected);
  out.pixels.reserve(expected * kCifarPixels);
  for (const std::string& path : paths) {
    TOWERPS_ASSIGN_OR_RETURN(const std::string data, ReadPlainFile(path));
    TOWERPS_RETURN_IF_ERROR(CheckCifarBatch(path, data));
    const auto* bytes = reinterpret_cast<const unsigned char*>(data.data());
    const int64_t records = static_cast<int64_t>(data.size()) / kCifarRecord;
    for (int64_t r = 0; r < records; ++r) {
      if (max_examples > 0 && static_cast<int64_t>(out.labels.size()) >= max_examples) break;
      const unsigned char* record = bytes + r * kCifarRecord;
      out.labels.push_back(record[0]);
      // File order is already channel-major (R plane, G plane, B plane).
      out.pixels.insert(out.pixels.end(), record + 1, record + kCifarRecord);
    }
  }
  if (shard != nullptr) TOWERPS_RETURN_IF_ERROR(KeepShard(*shard, &out));
  return out;
}

}  // namespace towerps::worker
