// A double-precision reference for the gradients of a Model made of Dense and
// ReLU layers, and a bound on the float error of ANY computation of the same
// gradients, whatever its summation order (one device, towers, micro-batches,
// a pipeline). Tests compare every float result with the reference within
// that bound, instead of comparing two float results with a tolerance picked
// by eye: two correct results may differ in the last bits of a sum that
// cancels, and a fixed relative tolerance then fails on one machine and not
// on another.
//
// The bound is the classic first-order one (Higham, "Accuracy and Stability
// of Numerical Algorithms", 3.1): a value computed in floating point with at
// most N roundings along any path from the inputs satisfies
//   |computed - exact| <= gamma_N * magnitude,  gamma_N = N u / (1 - N u),
// where u = 2^-24 (float's unit roundoff) and `magnitude` is the same
// computation carried out on absolute values (|x| |W| forward, |dy| |W^T|
// backward, the loss's Jacobian in absolute value). A cancelling sum has a
// small value but a large magnitude, so its bound stays honest.
//
// Not thread-safe; for tests only.
#ifndef TOWERPS_WORKER_MODEL_REFERENCE_MODEL_H_
#define TOWERPS_WORKER_MODEL_REFERENCE_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "proto/job.pb.h"
#include "worker/model/batch.h"

namespace towerps::worker {

struct ReferenceGradients {
  // Per variable (Model::VariableDefs() order), element by element: the
  // exact gradient (of the batch mean loss, as Model::ComputeGradients) and
  // its magnitude (see above).
  std::vector<std::vector<double>> value;
  std::vector<std::vector<double>> magnitude;
  double loss_sum = 0;        // Sum of per-example losses, exact.
  double loss_magnitude = 0;  // Its magnitude.
  int64_t correct = 0;        // Classification: argmax == label.
  // N above for one device computing the whole batch in one pass: every
  // layer's fan-in + 1 (dot product and bias) forward, its width backward,
  // 2 for the loss derivative, the batch rows for the weight-gradient sums,
  // and 2 for the final scaling and store. An upper bound over every path.
  int64_t roundings = 0;
  // ReLU inputs (and softmax arg-maxes) so close to a decision boundary that
  // float rounding could take the other branch, where the bound does not
  // hold. A test should use data with none (assert it is 0).
  int64_t ambiguous = 0;
};

// Computes the reference for `spec` (DENSE layers with or without RELU
// activation and bias, RELU_LAYER; any loss) with `weights` in VariableDefs()
// order. InvalidArgument for another layer type or shapes that do not fit.
absl::StatusOr<ReferenceGradients> ComputeReferenceGradients(
    const v1::ModelSpec& spec, const std::vector<common::Tensor*>& weights, const Batch& batch);

// gamma_n = n u / (1 - n u) with u = 2^-24.
double FloatGamma(int64_t n);

// OK when every element of `got` is within gamma_{roundings +
// extra_roundings} * magnitude of the reference value; otherwise
// OutOfRange naming the first element outside, with its value, the exact
// value and the bound. `extra_roundings` counts what the computation adds
// to one device's pass: e.g. micro-batches + towers for the accumulations
// across them. InvalidArgument when the shapes differ.
absl::Status CheckWithinFloatBound(const std::vector<common::Tensor*>& got,
                                   const ReferenceGradients& ref, int64_t extra_roundings);

// CheckWithinFloatBound as a test expectation, plus: no ambiguous data, and
// a non-trivial gradient.
void ExpectWithinFloatBound(const std::vector<common::Tensor*>& got,
                            const ReferenceGradients& ref, int64_t extra_roundings,
                            const std::string& what);

// Expects a loss sum within the bound of the reference's.
void ExpectLossWithinFloatBound(double got, const ReferenceGradients& ref,
                                int64_t extra_roundings, const std::string& what);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_MODEL_REFERENCE_MODEL_H_
