#include "ps/optimizer.h"

#include <cblas.h>

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace towerps::ps {
namespace {

class Sgd : public Optimizer {
 public:
  explicit Sgd(float lr) : lr_(lr) {}
  void Apply(absl::Span<float> value, absl::Span<const float> grad,
             int64_t) override {
    cblas_saxpy(static_cast<int>(value.size()), -lr_, grad.data(), 1,
                value.data(), 1);
  }
  int64_t slot_bytes() const override { return 0; }

 private:
  const float lr_;
};

// Keras/TF semantics: v = m*v - lr*g; w += v (Nesterov: w += m*v - lr*g).
class Momentum : public Optimizer {
 public:
  Momentum(float lr, float m, bool nesterov, int64_t n)
      : lr_(lr), m_(m), nesterov_(nesterov), velocity_(n, 0.0f) {}
  void Apply(absl::Span<float> value, absl::Span<const float> grad,
             int64_t) override {
    float* v = velocity_.data();
    float* w = value.data();
    const float* g = grad.data();
    const int64_t n = static_cast<int64_t>(value.size());
    if (nesterov_) {
      for (int64_t i = 0; i < n; ++i) {
        v[i] = m_ * v[i] - lr_ * g[i];
        w[i] += m_ * v[i] - lr_ * g[i];
      }
    } else {
      for (int64_t i = 0; i < n; ++i) {
        v[i] = m_ * v[i] - lr_ * g[i];
        w[i] += v[i];
      }
    }
  }
  int64_t slot_bytes() const override { return velocity_.size() * sizeof(float); }

 private:
  const float lr_, m_;
  const bool nesterov_;
  std::vector<float> velocity_;
};

// Kingma & Ba with TF's formulation of the bias correction:
// lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t); w -= lr_t * m / (sqrt(v) + eps).
class Adam : public Optimizer {
 public:
  Adam(float lr, float b1, float b2, float eps, int64_t n)
      : lr_(lr), b1_(b1), b2_(b2), eps_(eps), m_(n, 0.0f), v_(n, 0.0f) {}
  void Apply(absl::Span<float> value, absl::Span<const float> grad,
             int64_t step) override {
    const double t = static_cast<double>(step);
    const float lr_t = static_cast<float>(lr_ * std::sqrt(1.0 - std::pow(b2_, t)) /
                                          (1.0 - std::pow(b1_, t)));
    float* m = m_.data();
    float* v = v_.data();
    float* w = value.data();
    const float* g = grad.data();
    const float b1 = b1_, b2 = b2_, eps = eps_;
    const int64_t n = static_cast<int64_t>(value.size());
    for (int64_t i = 0; i < n; ++i) {
      m[i] = b1 * m[i] + (1.0f - b1) * g[i];
      v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
      w[i] -= lr_t * m[i] / (std::sqrt(v[i]) + eps);
    }
  }
  int64_t slot_bytes() const override {
    return (m_.size() + v_.size()) * sizeof(float);
  }

 private:
  const float lr_, b1_, b2_, eps_;
  std::vector<float> m_, v_;
};

}  // namespace

v1::OptimizerSpec OptimizerWithDefaults(const v1::OptimizerSpec& in) {
  v1::OptimizerSpec s = in;
  if (s.type() == v1::OptimizerSpec::OPTIMIZER_UNSPECIFIED) {
    s.set_type(v1::OptimizerSpec::SGD);
  }
  if (s.learning_rate() == 0.0f) {
    s.set_learning_rate(s.type() == v1::OptimizerSpec::ADAM ? 0.001f : 0.01f);
  }
  if (s.type() == v1::OptimizerSpec::MOMENTUM && s.momentum() == 0.0f) {
    s.set_momentum(0.9f);
  }
  if (s.type() == v1::OptimizerSpec::ADAM) {
    if (s.beta1() == 0.0f) s.set_beta1(0.9f);
    if (s.beta2() == 0.0f) s.set_beta2(0.999f);
    if (s.epsilon() == 0.0f) s.set_epsilon(1e-7f);
  }
  return s;
}

absl::Status ValidateOptimizer(const v1::OptimizerSpec& in) {
  v1::OptimizerSpec s = OptimizerWithDefaults(in);
  auto bad = [](const std::string& field, float v, const std::string& want) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer.", field, " = ", v, " is invalid (want ", want, ")"));
  };
  if (!v1::OptimizerSpec::Type_IsValid(s.type())) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer.type ", static_cast<int>(s.type()), " is unknown"));
  }
  if (!(s.learning_rate() > 0.0f) || !std::isfinite(s.learning_rate())) {
    return bad("learning_rate", s.learning_rate(), "> 0");
  }
  if (!(s.momentum() >= 0.0f && s.momentum() < 1.0f)) return bad("momentum", s.momentum(), "[0, 1)");
  if (!(s.beta1() >= 0.0f && s.beta1() < 1.0f)) return bad("beta1", s.beta1(), "[0, 1)");
  if (!(s.beta2() >= 0.0f && s.beta2() < 1.0f)) return bad("beta2", s.beta2(), "[0, 1)");
  if (s.type() == v1::OptimizerSpec::ADAM && !(s.epsilon() > 0.0f)) {
    return bad("epsilon", s.epsilon(), "> 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Optimizer>> NewOptimizer(
    const v1::OptimizerSpec& in, int64_t num_elements) {
  TOWERPS_RETURN_IF_ERROR(ValidateOptimizer(in));
  const v1::OptimizerSpec s = OptimizerWithDefaults(in);
  switch (s.type()) {
    case v1::OptimizerSpec::MOMENTUM:
      return std::unique_ptr<Optimizer>(
          new Momentum(s.learning_rate(), s.momentum(), s.nesterov(), num_elements));
    case v1::OptimizerSpec::ADAM:
      return std::unique_ptr<Optimizer>(new Adam(
          s.learning_rate(), s.beta1(), s.beta2(), s.epsilon(), num_elements));
    default:
      return std::unique_ptr<Optimizer>(new Sgd(s.learning_rate()));
  }
}

}  // namespace towerps::ps
