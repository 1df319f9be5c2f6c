#include "worker/model/reference_model.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace towerps::worker {
namespace {

// Row-major [rows, cols] values with their magnitudes.
struct Mat {
  int64_t rows = 0, cols = 0;
  std::vector<double> v, m;
  Mat() = default;
  Mat(int64_t r, int64_t c) : rows(r), cols(c), v(r * c, 0.0), m(r * c, 0.0) {}
};

struct DenseRef {
  int64_t in = 0, units = 0;
  bool relu = false;
  int kernel_var = -1, bias_var = -1;  // indices into the weights, -1 absent
};

}  // namespace

double FloatGamma(int64_t n) {
  const double u = std::ldexp(1.0, -24);
  return n * u / (1.0 - n * u);
}

absl::StatusOr<ReferenceGradients> ComputeReferenceGradients(
    const v1::ModelSpec& spec, const std::vector<common::Tensor*>& weights, const Batch& batch) {
  // The layers as (dense | relu) steps; a RELU_LAYER is a relu on the
  // previous width.
  std::vector<DenseRef> steps;
  int64_t width = spec.input_dim();
  int var = 0;
  for (const auto& l : spec.layers()) {
    if (l.type() == v1::LayerSpec::RELU_LAYER) {
      steps.push_back({width, width, true, -1, -1});
      continue;
    }
    if (l.type() != v1::LayerSpec::DENSE) {
      return absl::InvalidArgumentError(absl::StrCat("reference: layer type ", l.type()));
    }
    DenseRef d{width, l.units(), l.activation() == v1::RELU, var++, -1};
    if (!l.no_bias()) d.bias_var = var++;
    steps.push_back(d);
    width = l.units();
  }
  if (var != static_cast<int>(weights.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("reference: ", weights.size(), " weights for ", var, " variables"));
  }
  const int64_t n = batch.size();
  if (n == 0 || batch.features.dim(1) != spec.input_dim()) {
    return absl::InvalidArgumentError("reference: features do not fit the model");
  }

  ReferenceGradients ref;
  for (const DenseRef& d : steps) {
    if (d.kernel_var >= 0) ref.roundings += d.in + d.units + 1;
  }
  ref.roundings += n + 4;
  const double gamma = FloatGamma(ref.roundings);
  for (common::Tensor* w : weights) {
    ref.value.emplace_back(w->num_elements(), 0.0);
    ref.magnitude.emplace_back(w->num_elements(), 0.0);
  }

  // Forward: acts[i] is step i's input; masks[i] its ReLU mask.
  std::vector<Mat> acts;
  std::vector<std::vector<bool>> masks(steps.size());
  Mat x(n, spec.input_dim());
  for (int64_t i = 0; i < x.v.size(); ++i) {
    x.v[i] = batch.features[i];
    x.m[i] = std::fabs(x.v[i]);
  }
  for (size_t s = 0; s < steps.size(); ++s) {
    const DenseRef& d = steps[s];
    Mat y(n, d.units);
    if (d.kernel_var < 0) {
      y = x;
    } else {
      const common::Tensor& k = *weights[d.kernel_var];
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t j = 0; j < d.units; ++j) {
          double v = d.bias_var >= 0 ? (*weights[d.bias_var])[j] : 0.0;
          double m = std::fabs(v);
          for (int64_t i = 0; i < d.in; ++i) {
            v += x.v[r * d.in + i] * k[i * d.units + j];
            m += x.m[r * d.in + i] * std::fabs(k[i * d.units + j]);
          }
          y.v[r * d.units + j] = v;
          y.m[r * d.units + j] = m;
        }
      }
    }
    if (d.relu) {
      masks[s].resize(y.v.size());
      for (size_t i = 0; i < y.v.size(); ++i) {
        masks[s][i] = y.v[i] > 0;
        if (std::fabs(y.v[i]) <= gamma * y.m[i]) ++ref.ambiguous;
        if (!masks[s][i]) y.v[i] = y.m[i] = 0;
      }
    }
    acts.push_back(std::move(x));
    x = std::move(y);
  }

  // Loss and its derivative (with respect to the last output, `x`).
  const int64_t d = x.cols;
  Mat dy(n, d);
  const double inv_n = 1.0 / n;
  if (spec.loss() == v1::MSE || spec.loss() == v1::MAE) {
    if (batch.targets.num_elements() != n * d) {
      return absl::InvalidArgumentError("reference: targets do not fit");
    }
    const bool absolute = spec.loss() == v1::MAE;
    for (int64_t r = 0; r < n; ++r) {
      double loss = 0, loss_m = 0;
      for (int64_t j = 0; j < d; ++j) {
        const int64_t i = r * d + j;
        const double t = batch.targets[i], diff = x.v[i] - t, diff_m = x.m[i] + std::fabs(t);
        if (absolute) {
          if (std::fabs(diff) <= gamma * diff_m) ++ref.ambiguous;
          loss += std::fabs(diff);
          loss_m += diff_m;
          dy.v[i] = (diff > 0 ? 1.0 : (diff < 0 ? -1.0 : 0.0)) * inv_n / d;
          dy.m[i] = std::fabs(dy.v[i]);
        } else {
          loss += diff * diff;
          loss_m += 2 * std::fabs(diff) * diff_m;
          dy.v[i] = 2 * diff * inv_n / d;
          dy.m[i] = 2 * diff_m * inv_n / d;
        }
      }
      ref.loss_sum += loss / d;
      ref.loss_magnitude += loss_m / d;
    }
  } else {
    if (static_cast<int64_t>(batch.labels.size()) != n) {
      return absl::InvalidArgumentError("reference: labels do not fit");
    }
    std::vector<double> p(d);
    for (int64_t r = 0; r < n; ++r) {
      const double* z = &x.v[r * d];
      const double* zm = &x.m[r * d];
      const int64_t label = batch.labels[r];
      int64_t top = 0, second = -1;
      for (int64_t j = 1; j < d; ++j) {
        if (z[j] > z[top]) {
          second = top;
          top = j;
        } else if (second < 0 || z[j] > z[second]) {
          second = j;
        }
      }
      if (second >= 0 && z[top] - z[second] <= gamma * (zm[top] + zm[second])) ++ref.ambiguous;
      ref.correct += top == label;
      double sum = 0;
      for (int64_t j = 0; j < d; ++j) sum += std::exp(z[j] - z[top]);
      for (int64_t j = 0; j < d; ++j) p[j] = std::exp(z[j] - z[top]) / sum;
      const double loss = std::log(sum) - (z[label] - z[top]);
      double loss_m = std::fabs(loss);
      for (int64_t j = 0; j < d; ++j) loss_m += std::fabs(p[j] - (j == label)) * zm[j];
      ref.loss_sum += loss;
      ref.loss_magnitude += loss_m;
      // d(loss)/dz_j = p_j - onehot_j; its Jacobian in z is p_i (delta_ij - p_j).
      for (int64_t i = 0; i < d; ++i) {
        dy.v[r * d + i] = (p[i] - (i == label)) * inv_n;
        double m = std::fabs(dy.v[r * d + i]);
        for (int64_t j = 0; j < d; ++j) m += std::fabs(p[i] * ((i == j) - p[j])) * zm[j] * inv_n;
        dy.m[r * d + i] = m;
      }
    }
  }

  // Backward.
  for (size_t s = steps.size(); s-- > 0;) {
    const DenseRef& st = steps[s];
    if (st.relu) {
      for (size_t i = 0; i < dy.v.size(); ++i) {
        if (!masks[s][i]) dy.v[i] = dy.m[i] = 0;
      }
    }
    if (st.kernel_var < 0) continue;
    const Mat& in = acts[s];
    const common::Tensor& k = *weights[st.kernel_var];
    std::vector<double>& kv = ref.value[st.kernel_var];
    std::vector<double>& km = ref.magnitude[st.kernel_var];
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t i = 0; i < st.in; ++i) {
        const double xv = in.v[r * st.in + i], xm = in.m[r * st.in + i];
        for (int64_t j = 0; j < st.units; ++j) {
          kv[i * st.units + j] += xv * dy.v[r * st.units + j];
          km[i * st.units + j] += xm * dy.m[r * st.units + j];
        }
      }
    }
    if (st.bias_var >= 0) {
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t j = 0; j < st.units; ++j) {
          ref.value[st.bias_var][j] += dy.v[r * st.units + j];
          ref.magnitude[st.bias_var][j] += dy.m[r * st.units + j];
        }
      }
    }
    Mat dx(n, st.in);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t i = 0; i < st.in; ++i) {
        double v = 0, m = 0;
        for (int64_t j = 0; j < st.units; ++j) {
          v += dy.v[r * st.units + j] * k[i * st.units + j];
          m += dy.m[r * st.units + j] * std::fabs(k[i * st.units + j]);
        }
        dx.v[r * st.in + i] = v;
        dx.m[r * st.in + i] = m;
      }
    }
    dy = std::move(dx);
  }
  return ref;
}

