#include "common/process_cpu.h"

#include <sched.h>
#include <sys/resource.h>

namespace towerps::common {

CpuTime ProcessCpuTime() {
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) != 0) return CpuTime();
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
  return CpuTime{seconds(u.ru_utime), seconds(u.ru_stime)};
}

bool SharesCpusWith(pid_t other) {
  if (other <= 0) return true;  // 0 would name the calling thread itself
  cpu_set_t mine, theirs;
  CPU_ZERO(&mine);
  CPU_ZERO(&theirs);
  if (sched_getaffinity(0, sizeof(mine), &mine) != 0 ||
      sched_getaffinity(other, sizeof(theirs), &theirs) != 0) {
    return true;
  }
  cpu_set_t both;
  CPU_AND(&both, &mine, &theirs);
  return CPU_COUNT(&both) > 0;
}

}  // namespace towerps::common
