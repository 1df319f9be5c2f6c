// The CPU time this process has used, as the kernel counts it
// (getrusage(RUSAGE_SELF): every thread, user and system), for the servers'
// and workers' logs and the step breakdown benchmark: CPU seconds over wall
// seconds is how many cores a process kept busy.
//
// Thread-safe.
#ifndef TOWERPS_COMMON_PROCESS_CPU_H_
#define TOWERPS_COMMON_PROCESS_CPU_H_

namespace towerps::common {

struct CpuTime {
  double user_s = 0;
  double system_s = 0;
  double total_s() const { return user_s + system_s; }
};

// Since the process started; zeros where it cannot be read.
CpuTime ProcessCpuTime();

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_PROCESS_CPU_H_
