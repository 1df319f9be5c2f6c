#include "common/process_cpu.h"

#include <sys/resource.h>

namespace towerps::common {

CpuTime ProcessCpuTime() {
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) != 0) return CpuTime();
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
  return CpuTime{seconds(u.ru_utime), seconds(u.ru_stime)};
}

}  // namespace towerps::common
