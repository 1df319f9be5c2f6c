// The CPU time this process has used, as the kernel counts it
// (getrusage(RUSAGE_SELF): every thread, user and system), for the servers'
// and workers' logs and the step breakdown benchmark: CPU seconds over wall
// seconds is how many cores a process kept busy. And whether two threads
// may run on the same CPUs (SharesCpusWith), for a server deciding whether
// work it could do ahead would compete with a worker on the same host.
//
// Thread-safe.
#ifndef TOWERPS_COMMON_PROCESS_CPU_H_
#define TOWERPS_COMMON_PROCESS_CPU_H_

#include <sys/types.h>

namespace towerps::common {

struct CpuTime {
  double user_s = 0;
  double system_s = 0;
  double total_s() const { return user_s + system_s; }
};

// Since the process started; zeros where it cannot be read.
CpuTime ProcessCpuTime();

// Whether thread `other` (a process id names its main thread) may run on
// any CPU the calling thread may run on, as their affinity masks say
// (sched_getaffinity: taskset, a cgroup's cpuset). True where either
// cannot be read (`other` gone or not positive, more CPUs than a cpu_set_t
// holds): nothing known apart.
bool SharesCpusWith(pid_t other);

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_PROCESS_CPU_H_
