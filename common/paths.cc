#include "common/paths.h"

#include <errno.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace towerps::common {
namespace {

constexpr int kMaxSymlinks = 40;  // Linux's own limit (ELOOP).

std::vector<std::string> Components(absl::string_view path) {
  std::vector<std::string> out;
  for (absl::string_view c : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    out.emplace_back(c);
  }
  return out;
}

std::string Join(const std::vector<std::string>& parts) {
  return parts.empty() ? "/" : absl::StrCat("/", absl::StrJoin(parts, "/"));
}

// True when `path` is `root` or below it (both absolute and normal).
bool IsUnder(const std::string& path, const std::string& root) {
  if (root == "/") return true;
  return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                          path[root.size()] == '/');
}

}  // namespace

std::string AbsoluteNormalPath(absl::string_view path) {
  std::string full(path);
  if (full.empty() || full[0] != '/') {
    std::error_code ec;
    const std::string cwd = std::filesystem::current_path(ec).string();
    full = absl::StrCat(ec ? "/" : cwd, "/", full);
  }
  std::vector<std::string> parts;
  for (std::string& c : Components(full)) {
    if (c == ".") continue;
    if (c == "..") {
      if (!parts.empty()) parts.pop_back();
      continue;
    }
    parts.push_back(std::move(c));
  }
  return Join(parts);
}

absl::StatusOr<std::string> ResolveSymlinks(absl::string_view path) {
  if (path.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError("path contains a NUL byte");
  }
  std::deque<std::string> todo;
  for (std::string& c : Components(path)) todo.push_back(std::move(c));
  std::vector<std::string> done;  // The resolved prefix, component by component.
  int links = 0;
  while (!todo.empty()) {
    std::string c = std::move(todo.front());
    todo.pop_front();
    if (c == ".") continue;
    if (c == "..") {  // Applied to what the prefix resolved to, as the kernel does.
      if (!done.empty()) done.pop_back();
      continue;
    }
    done.push_back(std::move(c));
    const std::string here = Join(done);
    struct stat st;
    if (::lstat(here.c_str(), &st) != 0) {
      // Not there (yet): kept as written; a write would create it there.
      if (errno == ENOENT || errno == ENOTDIR) continue;
      return absl::InvalidArgumentError(
          absl::StrCat("cannot resolve \"", here, "\": ", std::strerror(errno)));
    }
    if (!S_ISLNK(st.st_mode)) continue;
    if (++links > kMaxSymlinks) {
      return absl::InvalidArgumentError(
          absl::StrCat("too many levels of symbolic links at \"", here, "\""));
    }
    char target[PATH_MAX];
    const ssize_t n = ::readlink(here.c_str(), target, sizeof(target) - 1);
    if (n < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot read symbolic link \"", here, "\": ", std::strerror(errno)));
    }
    const absl::string_view t(target, static_cast<size_t>(n));
    done.pop_back();  // The link is replaced by its target.
    if (!t.empty() && t[0] == '/') done.clear();
    std::vector<std::string> tc = Components(t);
    todo.insert(todo.begin(), tc.begin(), tc.end());
  }
  return Join(done);
}

absl::StatusOr<PathRoots> PathRoots::Create(std::string flag, std::vector<std::string> roots) {
  if (roots.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, " names no directory"));
  for (std::string& r : roots) {
    if (r.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, " has an empty directory"));
    if (r.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " contains a NUL byte"));
    }
    r = AbsoluteNormalPath(r);
  }
  return PathRoots(std::move(flag), std::move(roots));
}

std::string PathRoots::Describe() const {
  return absl::StrCat(flag_, " \"", absl::StrJoin(roots_, "\", \""), "\"");
}

absl::StatusOr<std::string> PathRoots::Resolve(absl::string_view field,
                                               absl::string_view path) const {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " is empty"));
  if (path.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(field, " contains a NUL byte"));
  }
  const std::string normal =
      AbsoluteNormalPath(path[0] == '/' ? std::string(path) : absl::StrCat(roots_[0], "/", path));
  absl::StatusOr<std::string> real = ResolveSymlinks(normal);
  if (!real.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " \"", path, "\": ", real.status().message()));
  }
  for (const std::string& root : roots_) {
    absl::StatusOr<std::string> real_root = ResolveSymlinks(root);
    if (real_root.ok() && IsUnder(*real, *real_root)) return normal;
  }
  std::string where = *real == path ? "" : absl::StrCat(" (it resolves to \"", *real, "\")");
  return absl::InvalidArgumentError(
      absl::StrCat(field, " \"", path, "\"", where, " is outside ", Describe()));
}

}  // namespace towerps::common
