#include "common/host_limits.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace towerps::common {
namespace {

std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The file's one number; nullopt for none (missing, "max", garbage).
std::optional<double> ReadNumber(const std::string& path) {
  double v = 0;
  if (!absl::SimpleAtod(absl::StripAsciiWhitespace(ReadSmallFile(path)), &v)) return std::nullopt;
  return v;
}

// One cgroup hierarchy this process is in: where it is mounted, the mount's
// root within the hierarchy, and the process's cgroup path in it.
struct Hierarchy {
  bool v2 = false;
  std::string mount_point, mount_root, path;
};

bool HasToken(absl::string_view list, absl::string_view token) {
  for (absl::string_view t : absl::StrSplit(list, ',')) {
    if (t == token) return true;
  }
  return false;
}

// The cgroup v2 hierarchy and the v1 hierarchy with `controller` that both
// files name (either may be missing).
std::vector<Hierarchy> Hierarchies(absl::string_view mountinfo, absl::string_view self_cgroup,
                                   absl::string_view controller) {
  std::optional<std::string> v2_path, v1_path;
  for (absl::string_view line : absl::StrSplit(self_cgroup, '\n')) {
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    if (f[0] == "0" && f[1].empty()) {
      v2_path = std::string(f[2]);
    } else if (HasToken(f[1], controller)) {
      v1_path = std::string(f[2]);
    }
  }
  std::vector<Hierarchy> out;
  for (absl::string_view line : absl::StrSplit(mountinfo, '\n')) {
    // "ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER_OPTIONS"
    std::vector<absl::string_view> halves = absl::StrSplit(line, absl::MaxSplits(" - ", 1));
    if (halves.size() != 2) continue;
    std::vector<absl::string_view> left = absl::StrSplit(halves[0], ' ', absl::SkipEmpty());
    std::vector<absl::string_view> right = absl::StrSplit(halves[1], ' ', absl::SkipEmpty());
    if (left.size() < 5 || right.size() < 3) continue;
    Hierarchy h;
    h.mount_root = std::string(left[3]);
    h.mount_point = std::string(left[4]);
    if (right[0] == "cgroup2" && v2_path) {
      h.v2 = true;
      h.path = *v2_path;
    } else if (right[0] == "cgroup" && v1_path && HasToken(right[2], controller)) {
      h.path = *v1_path;
    } else {
      continue;
    }
    out.push_back(std::move(h));
  }
  return out;
}

// The smallest of `limit_at` over every directory from the process's cgroup
// up to each hierarchy's mount point. `limit_at(h, dir)`: the limit set
// there (value, file name), or nullopt.
using LimitAt =
    std::function<std::optional<std::pair<double, std::string>>(bool v2, const std::string& dir)>;

std::optional<CgroupLimit> TightestLimit(absl::string_view mountinfo,
                                         absl::string_view self_cgroup,
                                         absl::string_view controller, const std::string& fs_root,
                                         const LimitAt& limit_at) {
  std::optional<CgroupLimit> best;
  for (const Hierarchy& h : Hierarchies(mountinfo, self_cgroup, controller)) {
    // The process's cgroup below the mount's root (inside a cgroup
    // namespace, or where the mount's root is the process's own cgroup, the
    // mount point itself).
    absl::string_view rel = h.path;
    if (h.mount_root != "/" && !absl::ConsumePrefix(&rel, h.mount_root)) rel = "";
    rel = absl::StripPrefix(rel, "/");
    std::string dir = h.mount_point;
    if (!rel.empty()) absl::StrAppend(&dir, "/", rel);
    while (true) {
      if (auto at = limit_at(h.v2, fs_root + dir); at && (!best || at->first < best->value)) {
        best = CgroupLimit{at->first, absl::StrCat(dir, "/", at->second)};
      }
      if (dir.size() <= h.mount_point.size()) break;
      dir.resize(dir.rfind('/'));
      if (dir.size() < h.mount_point.size()) break;
    }
  }
  return best;
}

}  // namespace

