#include "common/storage/file_util.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace towerps::common {
namespace {

absl::Status ErrnoError(const std::string& what, const std::string& path, int err) {
  const std::string msg = absl::StrCat(path, ": ", what, ": ", strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

std::string DirName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

absl::Status SyncDir(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open directory", dir, errno);
  const int rc = fsync(fd);
  const int err = errno;
  close(fd);
  if (rc != 0) return ErrnoError("fsync directory", dir, err);
  return absl::OkStatus();
}

namespace {
// Appends smaller than this are gathered before they go to the OS.
constexpr size_t kGatherBytes = 64 << 10;
}  // namespace

absl::StatusOr<std::unique_ptr<AtomicFileWriter>> AtomicFileWriter::Create(
    const std::string& path) {
  std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("create", tmp, errno);
  return std::unique_ptr<AtomicFileWriter>(new AtomicFileWriter(path, std::move(tmp), fd));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) close(fd_);
  if (!committed_) unlink(tmp_.c_str());
}

absl::Status AtomicFileWriter::Fail(absl::Status status) {
  if (status_.ok()) status_ = std::move(status);
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  return status_;
}

absl::Status AtomicFileWriter::Write(absl::string_view data) {
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    const ssize_t n = write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Fail(ErrnoError("write", tmp_, errno));
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::FlushBuffer() {
  if (buffer_.empty()) return absl::OkStatus();
  absl::Status st = Write(buffer_);
  buffer_.clear();
  return st;
}

absl::Status AtomicFileWriter::Append(absl::string_view data) {
  if (!status_.ok()) return status_;
  if (committed_ || fd_ < 0) return absl::FailedPreconditionError(tmp_ + ": append after commit");
  if (buffer_.size() + data.size() <= kGatherBytes) {
    buffer_.append(data.data(), data.size());
    return absl::OkStatus();
  }
  if (absl::Status st = FlushBuffer(); !st.ok()) return st;
  return Write(data);
}

absl::Status AtomicFileWriter::Commit() {
  if (!status_.ok()) return status_;
  if (committed_ || fd_ < 0) return absl::FailedPreconditionError(tmp_ + ": committed twice");
  if (absl::Status st = FlushBuffer(); !st.ok()) return st;
  if (fsync(fd_) != 0) return Fail(ErrnoError("fsync", tmp_, errno));
  const int rc = close(fd_);
  const int err = errno;
  fd_ = -1;
  if (rc != 0) return Fail(ErrnoError("close", tmp_, err));
  if (rename(tmp_.c_str(), path_.c_str()) != 0) {
    return Fail(ErrnoError("rename to " + path_, tmp_, errno));
  }
  committed_ = true;
  return SyncDir(DirName(path_));
}

std::string JoinPath(const std::string& dir, absl::string_view name) {
  if (dir.empty() || dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  absl::StatusOr<std::unique_ptr<AtomicFileWriter>> w = AtomicFileWriter::Create(path);
  if (!w.ok()) return w.status();
  if (absl::Status st = (*w)->Append(contents); !st.ok()) return st;
  return (*w)->Commit();
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open", path, errno);
  std::string out;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      close(fd);
      return ErrnoError("read", path, err);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

absl::Status MakeDirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return absl::InternalError(absl::StrCat(path, ": create directory: ", ec.message()));
  if (!std::filesystem::is_directory(path, ec)) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": exists and is not a directory"));
  }
  return absl::OkStatus();
}

absl::Status RemoveAll(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return absl::InternalError(absl::StrCat(path, ": remove: ", ec.message()));
  return absl::OkStatus();
}

}  // namespace towerps::common
