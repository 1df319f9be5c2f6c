// OptimizerSpec defaults and validation, shared by the parameter servers
// (which run the optimizers) and the chief (which validates submitted jobs).
//
// Pure functions; thread-safe.
#ifndef TOWERPS_COMMON_OPTIMIZER_SPEC_H_
#define TOWERPS_COMMON_OPTIMIZER_SPEC_H_

#include "absl/status/status.h"
#include "proto/job.pb.h"

namespace towerps::common {

// `spec` with every zero field replaced by its documented default.
v1::OptimizerSpec OptimizerWithDefaults(const v1::OptimizerSpec& spec);

// Checks ranges: learning rate > 0, momentum and betas in [0, 1), epsilon > 0,
// and the schedule and weight_decay (>= 0) with ValidateSchedule.
// InvalidArgument names the field.
absl::Status ValidateOptimizer(const v1::OptimizerSpec& spec);

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_OPTIMIZER_SPEC_H_
