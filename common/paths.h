// Confined paths: every directory that a job spec or an RPC names (checkpoint
// and TensorBoard dirs, a ps's save and restore dirs, data dirs) must lie
// under a root the operator configured (--state_dir, --data_root), so that a
// caller cannot make a server read or write anywhere else.
//
// A path is resolved as the kernel would resolve it: a relative path under the
// first root, symbolic links followed in the part that exists (a dangling link
// too: its target is where a write would go), ".." applied to what the link
// before it resolved to. The path is accepted when that resolution is one of
// the roots' own resolutions or lies below it.
//
// The check is made when it is called: a link swapped in between the check
// and the write is not seen. Servers therefore check again where they write,
// and the directories they create are under a checked path.
//
// Thread-safe: a PathRoots is immutable after Create; the file system is only
// read (lstat, readlink).
#ifndef TOWERPS_COMMON_PATHS_H_
#define TOWERPS_COMMON_PATHS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace towerps::common {

// `path` made absolute (against the current directory when relative) and
// lexically normal: no ".", "..", repeated or trailing '/'. ".." at "/" stays
// at "/". Does not touch the file system beyond getcwd.
std::string AbsoluteNormalPath(absl::string_view path);

// The real location of absolute, lexically normal `path`: symbolic links in
// the part that exists are followed (dangling ones too), the rest is kept as
// written. InvalidArgument for a loop of links (more than 40) or a path with
// a NUL byte; the errors of lstat/readlink other than "does not exist" name
// the path.
absl::StatusOr<std::string> ResolveSymlinks(absl::string_view path);

class PathRoots {
 public:
  // `flag` names the roots in errors (e.g. "--state_dir"). REQUIRES: at least
  // one root. A root must be non-empty; relative roots are made absolute
  // against the current directory now. Roots need not exist yet.
  // InvalidArgument otherwise.
  static absl::StatusOr<PathRoots> Create(std::string flag, std::vector<std::string> roots);

  // Returns the absolute, lexically normal form of `path` (a relative one
  // under roots()[0]) when its resolution lies under a root's resolution.
  // InvalidArgument naming `field` otherwise, e.g.
  //   checkpoint.dir "/etc/x" is outside --state_dir "/var/lib/towerps"
  // and for an empty path ("<field> is empty") or an unresolvable one.
  absl::StatusOr<std::string> Resolve(absl::string_view field, absl::string_view path) const;

  // Absolute, lexically normal, in the order given.
  const std::vector<std::string>& roots() const { return roots_; }
  const std::string& flag() const { return flag_; }
  // `--state_dir "/a"`, or `--data_root "/a", "/b"`: for errors and logs.
  std::string Describe() const;

 private:
  PathRoots(std::string flag, std::vector<std::string> roots)
      : flag_(std::move(flag)), roots_(std::move(roots)) {}

  std::string flag_;
  std::vector<std::string> roots_;
};

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_PATHS_H_
