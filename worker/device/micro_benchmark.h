// What the device room's micro-benchmarks (conv_benchmark, pool_benchmark,
// batch_norm_benchmark) share: a median timer and exiting on an error.
//
// Thread-compatible: nothing is shared between calls.
#ifndef TOWERPS_WORKER_DEVICE_MICRO_BENCHMARK_H_
#define TOWERPS_WORKER_DEVICE_MICRO_BENCHMARK_H_

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"

namespace towerps::worker {

// Calls f() 3 times untimed (primitive creation, caches), then `reps` times
// timed, and returns the median call's milliseconds. REQUIRES: reps >= 1.
double MedianMs(int reps, absl::FunctionRef<void()> f);

// Unless `status` is OK, prints "<program>: <status>" on stderr and exits
// with status 1.
void ExitUnlessOk(const char* program, const absl::Status& status);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_DEVICE_MICRO_BENCHMARK_H_
