#include "common/process_memory.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace towerps::common {

namespace {

// The "<field>:  <n> kB" line of /proc/self/status, in bytes.
int64_t StatusBytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string key = field + ":";
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    std::istringstream fields(line.substr(key.size()));
    int64_t kib = -1;
    std::string unit;
    if (fields >> kib >> unit && unit == "kB") return kib * 1024;
    return -1;
  }
  return -1;
}

// The transparent huge page size the kernel uses, in bytes; 0 where unknown.
int64_t HugePageBytes() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size");
  int64_t bytes = 0;
  if (!(in >> bytes) || bytes <= 0 || (bytes & (bytes - 1)) != 0) return 0;
  return bytes;
}

}  // namespace

HugePages BackWithHugePages(void* data, size_t bytes) {
#ifndef MADV_COLLAPSE
  constexpr int MADV_COLLAPSE = 25;  // Linux 6.1's; older C libraries lack the name
#endif
  HugePages out;
  out.page = HugePageBytes();
  if (out.page == 0) {
    out.error = "the kernel names no transparent huge page size";
    return out;
  }
  const uintptr_t page = static_cast<uintptr_t>(out.page);
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + page - 1) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(page - 1);
  for (uintptr_t p = begin; p < end; p += page) {
    void* at = reinterpret_cast<void*>(p);
    const char* step = "MADV_HUGEPAGE";
    bool ok = madvise(at, page, MADV_HUGEPAGE) == 0;
    if (ok) {
      step = "MADV_COLLAPSE";
      ok = madvise(at, page, MADV_COLLAPSE) == 0;
    }
    if (ok) {
      out.bytes += out.page;
    } else if (out.error.empty()) {
      out.error = std::string(step) + ": " + std::strerror(errno);
    }
  }
  return out;
}

int64_t PeakResidentBytes() { return StatusBytes("VmHWM"); }

int64_t ResidentBytes() { return StatusBytes("VmRSS"); }

int64_t SharedResidentBytes() { return StatusBytes("RssShmem"); }

}  // namespace towerps::common
