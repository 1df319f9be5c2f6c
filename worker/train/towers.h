// Data-parallel towers inside one worker: N replicas of the model, each with
// its own backend, train on contiguous parts of the worker's batch at the same
// time; their gradients are reduced into one mean gradient (weighted by each
// tower's examples), so one step pushes once and equals one replica on the
// whole batch.
//
// Reduction goes through GradientReducer, on the devices: towers whose
// gradients share a memory space (the host; one physical GPU) are summed
// there by that device's backend, and the per-space sums meet through the
// device collectives (worker/device/nccl_reduce: an all-reduce across physical
// GPUs, one rank per GPU), or by copies to tower 0's device where those do
// not apply (CPU, or CPU and GPU mixed). Only
// tower 0's result is downloaded to the host. Thread-compatible: one
// training loop drives it.
#ifndef TOWERPS_WORKER_TRAIN_TOWERS_H_
#define TOWERPS_WORKER_TRAIN_TOWERS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "proto/job.pb.h"
#include "worker/device/backend.h"
#include "worker/device/device_tensor.h"
#include "worker/model/batch.h"
#include "worker/model/losses.h"
#include "worker/model/model.h"

namespace towerps::worker {

// Sums towers' gradients into tower 0's, weighted, then divides by the total.
class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  // grads[t][v]: tower t's mean gradient of variable v over examples[t]
  // examples, in its device's memory, complete (its backend synchronized).
  // On return grads[0][v] holds the mean over all examples (zeros if there
  // were none) and every backend involved is synchronized. Other towers'
  // buffers may be overwritten. InternalError for mismatched shapes; the
  // device's or the device collectives' error.
  virtual absl::Status Reduce(const std::vector<std::vector<DeviceTensor*>>& grads,
                              const std::vector<int64_t>& examples) = 0;
  // What it does, for the log: the towers summed in each memory space
  // (named by Backend::memory_space()) and how the sums meet, e.g. an
  // all-reduce over 2 GPUs.
  virtual std::string Name() const = 0;
};

// The reducer for towers whose gradients live where `grads` (as in Reduce)
// live. `use_nccl`: the device collectives between physical GPUs when this
// build has them (false: copies to tower 0's device; tests compare both).
std::unique_ptr<GradientReducer> NewReducer(
    const std::vector<std::vector<DeviceTensor*>>& grads, bool use_nccl = true);

class Towers {
 public:
  // Builds `num_towers` replicas of `spec`, each on a backend from
  // `make_backend`. InvalidArgument for num_towers < 1 or a bad spec.
  static absl::StatusOr<std::unique_ptr<Towers>> Create(
      const v1::ModelSpec& spec, int num_towers,
      const std::function<std::unique_ptr<Backend>()>& make_backend);

  // As above, tower t's layers placed by `placer_for_tower(t)` (e.g. a
  // DevicePlacer's, which owns the backends and must outlive the towers).
  static absl::StatusOr<std::unique_ptr<Towers>> Create(
      const v1::ModelSpec& spec, int num_towers,
      const std::function<Model::LayerPlacer(int tower)>& placer_for_tower);

  int num_towers() const { return static_cast<int>(models_.size()); }
  Model& primary() { return *models_[0]; }
  Model& tower(int t) { return *models_[t]; }
  const GradientReducer& reducer() const { return *reducer_; }
  // Every tower splits its part of a batch into `m` micro-batches (see
  // Model::set_micro_batches).
  void set_micro_batches(int m) {
    for (auto& model : models_) model->set_micro_batches(m);
  }

  // Tower 0's weights: write pulled values here; ComputeGradients copies them
  // to the other towers first.
  std::vector<common::Tensor*> weights() { return models_[0]->weights(); }
  // The reduced gradient after ComputeGradients (tower 0's tensors).
  std::vector<common::Tensor*> gradients() { return models_[0]->gradients(); }
  // Where those live (Model::PlaceHostTensors of tower 0).
  void PlaceHostTensors(size_t v, float* weight, float* grad, bool keep_values = true) {
    models_[0]->PlaceHostTensors(v, weight, grad, keep_values);
  }

  // Splits `batch` into num_towers contiguous parts (sizes differ by at most
  // one), runs every tower on its own thread (towers on host memory read
  // tower 0's weights in place; GPU towers upload them), reduces on the
  // devices and downloads the result into gradients(). Returns the summed
  // loss and correct counts over the whole batch.
  absl::StatusOr<LossResult> ComputeGradients(const Batch& batch);
  // As above, announcing weights and gradients through `events` (see
  // Model::StepEvents): one tower announces layer by layer as it computes;
  // several towers wait for every weight before they start (tower 0's are
  // shared with the others) and announce every gradient once reduced.
  absl::StatusOr<LossResult> ComputeGradients(const Batch& batch,
                                              const Model::StepEvents& events);

 private:
  Towers() = default;

  std::vector<std::unique_ptr<Backend>> backends_;
  std::vector<std::unique_ptr<Model>> models_;
  std::unique_ptr<GradientReducer> reducer_;
  std::vector<Batch> parts_;  // reused per step
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_TRAIN_TOWERS_H_
