// The learning rate as a function of the global step (OptimizerSpec.schedule)
// and the checks on the fields it reads.
//
// Pure functions; thread-safe.
#ifndef TOWERPS_COMMON_LR_SCHEDULE_H_
#define TOWERPS_COMMON_LR_SCHEDULE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "proto/job.pb.h"

namespace towerps::common {

// The learning rate of the update at `step`, 0-based: the number of updates
// applied before this one. With lr = spec.learning_rate(), w = warmup_steps
// and d = decay_steps:
//   s < w:              lr * (s + 1) / w   (linear warm-up; lr at s = w - 1)
//   else, with t = s - w:
//   CONSTANT:           lr                 (also SCHEDULE_UNSPECIFIED)
//   STEP_DECAY:         lr * decay_rate ^ floor(t / d)  (TF staircase decay)
//   EXPONENTIAL_DECAY:  lr * decay_rate ^ (t / d)
//   COSINE:             lr * (alpha + (1 - alpha) * (1 + cos(pi * min(t, d) / d)) / 2)
//                       (Keras CosineDecay; alpha * lr from t = d on)
// COSINE with d = 0 (the job has not filled in its total steps yet) is
// constant lr after warm-up, and so is STEP_DECAY or EXPONENTIAL_DECAY with an
// invalid d <= 0: the result is always finite for a spec that passes
// ValidateSchedule.
// REQUIRES: defaults already applied (learning_rate is used as given, so a
// zero learning_rate gives 0). A negative `step` counts as 0.
double LearningRateAt(const v1::OptimizerSpec& spec, int64_t step);

// Checks spec.schedule and spec.weight_decay (the fields that scale each
// step): weight_decay >= 0 and finite; a known schedule type; warmup_steps
// >= 0; STEP_DECAY and EXPONENTIAL_DECAY: decay_steps > 0, decay_rate in
// (0, 1]; COSINE: decay_steps >= 0 (0 is filled in at job start), alpha in
// [0, 1]. Fields a schedule type does not read are not checked.
// Returns InvalidArgument naming the field and the value, e.g.
// "optimizer.schedule.decay_rate must be in (0, 1], got 1.5".
absl::Status ValidateSchedule(const v1::OptimizerSpec& spec);

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_LR_SCHEDULE_H_
