// The process's own memory, as the kernel counts it (/proc/self/status), for
// the servers' and workers' logs and the memory benchmarks.
//
// Thread-safe.
#ifndef TOWERPS_COMMON_PROCESS_MEMORY_H_
#define TOWERPS_COMMON_PROCESS_MEMORY_H_

#include <cstdint>

namespace towerps::common {

// Peak resident set size (VmHWM) in bytes; -1 where it cannot be read.
int64_t PeakResidentBytes();

// Resident set size now (VmRSS) in bytes; -1 where it cannot be read.
int64_t ResidentBytes();

// Of the resident set now, the pages of shared memory (tmpfs, memfds, SysV
// shm) this process maps (RssShmem), in bytes; -1 where it cannot be read.
// They count in VmRSS and VmHWM, whoever owns them.
int64_t SharedResidentBytes();

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_PROCESS_MEMORY_H_
