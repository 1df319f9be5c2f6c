// The losses' arithmetic on raw host buffers: the CPU backend's Loss() and
// the reference the CUDA kernels follow line by line (same formulas, same
// double accumulations). Inputs are trusted: labels in range, sizes matching
// (worker/model/losses.h validates). Knows nothing of the Backend: the CPU
// backend calls it, and the CUDA kernels share its per-row functions
// (worker/device/loss_rows.h).
#ifndef TOWERPS_WORKER_DEVICE_LOSS_KERNELS_H_
#define TOWERPS_WORKER_DEVICE_LOSS_KERNELS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "worker/device/loss_kind.h"

namespace towerps::worker {

// See Backend::Loss. `labels` are class indices stored as floats; `targets`
// [n, d]; `dpred` may be null. Adds nothing to a non-zero `out`: it is
// overwritten. InvalidArgument for an unknown loss kind and for softmax
// cross-entropy over no classes (d == 0 with n > 0).
absl::Status HostLoss(LossKind kind, int64_t n, int64_t d,
                      const float* pred, const float* labels,
                      const float* targets, float* dpred, int64_t grad_count,
                      LossResult* out);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_DEVICE_LOSS_KERNELS_H_
