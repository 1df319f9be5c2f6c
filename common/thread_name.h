// Names the calling thread, so that per-thread tools (top -H, perf,
// /proc/<pid>/task/*/comm, tests/bench/thread_cpu.py) tell a process's own
// threads apart from its libraries' pools. Threads inherit their creator's
// name, so a thread started from a gRPC handler would otherwise be called
// after gRPC's.
//
// Thread-safe: names only the calling thread.
#ifndef TOWERPS_COMMON_THREAD_NAME_H_
#define TOWERPS_COMMON_THREAD_NAME_H_

#include <string>

#include "absl/strings/string_view.h"

namespace towerps::common {

// Linux keeps at most 15 bytes of a name: longer names are cut there. Best
// effort: a failure leaves the old name.
void SetCurrentThreadName(absl::string_view name);

// The calling thread's name ("" if it cannot be read).
std::string CurrentThreadName();

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_THREAD_NAME_H_
