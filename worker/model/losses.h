// Loss functions over a batch: the loss value, the number of correct
// predictions, and the gradient that starts backpropagation.
//
// Semantics follow Keras: a per-example loss, and the training objective is
// the MEAN of per-example losses over the batch. The returned gradient is the
// gradient of that mean; the returned loss is the SUM of per-example losses,
// so that callers can average correctly across batches of different sizes.
//
// LossKind and LossResult are declared in worker/device/loss_kind.h (every
// backend computes losses); this is the host entry point, on host tensors, the
// validation every backend relies on, and the conversion from the job spec's
// v1::LossType.
#ifndef TOWERPS_WORKER_MODEL_LOSSES_H_
#define TOWERPS_WORKER_MODEL_LOSSES_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "proto/job.pb.h"
#include "worker/device/loss_kind.h"
#include "worker/model/batch.h"

namespace towerps::worker {

// The backends' loss for `type`: SOFTMAX_CROSS_ENTROPY and LOSS_UNSPECIFIED
// (its default) are kSoftmaxCrossEntropy, MSE kMse, MAE kMae.
// InvalidArgument for any other value.
absl::StatusOr<LossKind> ToLossKind(v1::LossType type);

// Computes `type`'s loss of `logits_or_pred` ([n, d]) against `batch`.
//
//  - SOFTMAX_CROSS_ENTROPY (and LOSS_UNSPECIFIED, its default):
//    per-example loss -log(softmax(logits)[label]) over d classes, with
//    integer labels from batch.labels (n of them, each in [0, d)). Computed
//    stably (the row max is subtracted before exponentiating).
//  - MSE: per-example mean over d of (pred - target)^2; batch.targets [n, d].
//  - MAE: per-example mean over d of |pred - target|; batch.targets [n, d].
//    The gradient at pred == target is taken as 0.
//
// If `dlogits` is non-null it is resized to [n, d] and receives
// d(mean over the batch of per-example losses)/d(logits_or_pred); pass null
// for evaluation. batch.features is not read. n == 0 gives a zero result.
//
// Returns InvalidArgument, naming what was wrong, when logits_or_pred is not
// rank 2, the label count or targets shape does not match, a label is out of
// range, or `type` is not a known loss. On error `*out` and `*dlogits` are
// unspecified.
// The checks ComputeLoss makes before computing, for `n` rows of width `d`:
// labels count and range (classification), targets shape [n, d] (MSE, MAE),
// a known loss type. Backends trust their inputs; callers validate with this.
absl::Status ValidateLossInputs(v1::LossType type, int64_t n, int64_t d,
                                const Batch& batch);

absl::Status ComputeLoss(v1::LossType type,
                         const common::Tensor& logits_or_pred,
                         const Batch& batch, common::Tensor* dlogits,
                         LossResult* out);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_MODEL_LOSSES_H_
