// Small file helpers with the durability rules every on-disk format here uses.
//
// Thread-safe (no shared state).
#ifndef TOWERPS_COMMON_STORAGE_FILE_UTIL_H_
#define TOWERPS_COMMON_STORAGE_FILE_UTIL_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace towerps::common {

// Writes `contents` to `path` so that readers see the old file or the whole
// new one, never a part: write "<path>.tmp.<pid>", fsync it, rename over
// `path`, fsync the directory. Errors name the path and the failing call.
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
