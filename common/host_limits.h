// What of the host this process may use: its cores and its memory. A
// process in a container, a Slurm allocation or under taskset may use less
// than the machine has, and sizing thread teams or memory budgets from the
// machine overcommits it:
// - cores: the host's online CPUs, fewer where the process's CPU affinity
//   allows fewer (taskset; a cpuset, as Slurm and `docker run
//   --cpuset-cpus` bind tasks) or its cgroup's CPU bandwidth limit allows
//   less time (cgroup v2 cpu.max, v1 cpu.cfs_quota_us: `docker run --cpus`,
//   Kubernetes CPU limits). A math team wider than the cores it may run on
//   waits at every barrier for a member that has no CPU (a worker bound to 1
//   of 2 CPUs ran the MLP at 32 ms a step with 2 threads beside a busy
//   process, 3.8 ms with one);
// - memory: the host's physical memory, less where the cgroup's memory limit
//   is lower (v2 memory.max, v1 memory.limit_in_bytes: `docker run
//   --memory`, Kubernetes memory limits), so that a budget taken as a share
//   of it refuses a job cleanly instead of the kernel killing the process.
// Limits are read along the process's cgroup path up to the hierarchy's
// root: an ancestor's limit binds too.
//
// Thread-safe.
#ifndef TOWERPS_COMMON_HOST_LIMITS_H_
#define TOWERPS_COMMON_HOST_LIMITS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace towerps::common {

struct CoreCount {
  int usable = 1;     // Whole cores, at least 1; a fractional limit rounds up.
  int online = 1;     // The host's online CPUs.
  std::string limit;  // What made usable < online, for logs; empty if nothing.
};

// This process's, read now (affinity of the calling thread, which threads it
// starts inherit).
CoreCount UsableCores();

struct MemoryAmount {
  int64_t usable = 0;    // Bytes; 0 where even the host's cannot be read.
  int64_t physical = 0;  // The host's physical memory.
  std::string limit;     // What made usable < physical, for logs; empty if nothing.
};

MemoryAmount UsableMemory();

// A limit read from a cgroup file.
struct CgroupLimit {
  double value = 0;  // CPU: cores (quota / period); memory: bytes
  std::string file;  // where it was read
};

// The tightest limit on the cgroup that `self_cgroup` (the text of
// /proc/self/cgroup) names for this process, or on an ancestor; nullopt
// where none is set or none can be read. `mountinfo` is the text of
// /proc/self/mountinfo (where each hierarchy is mounted); `fs_root` is put
// before every path read (a test's tree; "" for the real one).
std::optional<CgroupLimit> ReadCgroupCpuLimit(absl::string_view mountinfo,
                                              absl::string_view self_cgroup,
                                              const std::string& fs_root = "");
std::optional<CgroupLimit> ReadCgroupMemoryLimit(absl::string_view mountinfo,
                                                 absl::string_view self_cgroup,
                                                 const std::string& fs_root = "");

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_HOST_LIMITS_H_
