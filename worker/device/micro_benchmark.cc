#include "worker/device/micro_benchmark.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace towerps::worker {

double MedianMs(int reps, absl::FunctionRef<void()> f) {
  for (int i = 0; i < 3; ++i) f();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const absl::Time start = absl::Now();
    f();
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
  }
  std::nth_element(ms.begin(), ms.begin() + reps / 2, ms.end());
  return ms[reps / 2];
}

void ExitUnlessOk(const char* program, const absl::Status& status) {
  if (status.ok()) return;
  std::fprintf(stderr, "%s: %s\n", program, status.ToString().c_str());
  std::exit(1);
}

}  // namespace towerps::worker
