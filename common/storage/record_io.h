// Length-delimited records in TFRecord framing, used by TensorBoard event
// files, checkpoint shards and the chief's job store:
//
//   uint64 length (little-endian)
//   uint32 masked CRC-32C of the 8 length bytes
//   byte   data[length]
//   uint32 masked CRC-32C of data
//
// A reader detects a flipped bit in any field and a truncated tail, and says
// at which byte offset.
//
// RecordWriter and RecordReader are thread-compatible.
#ifndef TOWERPS_COMMON_STORAGE_RECORD_IO_H_
#define TOWERPS_COMMON_STORAGE_RECORD_IO_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace towerps::common {

// Appends the framed form of `data` to `out`.
void AppendRecord(absl::string_view data, std::string* out);

// The framing of a record whose data a writer sends from where it lies (no
// copy into one buffer): `*head` is set to the 12 bytes that go before the
// data, `*tail` to the 4 after it.
void RecordFraming(absl::string_view data, std::string* head, std::string* tail);

// Reads records from a buffer (which must outlive the reader).
class RecordReader {
 public:
  // `name` (a file name) only labels errors.
  RecordReader(absl::string_view buffer, std::string name);

  // The next record. OutOfRange at a clean end of the buffer; DataLoss naming
  // the offset and what is wrong for a bad CRC or a truncated record.
  absl::StatusOr<absl::string_view> Next();
  int64_t offset() const { return offset_; }

 private:
  const absl::string_view buffer_;
  const std::string name_;
  int64_t offset_ = 0;
};

// Appends records to a file. Open truncates or appends; Flush writes the
// buffer to the OS, Sync also fsyncs. Errors name the file.
class RecordWriter {
 public:
  ~RecordWriter();
  static absl::StatusOr<std::unique_ptr<RecordWriter>> Open(const std::string& path,
                                                            bool append);
  absl::Status Write(absl::string_view data);
  absl::Status Flush();
  absl::Status Sync();
  absl::Status Close();
  const std::string& path() const { return path_; }

 private:
  RecordWriter(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  const std::string path_;
  int fd_;
  std::string buffer_;
};

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_STORAGE_RECORD_IO_H_
