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
#ifndef TOWERPS_WORKER_TRAIN_TRAINER_H_
#define TOWERPS_WORKER_TRAIN_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cancellation.h"
#include "proto/job.pb.h"
#include "proto/job_service.pb.h"
#include "worker/model/dataset.h"
#include "worker/model/model.h"
#include "worker/train/ps_client.h"
#include "worker/train/towers.h"

namespace towerps::worker {

struct TrainerOptions {
  v1::JobSpec job;   // With defaults applied (JobWithDefaults).
  int worker_task = 0;
  int num_workers = 1;
  bool is_chief = true;
  int log_every_steps = 50;  // Progress line period; 0 = only per epoch.
  // Where progress lines go. Default: stderr via TLOG.
  std::function<void(const std::string&)> progress;
  // Structured progress (chief): every log_every_steps and at each epoch end
  // (`epoch_end`, with the evaluation filled in).
  std::function<void(const v1::Metrics&, bool epoch_end)> on_metrics;
  // Chief: called after each pull with the step pulled, before the gradient
  // is computed (so in SYNC every server is at exactly that step): the place
  // for checkpoints. An error stops training.
  std::function<absl::Status(int64_t step)> after_pull;
  // Chief: the current weights after each epoch's evaluation (histograms).
  std::function<void(int64_t step, const std::vector<common::Tensor*>& weights)> on_epoch;
  // The servers restore the job from a checkpoint: training resumes at the
  // step they report (ASYNC: each worker skips its share of the steps done).
  bool restoring = false;
  // Set by another thread to stop at the next step: Run() returns Cancelled.
  const common::CancellationToken* cancel = nullptr;  // Not owned; may be null.
  // Updated as training goes, for status reports.
  std::atomic<int64_t>* last_step = nullptr;     // Not owned.
  std::atomic<int64_t>* iterations = nullptr;    // Not owned.
  // After each pushed gradient, with the examples in its batch (metrics).
  std::function<void(int64_t examples)> on_iteration;
  // Same host: the towers' weights and gradients stay in the client's shared
  // memory when Run returns, rather than moving back into memory of their
  // own. That move copies the model twice over at the job's end, while the
  // gradients' pages in the segment are still held, so it sets the worker's
  // peak. REQUIRES: the towers go (or are never read again) before the client.
  bool tensors_stay_shared = false;
  // After each step, once its push is done, on the training thread, with
  // the seconds its compute took (forward, loss, backward and the towers'
  // reduction; waits for weights excluded). No CPU math of this worker runs
  // then: the place to change its thread count (--adapt_blas_threads).
  std::function<void(double compute_s)> after_step;
};

// Where a worker's training loop spent its time, summed over its iterations
// (absl::Now() around each phase: a few clock reads per step). Pulls and
// pushes overlap the compute (Trainer::Run); what they cost a step is the
// time the loop was blocked on them, which is what pull_s and push_s count.
struct StepBreakdown {
  int64_t steps = 0;       // Iterations (gradients pushed).
  double loop_s = 0;       // The whole loop; the phases below add up to it.
  double pull_s = 0;       // Blocked on the pull: for its step, and for each
                           // layer's weights when the compute reached it.
  double pull_wait_s = 0;  // Servers holding the pull for its step (the sync
                           // barrier) or the staleness bound, hidden or not.
  double compute_s = 0;    // Forward, loss, backward, the towers' reduction
                           // (waits for weights excluded).
  double push_s = 0;       // Blocked on the push after the compute.
  double other_s = 0;      // The rest: batches, checkpoints, evaluation, progress.
  double batches_s = 0;    // Of other_s: gathering each step's batch
                           // (GatherBatch: the rows at random in the set).
  double eval_s = 0;       // Of other_s: the chief's evaluations and their
                           // reports at each epoch's end (no training step's
                           // work; with few steps an epoch, much of other).
  double cpu_s = 0;        // CPU time of the whole worker process during the
                           // loop (compute and communication threads).
  // "470 steps, per step 6.81 ms: compute 3.05 (45%), pull 2.11 (wait 0.40),
  // push 1.20, other 0.45 (batches 0.05, eval 0.21); process cpu 1.52 cores".
  std::string Describe() const;
};

struct TrainResult {
  double test_accuracy = 0;  // NaN for regression models.
  double test_loss = 0;
  int64_t global_steps = 0;  // The servers' step at the end.
  int64_t iterations = 0;    // Gradients this worker pushed.
  int64_t stale_pushes = 0;
  double wall_s = 0;
  bool evaluated = false;    // Chief only.
  StepBreakdown breakdown;
};

// Mean loss and accuracy of `model` (current weights) over `data`, in
// forward passes of at most `batch` examples (the same results, up to the
// order the per-batch sums are added in). REQUIRES: batch > 0.
absl::StatusOr<std::pair<double, double>> EvaluateModel(Model& model, const Dataset& data,
                                                        int64_t batch);

// The optimizer the servers run: the job's, with a COSINE schedule's default
// decay_steps (0) resolved to total_steps - warmup_steps.
v1::OptimizerSpec TrainingOptimizer(const v1::JobSpec& job, int64_t total_steps);

class Trainer {
 public:
  // Not owned; all must outlive the trainer. `test` may equal `train`.
  Trainer(TrainerOptions options, Towers& towers, ParameterClient& client,
          const Dataset& train, const Dataset& test);

  // Registers the job, trains, and (chief) evaluates the final weights.
  absl::StatusOr<TrainResult> Run();

 private:
  void Progress(const std::string& line);
  absl::Status EvalAndReport(int64_t epoch, int64_t step, TrainResult* result);
  absl::Status CheckCancelled() const;

  const TrainerOptions options_;
  v1::OptimizerSpec optimizer_;  // As the servers run it (set by Run).
  Towers& towers_;
  ParameterClient& client_;
  const Dataset& train_;
  const Dataset& test_;
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_TRAIN_TRAINER_H_
