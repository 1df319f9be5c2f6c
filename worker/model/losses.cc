#include "worker/model/losses.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/device/loss_kernels.h"

namespace towerps::worker {

absl::StatusOr<LossKind> ToLossKind(v1::LossType type) {
  switch (type) {
    case v1::LOSS_UNSPECIFIED:
    case v1::SOFTMAX_CROSS_ENTROPY:
      return LossKind::kSoftmaxCrossEntropy;
    case v1::MSE:
      return LossKind::kMse;
    case v1::MAE:
      return LossKind::kMae;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("loss: unknown loss type ", static_cast<int>(type)));
  }
}

absl::Status ValidateLossInputs(v1::LossType type, int64_t n, int64_t d,
                                const Batch& batch) {
  switch (type) {
    case v1::LOSS_UNSPECIFIED:
    case v1::SOFTMAX_CROSS_ENTROPY: {
      if (static_cast<int64_t>(batch.labels.size()) != n) {
        return absl::InvalidArgumentError(
            absl::StrCat("softmax cross-entropy: ", batch.labels.size(),
                         " labels for ", n, " rows of logits [", n, ",", d, "]"));
      }
      if (n > 0 && d == 0) {
        return absl::InvalidArgumentError(
            "softmax cross-entropy: logits have 0 classes");
      }
      for (int64_t i = 0; i < n; ++i) {
        const int32_t label = batch.labels[i];
        if (label < 0 || label >= d) {
          return absl::InvalidArgumentError(
              absl::StrCat("softmax cross-entropy: label ", label, " of example ",
                           i, " is out of range [0, ", d, ")"));
        }
      }
      return absl::OkStatus();
    }
    case v1::MSE:
    case v1::MAE:
      if (batch.targets.rank() != 2 || batch.targets.dim(0) != n ||
          batch.targets.dim(1) != d) {
        return absl::InvalidArgumentError(absl::StrCat(
            type == v1::MAE ? "MAE" : "MSE", ": targets shape ",
            batch.targets.ShapeString(), " does not match predictions shape [",
            n, ",", d, "]"));
      }
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("loss: unknown loss type ", static_cast<int>(type)));
  }
}

absl::Status ComputeLoss(v1::LossType type,
                         const common::Tensor& logits_or_pred,
                         const Batch& batch, common::Tensor* dlogits,
                         LossResult* out) {
  *out = LossResult();
  if (logits_or_pred.rank() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss: predictions must be rank 2 [n, d], got shape ",
                     logits_or_pred.ShapeString()));
  }
  const int64_t n = logits_or_pred.dim(0);
  const int64_t d = logits_or_pred.dim(1);
  TOWERPS_RETURN_IF_ERROR(ValidateLossInputs(type, n, d, batch));
  TOWERPS_ASSIGN_OR_RETURN(const LossKind kind, ToLossKind(type));
  if (dlogits != nullptr) dlogits->Resize(logits_or_pred.shape());
  std::vector<float> labels(batch.labels.begin(), batch.labels.end());
  return HostLoss(kind, n, d, logits_or_pred.data(), labels.data(),
                  batch.targets.data(),
                  dlogits != nullptr ? dlogits->data() : nullptr, n, out);
}

}  // namespace towerps::worker
