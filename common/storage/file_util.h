// Small file helpers with the durability rules every on-disk format here uses.
//
// Thread-safe (no shared state).
#ifndef TOWERPS_COMMON_STORAGE_FILE_UTIL_H_
#define TOWERPS_COMMON_STORAGE_FILE_UTIL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace towerps::common {

// Writes a file so that readers see the old file or the whole new one,
// never a part, from pieces appended one after another (a large file need
// not be assembled in memory first): appends go to "<path>.tmp.<pid>";
// Commit fsyncs it, renames it over `path` and fsyncs the directory.
// Destroyed without a successful Commit, it removes the temporary file.
// Errors name the file and the failing call; a full disk is
// ResourceExhausted. Small appends are gathered into one write; large ones
// go to the OS directly from the caller's memory.
//
// Thread-compatible.
class AtomicFileWriter {
 public:
  static absl::StatusOr<std::unique_ptr<AtomicFileWriter>> Create(const std::string& path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  // After an error, every later call returns it again.
  absl::Status Append(absl::string_view data);
  absl::Status Commit();

 private:
  AtomicFileWriter(std::string path, std::string tmp, int fd)
      : path_(std::move(path)), tmp_(std::move(tmp)), fd_(fd) {}
  absl::Status Write(absl::string_view data);
  absl::Status FlushBuffer();
  absl::Status Fail(absl::Status status);

  const std::string path_;
  const std::string tmp_;
  int fd_;  // -1 once closed
  std::string buffer_;
  absl::Status status_;
  bool committed_ = false;
};

// `dir`/`name`, with one slash between them (none added after a trailing
// one; `name` alone when `dir` is empty).
std::string JoinPath(const std::string& dir, absl::string_view name);

// Writes `contents` to `path` atomically (AtomicFileWriter, in one piece).
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

// NotFound if missing; other errors name the path.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// mkdir -p. OK if it exists already as a directory.
absl::Status MakeDirs(const std::string& path);

// fsyncs a directory (after a rename into it).
absl::Status SyncDir(const std::string& dir);

// Removes a file or a directory tree; OK if it does not exist.
absl::Status RemoveAll(const std::string& path);

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_STORAGE_FILE_UTIL_H_
