// Server-side update rules: each instance updates one variable and owns its
// slots (momentum's velocity, Adam's moments). A variable's rule is the job's
// optimizer, or, for a VariableDef with update MOVING_AVERAGE (batch norm's
// moving statistics), an exponential moving average of what workers push.
//
// Thread-compatible: the caller serializes Apply() on one instance.
#ifndef TOWERPS_PS_OPTIMIZER_H_
#define TOWERPS_PS_OPTIMIZER_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/optimizer_spec.h"
#include "proto/job.pb.h"
#include "proto/tensor.pb.h"

namespace towerps::ps {

// The overflow guard (ParameterServer): upper bounds on the magnitude of
// every element of a variable's values and of each of its optimizer slots
// (Slots() order), +inf where unknown.
struct MagnitudeBounds {
  static constexpr double kUnknown = std::numeric_limits<double>::infinity();
  double value = kUnknown;
  double slots[2] = {kUnknown, kUnknown};
};
// Where an update's bound (Optimizer::BoundStep) is below this, none of the
// floats it forms can overflow (FLT_MAX is about 3.4e38; the margin covers
// rounding many times over).
constexpr double kSafeMagnitude = 1e37;

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Applies one (averaged) gradient. `step` is 1 for the variable's first
  // update, 2 for the next... The update uses the gradient
  // g + weight_decay * w and the learning rate
  // common::LearningRateAt(spec, step - 1); Adam's bias correction uses `step`.
  // The moving average (NewVariableUpdater) takes the averaged statistic in
  // `grad` instead and ignores `step`: value = decay * value + (1 - decay) *
  // grad, with no learning rate and no weight decay.
  // REQUIRES: value.size() == grad.size() == the size given at creation;
  // step >= 1.
  virtual void Apply(absl::Span<float> value, absl::Span<const float> grad,
                     int64_t step) = 0;
  // Apply, with the new values also written to each of `copies` (value's
  // size each), bit for bit, one block of kApplyBlock at a time while the
  // block is in cache (Adam, momentum: the first copy in the update's own
  // pass): for the workers' weights on the same host, so that their pulls
  // need not copy them (ParameterServer, Commit).
  virtual void ApplyAndCopy(absl::Span<float> value, absl::Span<const float> grad,
                            int64_t step, absl::Span<float* const> copies);
  // Bytes of optimizer state held for the variable (the slots; not SGD's
  // small scratch block for weight decay).
  virtual int64_t slot_bytes() const = 0;
  // The optimizer's state by name, for checkpoints: SGD none, MOMENTUM
  // {"velocity"}, ADAM {"m", "v"}, always in that order; the moving average
  // none. Each span views the
  // optimizer's own memory, has one float per element of the variable, and
  // stays valid for the optimizer's lifetime. Save by reading the spans;
  // restore by copying into them before the next Apply(). The slots and the
  // `step` passed to Apply() are the whole state: a fresh optimizer with the
  // slots restored, continuing from the same step, gives bit-identical
  // updates. Not synchronized with Apply(): the caller serializes them.
  virtual std::vector<std::pair<std::string, absl::Span<float>>> Slots() = 0;
  // For a reader that still views the slots (a checkpoint being written)
  // when they are about to change: moves the slot buffers out, in Slots()
  // order, and continues on copies of them, so that later Apply() calls give
  // the same results; spans from an earlier Slots() then view the returned
  // buffers. Empty for rules without slots. The caller serializes it with
  // Apply().
  virtual std::vector<std::vector<float>> DetachSlots() { return {}; }
  // After slots were restored through Slots() (a checkpoint): OK, or
  // InvalidArgument naming the slot and element where one holds what no
  // update leaves (Adam's "v" below 0, whose square root the update takes;
  // the overflow guard relies on it too). Values that are not finite are
  // the caller's to check.
  virtual absl::Status CheckRestoredSlots() const { return absl::OkStatus(); }

