#include "worker/loss_kernels.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace towerps::worker {
namespace {

void SoftmaxCrossEntropy(int64_t n, int64_t c, const float* z,
                         const float* labels, float* dz, int64_t grad_count,
                         LossResult* out) {
  const double inv_n = 1.0 / static_cast<double>(grad_count);
  for (int64_t i = 0; i < n; ++i) {
    const float* row = z + i * c;
    const int64_t argmax = std::max_element(row, row + c) - row;
    const double max = row[argmax];
    // Accumulate in double: log-sum-exp of shifted logits, all <= 0.
    double sum = 0.0;
    for (int64_t j = 0; j < c; ++j) sum += std::exp(row[j] - max);
    const int64_t label = static_cast<int64_t>(labels[i]);
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
}

}  // namespace

absl::Status HostLoss(v1::LossType type, int64_t n, int64_t d,
                      const float* pred, const float* labels,
                      const float* targets, float* dpred, int64_t grad_count,
                      LossResult* out) {
  *out = LossResult();
  if (grad_count <= 0) grad_count = std::max<int64_t>(n, 1);
  switch (type) {
    case v1::LOSS_UNSPECIFIED:
    case v1::SOFTMAX_CROSS_ENTROPY:
      SoftmaxCrossEntropy(n, d, pred, labels, dpred, grad_count, out);
      return absl::OkStatus();
    case v1::MSE:
      Regression(/*absolute=*/false, n, d, pred, targets, dpred, grad_count, out);
      return absl::OkStatus();
    case v1::MAE:
      Regression(/*absolute=*/true, n, d, pred, targets, dpred, grad_count, out);
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("loss: unknown loss type ", static_cast<int>(type)));
  }
}

}  // namespace towerps::worker
