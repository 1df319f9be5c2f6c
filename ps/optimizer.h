// Server-side optimizers: each instance updates one variable and owns its
// slots (momentum's velocity, Adam's moments).
//
// Thread-compatible: the caller serializes Apply() on one instance.
#ifndef TOWERPS_PS_OPTIMIZER_H_
#define TOWERPS_PS_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/optimizer_spec.h"
#include "proto/job.pb.h"

namespace towerps::ps {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Applies one (averaged) gradient. `step` is 1 for the variable's first
  // update, 2 for the next... The update uses the gradient
  // g + weight_decay * w and the learning rate
  // common::LearningRateAt(spec, step - 1); Adam's bias correction uses `step`.
  // REQUIRES: value.size() == grad.size() == the size given at creation;
  // step >= 1.
  virtual void Apply(absl::Span<float> value, absl::Span<const float> grad,
                     int64_t step) = 0;
  // Bytes of optimizer state held for the variable (the slots; not SGD's
  // small scratch block for weight decay).
  virtual int64_t slot_bytes() const = 0;
  // The optimizer's state by name, for checkpoints: SGD none, MOMENTUM
  // {"velocity"}, ADAM {"m", "v"}, always in that order. Each span views the
  // optimizer's own memory, has one float per element of the variable, and
  // stays valid for the optimizer's lifetime. Save by reading the spans;
  // restore by copying into them before the next Apply(). The slots and the
  // `step` passed to Apply() are the whole state: a fresh optimizer with the
  // slots restored, continuing from the same step, gives bit-identical
  // updates. Not synchronized with Apply(): the caller serializes them.
  virtual std::vector<std::pair<std::string, absl::Span<float>>> Slots() = 0;
};

// Defaults and validation of an OptimizerSpec live in common/ (the chief
// validates submitted jobs with them too).
using common::OptimizerWithDefaults;
using common::ValidateOptimizer;

// An optimizer for a variable of `num_elements` floats. Defaults are applied.
absl::StatusOr<std::unique_ptr<Optimizer>> NewOptimizer(
    const v1::OptimizerSpec& spec, int64_t num_elements);

}  // namespace towerps::ps

#endif  // TOWERPS_PS_OPTIMIZER_H_