  // Out of place, for an update prepared while its gradient still arrives
  // (ps/push_session.h, "Updates ahead"): whether ApplyInto can compute this
  // rule's update without changing the optimizer (true for the job's
  // optimizers, SGD, momentum and Adam; false for the moving average).
  virtual bool CanApplyInto() const { return false; }
  // How many slots Slots() has (SGD 0, momentum 1, Adam 2).
  virtual int num_slots() const { return 0; }
  // Writes into `out` the values Apply(value, grad, step) would leave in
  // `value`, and into slots_out[i] + first the values it would leave in
  // slot i (Slots() order), bit for bit, leaving `value` and the optimizer
  // unchanged. The spans view elements [first, first + value.size()) of
  // the variable, where `first` is a multiple of kApplyBlock (and the
  // range runs to the variable's end or to another multiple): ranges so
  // cut give the same rounding as one call. `out` may be `grad` itself
  // (the gradient's buffer then receives the new values) or memory apart
  // from both; slots_out has num_slots() buffers of the variable's size,
  // apart from everything else (AdoptSlots takes them once every element
  // was formed). Const: callable from any thread, beside Apply() on
  // another variable.
  // REQUIRES: CanApplyInto(); value, grad and out of one size.
  virtual void ApplyInto(int64_t first, absl::Span<const float> value,
                         absl::Span<const float> grad, absl::Span<float> out, int64_t step,
                         absl::Span<float* const> slots_out) const {}
  // After ApplyInto formed every element into `staged` (num_slots()
  // buffers of the variable's size): they become the slots, and the old
  // slot buffers take their place in `staged` (for the next ApplyInto).
  // The caller serializes it with Apply() and Slots() readers.
  virtual void AdoptSlots(std::vector<std::vector<float>>* staged) {}
  // The overflow guard: given `before`, bounds on the values and slots
  // (MagnitudeBounds), and `grad_abs_sum`, at least every |grad[i]| (their
  // sum is, cheaply), sets *after to bounds on what Apply(value, grad, step)
  // (or ApplyInto) leaves, and returns a bound on every float the update
  // forms on the way, results included, whatever their rounding. Sound,
  // not tight: O(1), from the bounds alone. Infinite where a bound is.
  virtual double BoundStep(const MagnitudeBounds& before, double grad_abs_sum, int64_t step,
                           MagnitudeBounds* after) const = 0;
  // The granularity of ApplyInto's ranges: ranges starting at multiples of it
  // give the same rounding as one Apply over the whole variable.
  static constexpr int64_t kApplyBlock = 4096;  // 16 KiB of floats: in L1
};

// The largest |x[i]| of n floats (0 for none; +inf where one is infinite).
double MaxAbs(const float* x, int64_t n);
// Exact bounds (the largest magnitudes) of `value` and `optimizer`'s slots:
// one pass over each.
MagnitudeBounds MeasureBounds(absl::Span<const float> value, Optimizer& optimizer);

// Threads OpenBLAS may use for one call of the server's math: the updates'
// saxpy, the finiteness check's sasum, SYNC's weighted sums. Process-wide.
// Each is a pass over memory, and the server already runs one per stream,
// so a call split across threads mostly wakes threads that spin for work
// beside gRPC's: on 2 cores, ps_throughput's dense-stack rounds moved 1.3-1.5
// GB/s with OpenBLAS's default of one thread per core and 1.8-2.1 GB/s with
// one (issue 16). The ps binary's --blas_threads; clamped to at least 1.
constexpr int kDefaultMathThreads = 1;
void SetMathThreads(int threads);

// The instruction set momentum's and Adam's element loops run in (SGD's are
// OpenBLAS's). Both give the same bits (no fused multiply-add; the rest is
// exact per element); AVX2 does 8 floats a vector, the baseline (SSE2) 4:
// Adam 0.49 -> 0.26 ns per element at 1M elements (optimizer_benchmark).
// AVX2 wherever the CPU has it, unless set otherwise. Process-wide.
enum class UpdateLoops { kBaseline, kAvx2 };
UpdateLoops ActiveUpdateLoops();
// For tests and benchmarks: FailedPrecondition for kAvx2 where the CPU (or
// this build's target) has none.
absl::Status SetUpdateLoops(UpdateLoops loops);
// "AVX2" or "baseline (SSE2)", for logs.
const char* UpdateLoopsName(UpdateLoops loops);

// Defaults and validation of an OptimizerSpec live in common/ (the chief
// validates submitted jobs with them too).
using common::OptimizerWithDefaults;
using common::ValidateOptimizer;

// An optimizer for a variable of `num_elements` floats. Defaults are applied.
absl::StatusOr<std::unique_ptr<Optimizer>> NewOptimizer(
    const v1::OptimizerSpec& spec, int64_t num_elements);

// Checks `def`'s update fields: `update` a known value; for MOVING_AVERAGE,
// moving_average_decay finite and in [0, 1); for OPTIMIZER, no
// moving_average_decay (0), so that a statistic registered without its
// update is not silently trained as a weight. InvalidArgument naming the
// variable and the field. Does not check name, shape or dtype.
absl::Status ValidateVariableUpdate(const v1::VariableDef& def);

// The update rule of variable `def` of `num_elements` floats: for
// MOVING_AVERAGE, the moving average with def.moving_average_decay (no
// slots; `spec` is not used); for OPTIMIZER, NewOptimizer(spec,
// num_elements). InvalidArgument as ValidateVariableUpdate, or for a bad
// `spec` when it is used.
absl::StatusOr<std::unique_ptr<Optimizer>> NewVariableUpdater(
    const v1::VariableDef& def, const v1::OptimizerSpec& spec, int64_t num_elements);

}  // namespace towerps::ps

#endif  // TOWERPS_PS_OPTIMIZER_H_
