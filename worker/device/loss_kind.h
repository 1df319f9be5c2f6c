// Which loss a backend computes and what it reports: the device room's own
// vocabulary for losses, so that neither the backends nor the loss kernels
// depend on the job spec (worker/model/losses.h converts v1::LossType).
#ifndef TOWERPS_WORKER_DEVICE_LOSS_KIND_H_
#define TOWERPS_WORKER_DEVICE_LOSS_KIND_H_

#include <cstdint>

namespace towerps::worker {

enum class LossKind {
  // -log(softmax(logits)[label]); labels are class indices.
  kSoftmaxCrossEntropy,
  // Mean over the output dimension of (pred - target)^2.
  kMse,
  // Mean over the output dimension of |pred - target|.
  kMae,
};

// "softmax_cross_entropy", "mse", "mae" (for logs and test names);
// "unknown" for any other value.
inline const char* LossKindName(LossKind kind) {
  switch (kind) {
    case LossKind::kSoftmaxCrossEntropy:
      return "softmax_cross_entropy";
    case LossKind::kMse:
      return "mse";
    case LossKind::kMae:
      return "mae";
  }
  return "unknown";
}

struct LossResult {
  // Sum over the batch of per-example losses.
  double loss_sum = 0.0;
  // Examples whose argmax prediction equals the label (classification only;
  // always 0 for MSE and MAE). Ties go to the lowest index.
  int64_t correct = 0;
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_DEVICE_LOSS_KIND_H_
