#include "worker/device/loss_kernels.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/device/loss_rows.h"

namespace towerps::worker {
namespace {

void SoftmaxCrossEntropy(int64_t n, int64_t c, const float* z,
                         const float* labels, float* dz, int64_t grad_count,
                         LossResult* out) {
  const double inv_n = 1.0 / static_cast<double>(grad_count);
  for (int64_t i = 0; i < n; ++i) {
    bool correct = false;
    out->loss_sum += SoftmaxCrossEntropyRow(c, z + i * c, static_cast<int64_t>(labels[i]),
                                            inv_n, dz != nullptr ? dz + i * c : nullptr,
                                            &correct);
    if (correct) ++out->correct;
  }
}

// MSE and MAE: both a per-example mean over the output dimension.
void Regression(bool absolute, int64_t n, int64_t d, const float* p,
                const float* t, float* dp, int64_t grad_count,
                LossResult* out) {
  // d(sum over examples of mean over d)/dp / grad_count.
  const double inv_nd =
      d > 0 ? 1.0 / (static_cast<double>(grad_count) * static_cast<double>(d))
            : 0.0;
  const double inv_d = d > 0 ? 1.0 / static_cast<double>(d) : 0.0;
  for (int64_t i = 0; i < n; ++i) {
    out->loss_sum += RegressionRow(absolute, d, p + i * d, t + i * d, inv_d, inv_nd,
                                   dp != nullptr ? dp + i * d : nullptr);
  }
}

}  // namespace

absl::Status HostLoss(LossKind kind, int64_t n, int64_t d,
                      const float* pred, const float* labels,
                      const float* targets, float* dpred, int64_t grad_count,
                      LossResult* out) {
  *out = LossResult();
  if (grad_count <= 0) grad_count = std::max<int64_t>(n, 1);
  switch (kind) {
    case LossKind::kSoftmaxCrossEntropy:
      // No class a label could name: the row function would read logits of
      // an empty row. (An empty batch is fine at any width.)
      if (n > 0 && d == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "loss: softmax cross-entropy over 0 classes (logits [", n, ", 0])"));
      }
      SoftmaxCrossEntropy(n, d, pred, labels, dpred, grad_count, out);
      return absl::OkStatus();
    case LossKind::kMse:
      Regression(/*absolute=*/false, n, d, pred, targets, dpred, grad_count, out);
      return absl::OkStatus();
    case LossKind::kMae:
      Regression(/*absolute=*/true, n, d, pred, targets, dpred, grad_count, out);
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("loss: unknown loss kind ", static_cast<int>(kind)));
}

}  // namespace towerps::worker
