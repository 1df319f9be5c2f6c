#include "common/optimizer_spec.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/lr_schedule.h"
#include "common/status.h"

namespace towerps::common {

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
  // The schedule's fields and weight_decay.
  return ValidateSchedule(s);
}

}  // namespace towerps::common
