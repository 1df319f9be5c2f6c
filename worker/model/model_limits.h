// Size limits of a model spec, checked before anything is allocated (issue
// 15, limits): a spec with a 10^9-unit layer must be refused with the field
// named, never make a chief or worker allocate gigabytes. Model::Create runs
// CheckModelLimits first, so that the chief's submission check, the chief's
// variable listing and the worker's job runner are all covered.
//
// The sizes are computed from the spec alone, as the layers will allocate
// them (model_limits_test checks them against an allocator's count), with
// saturating arithmetic: no product of spec fields can overflow.
//
// Thread-safe (pure functions).
#ifndef TOWERPS_WORKER_MODEL_MODEL_LIMITS_H_
#define TOWERPS_WORKER_MODEL_MODEL_LIMITS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"

namespace towerps::worker {

struct ModelLimits {
  // Most layers in model.layers.
  int max_layers = 1000;
  // Widest input_dim, DENSE units and CONV2D / RESIDUAL_BLOCK filters.
  int64_t max_width = int64_t{1} << 20;
  // Largest kernel side, stride and pool size.
  int max_kernel = 64;
  // Most parameters (floats) of the whole model: 2^28, 1 GiB of values.
  int64_t max_parameters = int64_t{1} << 28;
};

// What one replica of the model holds, estimated from the spec.
struct ModelSize {
  int64_t parameters = 0;                // floats of all variables
  // Floats a training step holds per example: every layer's output and its
  // gradient, and the layers' own buffers (a fused ReLU's output, a max
  // pool's workspace, a dropout's mask, a residual block's intermediates).
  int64_t activations_per_example = 0;
  // Floats a training step holds whatever its batch (batch norms' statistics).
  int64_t floats_per_step = 0;
  // With micro-batches (more than one): the floats that add them up, a
  // convolution's kernel and bias gradients computed apart before they are
  // added, and a dense layer's bias gradient (its kernel's adds in the GEMM);
  int64_t floats_to_accumulate = 0;
  // and for each micro-batch after the first, the batch norms' statistics.
  int64_t floats_per_micro_batch = 0;
};

// Checks the spec's sizes against `limits` and estimates the model's size.
// InvalidArgument naming the field and the limit, e.g.
// `model.layers[1].units = 1000000000 (limit 1048576)`, or
// `model: about 4000000000 parameters (limit 268435456)`. Does not check what
// Model::Create checks (types, names, shapes that fit).
absl::StatusOr<ModelSize> CheckModelLimits(const v1::ModelSpec& spec,
                                           const ModelLimits& limits = {});

// The most examples one tower trains on in a step: the worker's share of
// the global batch (WorkerSlice: the larger parts have one more) cut among
// its towers alike (tower 0 gets the most). A worker reserves its towers'
// memory for it (worker/train/job_runner), and the chief evaluates in
// passes of it, so that an evaluation needs no memory (activation buffers,
// a device's limit) beyond what training holds.
int64_t TowerBatch(int64_t global_batch, int num_workers, int num_towers);

// Bytes a worker holds to train `size` with `examples_per_step` examples per
// tower, `towers` towers and each tower's step cut into `micro_batches`:
// per tower, weights and gradients (2 floats per parameter), floats_per_step,
// and activations_per_example per example, what the layers allocate for a
// step; with micro-batches also floats_to_accumulate and
// floats_per_micro_batch for each after the first (the micro-batches'
// activations add up to the batch's; the layers' own scratch is sized for
// one of them, so it is an upper bound there). Saturates at INT64_MAX.
int64_t WorkerTrainingBytes(const ModelSize& size, int64_t examples_per_step, int towers,
                            int micro_batches = 1);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_MODEL_MODEL_LIMITS_H_
