#include "worker/losses.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"

namespace towerps::worker {
namespace {

absl::Status SoftmaxCrossEntropy(const common::Tensor& logits,
                                 const Batch& batch, common::Tensor* dlogits,
                                 LossResult* out) {
  const int64_t n = logits.dim(0);
  const int64_t c = logits.dim(1);
  if (static_cast<int64_t>(batch.labels.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "softmax cross-entropy: ", batch.labels.size(), " labels for ", n,
        " rows of logits ", logits.ShapeString()));
  }
  if (n > 0 && c == 0) {
    return absl::InvalidArgumentError(
        "softmax cross-entropy: logits have 0 classes");
  }
  for (int64_t i = 0; i < n; ++i) {
    const int32_t label = batch.labels[i];
    if (label < 0 || label >= c) {
      return absl::InvalidArgumentError(
          absl::StrCat("softmax cross-entropy: label ", label, " of example ",
                       i, " is out of range [0, ", c, ")"));
    }
  }
  const float* z = logits.data();
  float* dz = dlogits != nullptr ? dlogits->data() : nullptr;
  const double inv_n = n > 0 ? 1.0 / static_cast<double>(n) : 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float* row = z + i * c;
    const int64_t argmax = std::max_element(row, row + c) - row;
    const double max = row[argmax];
    // Accumulate in double: log-sum-exp of shifted logits, all <= 0.
    double sum = 0.0;
    for (int64_t j = 0; j < c; ++j) sum += std::exp(row[j] - max);
    const int32_t label = batch.labels[i];
    out->loss_sum += std::log(sum) - (row[label] - max);
    if (argmax == label) ++out->correct;
    if (dz != nullptr) {
      float* drow = dz + i * c;
      for (int64_t j = 0; j < c; ++j) {
        const double p = std::exp(row[j] - max) / sum;
        drow[j] = static_cast<float>((p - (j == label ? 1.0 : 0.0)) * inv_n);
      }
    }
  }
  return absl::OkStatus();
}

// MSE and MAE: both a per-example mean over the output dimension.
absl::Status Regression(bool absolute, const common::Tensor& pred,
                        const Batch& batch, common::Tensor* dpred,
                        LossResult* out) {
  const char* what = absolute ? "MAE" : "MSE";
  if (batch.targets.shape() != pred.shape()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": targets shape ", batch.targets.ShapeString(),
                     " does not match predictions shape ", pred.ShapeString()));
  }
  const int64_t n = pred.dim(0);
  const int64_t d = pred.dim(1);
  const float* p = pred.data();
  const float* t = batch.targets.data();
  float* dp = dpred != nullptr ? dpred->data() : nullptr;
  // d(mean over n of mean over d)/dp = per-element derivative / (n * d).
  const double inv_nd = n * d > 0 ? 1.0 / static_cast<double>(n * d) : 0.0;
  const double inv_d = d > 0 ? 1.0 / static_cast<double>(d) : 0.0;
  for (int64_t i = 0; i < n; ++i) {
    double example = 0.0;
    for (int64_t j = 0; j < d; ++j) {
      const int64_t k = i * d + j;
      const double diff = static_cast<double>(p[k]) - t[k];
      if (absolute) {
        example += std::fabs(diff);
        if (dp != nullptr) {
          const double sign = diff > 0 ? 1.0 : (diff < 0 ? -1.0 : 0.0);
          dp[k] = static_cast<float>(sign * inv_nd);
        }
      } else {
        example += diff * diff;
        if (dp != nullptr) dp[k] = static_cast<float>(2.0 * diff * inv_nd);
      }
    }
    out->loss_sum += example * inv_d;
  }
  return absl::OkStatus();
}

}  // namespace

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
  if (dlogits != nullptr) dlogits->Resize(logits_or_pred.shape());
  switch (type) {
    case v1::LOSS_UNSPECIFIED:
    case v1::SOFTMAX_CROSS_ENTROPY:
      return SoftmaxCrossEntropy(logits_or_pred, batch, dlogits, out);
    case v1::MSE:
      return Regression(/*absolute=*/false, logits_or_pred, batch, dlogits,
                        out);
    case v1::MAE:
      return Regression(/*absolute=*/true, logits_or_pred, batch, dlogits, out);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("loss: unknown loss type ", static_cast<int>(type)));
  }
}

}  // namespace towerps::worker
