// Fills a variable's initial values from its Initializer spec.
//
// Deterministic: the same spec gives the same values on every machine.
#ifndef TOWERPS_COMMON_INITIALIZER_H_
#define TOWERPS_COMMON_INITIALIZER_H_

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "proto/tensor.pb.h"

namespace towerps::common {

// GLOROT_UNIFORM draws U(-l, l), l = sqrt(6 / (fan_in + fan_out)), from a
// generator seeded with `init.seed()` (after `init.offset()` draws, so that a
// part of a variable gets the values the whole has there); ZEROS and
// CONSTANT fill.
void InitializeValues(const v1::Initializer& init, absl::Span<float> out);

// OK, or InvalidArgument naming the field: a type that is not known, a
// CONSTANT value that is not finite, a negative fan_in, fan_out or offset.
absl::Status ValidateInitializer(const v1::Initializer& init);

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_INITIALIZER_H_