namespace {

// The float bound plus what the double reference itself may be off by, and
// the smallest float (results below it are flushed or denormal).
double Bound(double magnitude, int64_t roundings) {
  return FloatGamma(roundings) * magnitude + 4.0 * roundings * DBL_EPSILON * magnitude +
         std::numeric_limits<float>::denorm_min();
}

}  // namespace

absl::Status CheckWithinFloatBound(const std::vector<common::Tensor*>& got,
                                   const ReferenceGradients& ref, int64_t extra_roundings) {
  if (got.size() != ref.value.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(got.size(), " variables, the reference has ", ref.value.size()));
  }
  const int64_t roundings = ref.roundings + extra_roundings;
  for (size_t v = 0; v < got.size(); ++v) {
    if (got[v]->num_elements() != static_cast<int64_t>(ref.value[v].size())) {
      return absl::InvalidArgumentError(absl::StrCat("variable ", v, " has ",
                                                     got[v]->num_elements(), " elements"));
    }
    for (int64_t i = 0; i < got[v]->num_elements(); ++i) {
      const double want = ref.value[v][i], bound = Bound(ref.magnitude[v][i], roundings);
      if (std::fabs((*got[v])[i] - want) > bound) {
        return absl::OutOfRangeError(absl::StrCat(
            "variable ", v, " element ", i, " is ", (*got[v])[i], ", exact ", want,
            ", bound ", bound, " (magnitude ", ref.magnitude[v][i], ", ", roundings,
            " roundings)"));
      }
    }
  }
  return absl::OkStatus();
}

void ExpectWithinFloatBound(const std::vector<common::Tensor*>& got,
                            const ReferenceGradients& ref, int64_t extra_roundings,
                            const std::string& what) {
  EXPECT_EQ(ref.ambiguous, 0) << what << ": data too close to a ReLU or arg-max boundary";
  const absl::Status s = CheckWithinFloatBound(got, ref, extra_roundings);
  EXPECT_TRUE(s.ok()) << what << ": " << s;
  double norm = 0;
  for (const auto& v : ref.value) {
    for (double x : v) norm += std::fabs(x);
  }
  EXPECT_GT(norm, 1e-3) << what << ": the gradients are (nearly) all zero";
}

void ExpectLossWithinFloatBound(double got, const ReferenceGradients& ref,
                                int64_t extra_roundings, const std::string& what) {
  EXPECT_LE(std::fabs(got - ref.loss_sum),
            Bound(ref.loss_magnitude, ref.roundings + extra_roundings))
      << what << ": loss " << got << ", exact " << ref.loss_sum;
}

}  // namespace towerps::worker
