// The process's own memory, as the kernel counts it (/proc/self/status), for
// the servers' and workers' logs and the memory benchmarks.
//
// Thread-safe.
#ifndef TOWERPS_COMMON_PROCESS_MEMORY_H_
#define TOWERPS_COMMON_PROCESS_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace towerps::common {

// Peak resident set size (VmHWM) in bytes; -1 where it cannot be read.
int64_t PeakResidentBytes();

// Resident set size now (VmRSS) in bytes; -1 where it cannot be read.
int64_t ResidentBytes();

// Of the resident set now, the pages of shared memory (tmpfs, memfds, SysV
// shm) this process maps (RssShmem), in bytes; -1 where it cannot be read.
// They count in VmRSS and VmHWM, whoever owns them.
int64_t SharedResidentBytes();

// What BackWithHugePages did.
struct HugePages {
  int64_t bytes = 0;  // Of the range, now on huge pages.
  int64_t page = 0;   // The huge page size (2 MiB on x86-64); 0 where unknown.
  std::string error;  // Why some whole huge page of the range is not one
                      // (the first failure); empty where none.
};

// Puts the whole huge pages inside [data, data + bytes) of anonymous memory
// (a std::vector's buffer) on transparent huge pages, for memory read at
// random: a shuffled training set, whose every batch's rows fall on as many
// pages, each a TLB miss on 4 KiB pages. Each is advised MADV_HUGEPAGE (the
// kernel then keeps it so) and collapsed at once, one huge page at a time
// (MADV_COLLAPSE, Linux 6.1 and later: the kernel copies the page's contents,
// unchanged, into a huge page). The ends of the range that fill no huge page
// stay as they are. Where a collapse fails (an older kernel, no huge page
// free, THP disabled) the memory is as it was, and where only the collapse
// is refused, khugepaged may still collapse it later. The contents never
// change, whatever happens. A hint, not a contract: nothing may rely on it.
HugePages BackWithHugePages(void* data, size_t bytes);

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_PROCESS_MEMORY_H_
