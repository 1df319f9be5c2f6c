#include "ps/job_state.h"

#include <cblas.h>

#include <cmath>

namespace towerps::ps::internal {

bool AllFinite(const float* x, int64_t n, double* abs_sum) {
  constexpr int64_t kMaxCall = int64_t{1} << 30;  // sasum counts in int
  for (int64_t first = 0; first < n; first += kMaxCall) {
    const int64_t k = std::min(kMaxCall, n - first);
    const float sum = cblas_sasum(static_cast<int>(k), x + first, 1);
    if (abs_sum != nullptr) *abs_sum += sum;
    if (std::isfinite(sum)) continue;
    for (int64_t i = first; i < first + k; ++i) {
      if (!std::isfinite(x[i])) return false;
    }
  }
  return true;
}

MagnitudeBounds ZeroBounds() {
  MagnitudeBounds b;
  b.value = b.slots[0] = b.slots[1] = 0.0;
  return b;
}

MagnitudeBounds LowerBounds(const MagnitudeBounds& a, const MagnitudeBounds& b) {
  MagnitudeBounds low;
  low.value = std::min(a.value, b.value);
  for (int i = 0; i < 2; ++i) low.slots[i] = std::min(a.slots[i], b.slots[i]);
  return low;
}

absl::Status ValuesChangedError(const Job& job, const v1::PushHeader& h, bool deleted) {
  return absl::AbortedError(absl::StrCat(
      "push: the values of job \"", job.id, "\" changed while the push of worker ",
      h.worker_task(), " (sequence ", h.sequence(), ") arrived",
      deleted ? " (the job was deleted)" : " (another push was applied first)",
      "; nothing applied"));
}

}  // namespace towerps::ps::internal
