// The micro-batch pipeline (GPipe) as a scheduler that drives a model: it
// decides when each stage of the model runs each micro-batch, and on which
// thread; the model only provides the per-stage steps.
//
// A model whose layers sit on several devices has stages (runs of layers on
// one device). With micro-batches, each stage gets its own thread, so the
// devices work on different micro-batches at the same time: every
// micro-batch forward, then every one backward, each stage taking the
// micro-batches in increasing order (so each device adds its micro-batches'
// gradients in a fixed order and results do not depend on timing).
//
// Thread-compatible: one Run at a time. The steps run on the scheduler's
// threads (or the caller's, see Run); two steps of one stage never overlap,
// steps of different stages may.
#ifndef TOWERPS_WORKER_MODEL_PIPELINE_SCHEDULER_H_
#define TOWERPS_WORKER_MODEL_PIPELINE_SCHEDULER_H_

#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace towerps::worker {

class PipelineScheduler {
 public:
  // One step of stage `stage` (0 = the input side) on micro-batch
  // `micro_batch`. A non-OK status stops the run.
  using Step = std::function<absl::Status(int stage, int micro_batch)>;

  // REQUIRES: num_stages >= 1, num_micro_batches >= 1.
  PipelineScheduler(int num_stages, int num_micro_batches);

  PipelineScheduler(const PipelineScheduler&) = delete;
  PipelineScheduler& operator=(const PipelineScheduler&) = delete;

  // Runs forward(s, k) for every stage s and micro-batch k, then, unless
  // `backward` is null (evaluation), backward(s, k), and returns when every
  // step has returned. Guarantees:
  //  - forward(s, k) starts after forward(s - 1, k) returned;
  //  - backward(s, k) starts after backward(s + 1, k) returned;
  //  - on each stage the steps of one pass go in micro-batch order.
  // With several stages and micro-batches: one thread per stage, each
  // running all its forward steps, then all its backward steps. With one
  // stage or one micro-batch nothing can overlap: the steps run on the
  // calling thread, micro-batch by micro-batch (forward through the stages,
  // then backward through them in reverse).
  //
  // After a step fails no new step starts (steps under way finish); returns
  // the failure of the lowest stage that failed (the first failure on the
  // calling thread), else OK.
  absl::Status Run(const Step& forward, const Step& backward);

 private:
  enum class Pass { kForward, kBackward };

  absl::Status RunOnCaller(const Step& forward, const Step& backward);
  // Stage `s`'s thread: its forward steps, then its backward steps.
  void StageLoop(int s, const Step& forward, const Step& backward);
  // Blocks until stage `s` has finished micro-batch `k` in `pass`, or a step
  // failed; false in the latter case.
  bool WaitFor(Pass pass, int s, int k) ABSL_LOCKS_EXCLUDED(mu_);
  // Records that stage `s` finished micro-batch `k` in `pass` with `status`.
  void Finish(Pass pass, int s, const absl::Status& status)
      ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<int>& Done(Pass pass) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const int num_stages_;
  const int num_micro_batches_;

  absl::Mutex mu_;
  absl::CondVar progress_;  // signalled whenever a step finishes
  // Micro-batches each stage has finished, per pass (a stage finishes them
  // in order, so a count says which).
  std::vector<int> forward_done_ ABSL_GUARDED_BY(mu_);
  std::vector<int> backward_done_ ABSL_GUARDED_BY(mu_);
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  // The failure of each stage (OK where none).
  std::vector<absl::Status> status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_MODEL_PIPELINE_SCHEDULER_H_
