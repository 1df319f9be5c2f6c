#include "common/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"

namespace towerps::common {
namespace {

using Schedule = v1::LearningRateSchedule;

constexpr double kPi = 3.14159265358979323846;

}  // namespace

double LearningRateAt(const v1::OptimizerSpec& spec, int64_t step) {
  const Schedule& sched = spec.schedule();
  const double lr = spec.learning_rate();
  const int64_t s = std::max<int64_t>(step, 0);
  const int64_t warmup = sched.warmup_steps();
  if (s < warmup) {
    return lr * static_cast<double>(s + 1) / static_cast<double>(warmup);
  }
  const int64_t t = s - std::max<int64_t>(warmup, 0);
  const int64_t d = sched.decay_steps();
  // d <= 0 is invalid for the decays and "not filled in yet" for COSINE:
  // constant rather than a division by zero.
  if (d <= 0) return lr;
  const double rate = sched.decay_rate();
  switch (sched.type()) {
    case Schedule::STEP_DECAY:
      return lr * std::pow(rate, static_cast<double>(t / d));
    case Schedule::EXPONENTIAL_DECAY:
      return lr * std::pow(rate, static_cast<double>(t) / static_cast<double>(d));
    case Schedule::COSINE: {
      const double alpha = sched.alpha();
      const double progress =
          static_cast<double>(std::min(t, d)) / static_cast<double>(d);
      return lr * (alpha + (1.0 - alpha) * 0.5 * (1.0 + std::cos(kPi * progress)));
    }
    default:
      return lr;
  }
}

absl::Status ValidateSchedule(const v1::OptimizerSpec& spec) {
  const float wd = spec.weight_decay();
  if (!(wd >= 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer.weight_decay must be >= 0, got ", wd));
  }
  if (!std::isfinite(wd)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer.weight_decay must be finite, got ", wd));
  }
  const Schedule& sched = spec.schedule();
  if (!Schedule::Type_IsValid(sched.type())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer.schedule.type ", static_cast<int>(sched.type()), " is unknown"));
  }
  if (sched.warmup_steps() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer.schedule.warmup_steps must be >= 0, got ", sched.warmup_steps()));
  }
  const std::string type_name = Schedule::Type_Name(sched.type());
  switch (sched.type()) {
    case Schedule::STEP_DECAY:
    case Schedule::EXPONENTIAL_DECAY:
      if (sched.decay_steps() <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("optimizer.schedule.decay_steps must be > 0 for ", type_name,
                         ", got ", sched.decay_steps()));
      }
      if (!(sched.decay_rate() > 0.0f && sched.decay_rate() <= 1.0f)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "optimizer.schedule.decay_rate must be in (0, 1], got ", sched.decay_rate()));
      }
      break;
    case Schedule::COSINE:
      if (sched.decay_steps() < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("optimizer.schedule.decay_steps must be >= 0 for COSINE, got ",
                         sched.decay_steps()));
      }
      if (!(sched.alpha() >= 0.0f && sched.alpha() <= 1.0f)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "optimizer.schedule.alpha must be in [0, 1], got ", sched.alpha()));
      }
      break;
    default:
      break;
  }
  return absl::OkStatus();
}

}  // namespace towerps::common
