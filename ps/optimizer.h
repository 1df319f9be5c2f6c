// Server-side optimizers: each instance updates one variable and owns its
// slots (momentum's velocity, Adam's moments).
//
// Thread-compatible: the caller serializes Apply() on one instance.
#ifndef TOWERPS_PS_OPTIMIZER_H_
#define TOWERPS_PS_OPTIMIZER_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/towerps.pb.h"

namespace towerps::ps {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Applies one (averaged) gradient. `step` is 1 for the variable's first
  // update, 2 for the next... (Adam's bias correction uses it).
  // REQUIRES: value.size() == grad.size() == the size given at creation.
  virtual void Apply(absl::Span<float> value, absl::Span<const float> grad,
                     int64_t step) = 0;
  // Bytes of optimizer state held for the variable.
  virtual int64_t slot_bytes() const = 0;
};

// `spec` with every zero field replaced by its documented default.
v1::OptimizerSpec OptimizerWithDefaults(const v1::OptimizerSpec& spec);

// Checks ranges: learning rate > 0, momentum and betas in [0, 1), epsilon > 0.
// InvalidArgument names the field.
absl::Status ValidateOptimizer(const v1::OptimizerSpec& spec);

// An optimizer for a variable of `num_elements` floats. Defaults are applied.
absl::StatusOr<std::unique_ptr<Optimizer>> NewOptimizer(
    const v1::OptimizerSpec& spec, int64_t num_elements);

}  // namespace towerps::ps

#endif  // TOWERPS_PS_OPTIMIZER_H_
