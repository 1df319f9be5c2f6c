// The losses' arithmetic on raw host buffers: the CPU backend's Loss() and
// the reference the CUDA kernels follow line by line (same formulas, same
// double accumulations). Inputs are trusted: labels in range, sizes matching
// (worker/model/losses.h validates).
#ifndef TOWERPS_WORKER_DEVICE_LOSS_KERNELS_H_
#define TOWERPS_WORKER_DEVICE_LOSS_KERNELS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "proto/job.pb.h"
#include "worker/device/backend.h"

namespace towerps::worker {

// See Backend::Loss. `labels` are class indices stored as floats; `targets`
// [n, d]; `dpred` may be null. Adds nothing to a non-zero `out`: it is
// overwritten. InvalidArgument for an unknown loss type.
absl::Status HostLoss(v1::LossType type, int64_t n, int64_t d,
                      const float* pred, const float* labels,
                      const float* targets, float* dpred, int64_t grad_count,
                      LossResult* out);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_DEVICE_LOSS_KERNELS_H_
