// How many cores this process may keep busy: the host's online CPUs, fewer
// where the process's CPU affinity allows fewer (taskset; a cpuset, as Slurm
// and `docker run --cpuset-cpus` bind tasks) or its cgroup's CPU bandwidth
// limit allows less time (cgroup v2 cpu.max, v1 cpu.cfs_quota_us, of its
// cgroup or any ancestor: `docker run --cpus`, Kubernetes CPU limits).
// Math thread teams are sized from it: a team wider than the cores it may
// run on waits at every barrier for a member that has no CPU (a worker bound
// to 1 of 2 CPUs ran the MLP at 28 ms a step with 2 threads).
//
// Thread-safe.
#ifndef TOWERPS_COMMON_USABLE_CORES_H_
#define TOWERPS_COMMON_USABLE_CORES_H_

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

struct CgroupCpuLimit {
  double cores = 0;  // quota / period
  std::string file;  // where it was read
};

// The tightest CPU bandwidth limit on the cgroup that `self_cgroup` (the text
// of /proc/self/cgroup) names for this process, or on an ancestor, in cores;
// nullopt where none is set or none can be read. `mountinfo` is the text of
// /proc/self/mountinfo (where each hierarchy is mounted); `fs_root` is put
// before every path read (a test's tree; "" for the real one).
std::optional<CgroupCpuLimit> ReadCgroupCpuLimit(absl::string_view mountinfo,
                                                 absl::string_view self_cgroup,
                                                 const std::string& fs_root = "");

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_USABLE_CORES_H_
