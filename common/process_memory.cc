#include "common/process_memory.h"

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

}  // namespace

int64_t PeakResidentBytes() { return StatusBytes("VmHWM"); }

int64_t ResidentBytes() { return StatusBytes("VmRSS"); }

int64_t SharedResidentBytes() { return StatusBytes("RssShmem"); }

}  // namespace towerps::common
