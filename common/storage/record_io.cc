#include "common/storage/record_io.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include <memory>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"
#include "common/storage/crc32c.h"

namespace towerps::common {
namespace {

void PutU32(uint32_t v, std::string* out) {
  char b[4];
  absl::little_endian::Store32(b, v);
  out->append(b, 4);
}

// Writes are buffered up to this size before they go to the OS.
constexpr size_t kFlushBytes = 1 << 20;

}  // namespace

void RecordFraming(absl::string_view data, std::string* head, std::string* tail) {
  char len[8];
  absl::little_endian::Store64(len, data.size());
  head->assign(len, 8);
  PutU32(MaskCrc(Crc32c(absl::string_view(len, 8))), head);
  tail->clear();
  PutU32(MaskCrc(Crc32c(data)), tail);
}

void AppendRecord(absl::string_view data, std::string* out) {
  std::string head, tail;
  RecordFraming(data, &head, &tail);
  out->append(head);
  out->append(data.data(), data.size());
  out->append(tail);
}

RecordReader::RecordReader(absl::string_view buffer, std::string name)
    : buffer_(buffer), name_(std::move(name)) {}

absl::StatusOr<absl::string_view> RecordReader::Next() {
  const int64_t left = static_cast<int64_t>(buffer_.size()) - offset_;
  if (left == 0) return absl::OutOfRangeError(absl::StrCat(name_, ": end of records"));
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat(name_, ": record at byte ", offset_, ": ", what));
  };
  if (left < 12) return bad(absl::StrCat("truncated header (", left, " of 12 bytes)"));
  const char* p = buffer_.data() + offset_;
  const uint64_t len = absl::little_endian::Load64(p);
  if (UnmaskCrc(absl::little_endian::Load32(p + 8)) != Crc32c(absl::string_view(p, 8))) {
    return bad("length CRC mismatch");
  }
  if (left < 16 || len > static_cast<uint64_t>(left - 16)) {
    return bad(absl::StrCat("truncated: length ", len, " but only ", left - 12,
                            " bytes follow the header"));
  }
  const absl::string_view data(p + 12, len);
  if (UnmaskCrc(absl::little_endian::Load32(p + 12 + len)) != Crc32c(data)) {
    return bad("data CRC mismatch");
  }
  offset_ += 16 + static_cast<int64_t>(len);
  return data;
}

RecordWriter::~RecordWriter() { Close().IgnoreError(); }

absl::StatusOr<std::unique_ptr<RecordWriter>> RecordWriter::Open(const std::string& path,
                                                                  bool append) {
  const int fd = open(path.c_str(),
                      O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat(path, ": open for writing: ", strerror(errno)));
  }
  return std::unique_ptr<RecordWriter>(new RecordWriter(path, fd));
}

absl::Status RecordWriter::Write(absl::string_view data) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": closed"));
  AppendRecord(data, &buffer_);
  if (buffer_.size() >= kFlushBytes) return Flush();
  return absl::OkStatus();
}

absl::Status RecordWriter::Flush() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": closed"));
  size_t done = 0;
  while (done < buffer_.size()) {
    const ssize_t n = write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat(path_, ": write: ", strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  buffer_.clear();
  return absl::OkStatus();
}

absl::Status RecordWriter::Sync() {
  absl::Status s = Flush();
  if (!s.ok()) return s;
  if (fsync(fd_) != 0) return absl::InternalError(absl::StrCat(path_, ": fsync: ", strerror(errno)));
  return absl::OkStatus();
}

absl::Status RecordWriter::Close() {
  if (fd_ < 0) return absl::OkStatus();
  absl::Status s = Flush();
  if (close(fd_) != 0 && s.ok()) {
    s = absl::InternalError(absl::StrCat(path_, ": close: ", strerror(errno)));
  }
  fd_ = -1;
  return s;
}

}  // namespace towerps::common