std::optional<CgroupLimit> ReadCgroupCpuLimit(absl::string_view mountinfo,
                                              absl::string_view self_cgroup,
                                              const std::string& fs_root) {
  return TightestLimit(
      mountinfo, self_cgroup, "cpu", fs_root,
      [](bool v2, const std::string& dir) -> std::optional<std::pair<double, std::string>> {
        double quota = 0, period = 0;
        if (v2) {
          // "max 100000", or "QUOTA PERIOD".
          std::vector<std::string> f =
              absl::StrSplit(absl::StripAsciiWhitespace(ReadSmallFile(dir + "/cpu.max")), ' ',
                             absl::SkipEmpty());
          if (f.size() != 2 || !absl::SimpleAtod(f[0], &quota) ||
              !absl::SimpleAtod(f[1], &period)) {
            return std::nullopt;
          }
        } else {
          const auto q = ReadNumber(dir + "/cpu.cfs_quota_us");   // -1: none
          const auto p = ReadNumber(dir + "/cpu.cfs_period_us");
          if (!q || !p) return std::nullopt;
          quota = *q;
          period = *p;
        }
        if (!(quota > 0 && period > 0)) return std::nullopt;
        return std::make_pair(quota / period, v2 ? "cpu.max" : "cpu.cfs_quota_us");
      });
}

std::optional<CgroupLimit> ReadCgroupMemoryLimit(absl::string_view mountinfo,
                                                 absl::string_view self_cgroup,
                                                 const std::string& fs_root) {
  return TightestLimit(
      mountinfo, self_cgroup, "memory", fs_root,
      [](bool v2, const std::string& dir) -> std::optional<std::pair<double, std::string>> {
        // v2: "max" or bytes; v1: bytes, a page-rounded INT64_MAX for none.
        const char* file = v2 ? "memory.max" : "memory.limit_in_bytes";
        const auto bytes = ReadNumber(absl::StrCat(dir, "/", file));
        if (!bytes || !(*bytes > 0) || *bytes >= 0x1p62) return std::nullopt;
        return std::make_pair(*bytes, std::string(file));
      });
}

CoreCount UsableCores() {
  CoreCount c;
  c.online = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  c.usable = c.online;
  // The affinity mask, sized for every CPU the kernel may number.
  const long configured = std::max<long>(c.online, sysconf(_SC_NPROCESSORS_CONF));
  const int max_cpus = static_cast<int>(std::max(1024L, configured));
  cpu_set_t* set = CPU_ALLOC(max_cpus);
  if (set != nullptr) {
    const size_t size = CPU_ALLOC_SIZE(max_cpus);
    CPU_ZERO_S(size, set);
    if (sched_getaffinity(0, size, set) == 0) {
      const int allowed = CPU_COUNT_S(size, set);
      if (allowed > 0 && allowed < c.usable) {
        c.usable = allowed;
        c.limit = absl::StrCat("its CPU affinity allows ", allowed);
      }
    }
    CPU_FREE(set);
  }
  const std::optional<CgroupLimit> limit =
      ReadCgroupCpuLimit(ReadSmallFile("/proc/self/mountinfo"), ReadSmallFile("/proc/self/cgroup"));
  if (limit) {
    const int cores = std::max(1, static_cast<int>(std::ceil(limit->value - 1e-9)));
    if (cores < c.usable) {
      c.usable = cores;
      c.limit = absl::StrFormat("its cgroup's CPU limit is %g core%s (%s)", limit->value,
                                limit->value == 1 ? "" : "s", limit->file);
    }
  }
  return c;
}

MemoryAmount UsableMemory() {
  MemoryAmount m;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) m.physical = int64_t{pages} * page;
  m.usable = m.physical;
  const std::optional<CgroupLimit> limit = ReadCgroupMemoryLimit(
      ReadSmallFile("/proc/self/mountinfo"), ReadSmallFile("/proc/self/cgroup"));
  if (limit && (m.usable == 0 || limit->value < static_cast<double>(m.usable))) {
    m.usable = static_cast<int64_t>(limit->value);
    m.limit = absl::StrCat("its cgroup's memory limit is ", m.usable, " bytes (", limit->file, ")");
  }
  return m;
}

}  // namespace towerps::common
