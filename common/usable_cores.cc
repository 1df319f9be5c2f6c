#include "common/usable_cores.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
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

// The cgroup v2 hierarchy and the v1 hierarchy with the cpu controller that
// both files name (either may be missing).
std::vector<Hierarchy> CpuHierarchies(absl::string_view mountinfo,
                                      absl::string_view self_cgroup) {
  std::string v2_path, v1_path;
  bool has_v2 = false, has_v1 = false;
  for (absl::string_view line : absl::StrSplit(self_cgroup, '\n')) {
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    if (f[0] == "0" && f[1].empty()) {
      has_v2 = true;
      v2_path = std::string(f[2]);
    } else if (HasToken(f[1], "cpu")) {
      has_v1 = true;
      v1_path = std::string(f[2]);
    }
  }
  std::vector<Hierarchy> out;
  for (absl::string_view line : absl::StrSplit(mountinfo, '\n')) {
    std::vector<absl::string_view> halves = absl::StrSplit(line, absl::MaxSplits(" - ", 1));
    if (halves.size() != 2) continue;
    std::vector<absl::string_view> left = absl::StrSplit(halves[0], ' ', absl::SkipEmpty());
    std::vector<absl::string_view> right = absl::StrSplit(halves[1], ' ', absl::SkipEmpty());
    if (left.size() < 5 || right.size() < 3) continue;
    Hierarchy h;
    h.mount_root = std::string(left[3]);
    h.mount_point = std::string(left[4]);
    if (right[0] == "cgroup2" && has_v2) {
      h.v2 = true;
      h.path = v2_path;
    } else if (right[0] == "cgroup" && has_v1 && HasToken(right[2], "cpu")) {
      h.path = v1_path;
    } else {
      continue;
    }
    out.push_back(std::move(h));
  }
  return out;
}

// The limit set on one cgroup directory, in cores; nullopt for none.
std::optional<double> LimitAt(const Hierarchy& h, const std::string& dir) {
  if (h.v2) {
    // "max 100000", or "QUOTA PERIOD".
    std::vector<std::string> f =
        absl::StrSplit(absl::StripAsciiWhitespace(ReadSmallFile(dir + "/cpu.max")), ' ',
                       absl::SkipEmpty());
    double quota = 0, period = 0;
    if (f.size() == 2 && absl::SimpleAtod(f[0], &quota) && absl::SimpleAtod(f[1], &period) &&
        quota > 0 && period > 0) {
      return quota / period;
    }
    return std::nullopt;
  }
  double quota = 0, period = 0;  // quota -1: none
  if (absl::SimpleAtod(absl::StripAsciiWhitespace(ReadSmallFile(dir + "/cpu.cfs_quota_us")),
                       &quota) &&
      absl::SimpleAtod(absl::StripAsciiWhitespace(ReadSmallFile(dir + "/cpu.cfs_period_us")),
                       &period) &&
      quota > 0 && period > 0) {
    return quota / period;
  }
  return std::nullopt;
}

}  // namespace

std::optional<CgroupCpuLimit> ReadCgroupCpuLimit(absl::string_view mountinfo,
                                                 absl::string_view self_cgroup,
                                                 const std::string& fs_root) {
  std::optional<CgroupCpuLimit> best;
  for (const Hierarchy& h : CpuHierarchies(mountinfo, self_cgroup)) {
    // The process's cgroup below the mount's root (inside a cgroup
    // namespace the mount's root is the process's own cgroup: "/").
    absl::string_view rel = h.path;
    if (h.mount_root != "/" && !absl::ConsumePrefix(&rel, h.mount_root)) rel = "";
    rel = absl::StripPrefix(rel, "/");
    std::string dir = h.mount_point;
    if (!rel.empty()) absl::StrAppend(&dir, "/", rel);
    // From the process's cgroup up to the mount point: each level's limit
    // applies.
    while (true) {
      const std::optional<double> cores = LimitAt(h, fs_root + dir);
      if (cores && (!best || *cores < best->cores)) {
        best = CgroupCpuLimit{*cores, dir + (h.v2 ? "/cpu.max" : "/cpu.cfs_quota_us")};
      }
      if (dir.size() <= h.mount_point.size()) break;
      dir.resize(dir.rfind('/'));
      if (dir.size() < h.mount_point.size()) break;
    }
  }
  return best;
}

CoreCount UsableCores() {
  CoreCount c;
  c.online = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  c.usable = c.online;
  // The affinity mask, sized for every CPU the kernel may number.
  const long configured = std::max(c.online + 0L, sysconf(_SC_NPROCESSORS_CONF));
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
  const std::optional<CgroupCpuLimit> limit =
      ReadCgroupCpuLimit(ReadSmallFile("/proc/self/mountinfo"), ReadSmallFile("/proc/self/cgroup"));
  if (limit) {
    const int cores = std::max(1, static_cast<int>(std::ceil(limit->cores - 1e-9)));
    if (cores < c.usable) {
      c.usable = cores;
      c.limit = absl::StrFormat("its cgroup's CPU limit is %g core%s (%s)", limit->cores,
                                limit->cores == 1 ? "" : "s", limit->file);
    }
  }
  return c;
}

}  // namespace towerps::common
