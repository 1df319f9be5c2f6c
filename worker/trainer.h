// The worker's training loop: pull, forward, backward, push; evaluation on the
// test set at the end of each epoch (chief only).
//
// Data order: epoch e visits the train set in EpochPermutation(seed, e);
// global batch b of it is split over the workers by WorkerSlice. In SYNC mode
// the batch is chosen by the global step the worker pulled, so every worker
// agrees on the number of steps whatever its slice sizes, and a backup worker
// whose push was dropped rejoins at the current step. In ASYNC mode each worker
// runs epochs * StepsPerEpoch iterations over its slices.
//
// Thread-compatible: Run() once per Trainer.
#ifndef TOWERPS_WORKER_TRAINER_H_
#define TOWERPS_WORKER_TRAINER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "proto/towerps.pb.h"
#include "worker/dataset.h"
#include "worker/model.h"
#include "worker/ps_client.h"
#include "worker/towers.h"

namespace towerps::worker {

struct TrainerOptions {
  v1::JobSpec job;   // With defaults applied (JobWithDefaults).
  int worker_task = 0;
  int num_workers = 1;
  bool is_chief = true;
  int log_every_steps = 50;  // Progress line period; 0 = only per epoch.
  // Where progress lines go. Default: stderr via TLOG.
  std::function<void(const std::string&)> progress;
};

struct TrainResult {
  double test_accuracy = 0;  // NaN for regression models.
  double test_loss = 0;
  int64_t global_steps = 0;  // The servers' step at the end.
  int64_t iterations = 0;    // Gradients this worker pushed.
  int64_t stale_pushes = 0;
  double wall_s = 0;
  bool evaluated = false;    // Chief only.
};

// Mean loss and accuracy of `model` (current weights) over `data`.
absl::StatusOr<std::pair<double, double>> EvaluateModel(Model& model, const Dataset& data);

class Trainer {
 public:
  // Not owned; all must outlive the trainer. `test` may equal `train`.
  Trainer(TrainerOptions options, Towers& towers, ParameterClient& client,
          const Dataset& train, const Dataset& test);

  // Registers the job, trains, and (chief) evaluates the final weights.
  absl::StatusOr<TrainResult> Run();

 private:
  void Progress(const std::string& line);
  absl::Status EvalAndReport(int64_t epoch, TrainResult* result);

  const TrainerOptions options_;
  Towers& towers_;
  ParameterClient& client_;
  const Dataset& train_;
  const Dataset& test_;
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_TRAINER_H_
