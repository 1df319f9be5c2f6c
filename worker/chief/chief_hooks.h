// ChiefHooks: the callbacks the chief's own worker trains with. They turn
// its progress into the job's record and events (metrics), TensorBoard
// scalars and histograms, and checkpoints on the job's schedule.
//
// Thread-safe. BeginJob/EndJob bracket one job (one at a time); For() is
// called at each attempt's StartJob. The store and checkpointer are not
// owned and must outlive it.
#ifndef TOWERPS_WORKER_CHIEF_CHIEF_HOOKS_H_
#define TOWERPS_WORKER_CHIEF_CHIEF_HOOKS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/paths.h"
#include "common/storage/event_writer.h"
#include "proto/worker.pb.h"
#include "worker/chief/checkpointer.h"
#include "worker/chief/job_store.h"
#include "worker/train/job_runner.h"

namespace towerps::worker {

class ChiefHooks {
 public:
  // `roots`: where tensorboard_dir may point (the chief's --state_dir). Not
  // owned; null: anywhere (tests).
  ChiefHooks(JobStore& store, Checkpointer& checkpointer,
             const common::PathRoots* roots = nullptr);

  // Opens the job's TensorBoard writer (a failure, or a tensorboard_dir
  // outside the roots, is an event of the job: it trains without events).
  void BeginJob(const v1::JobSpec& spec);
  // Flushes and closes it.
  void EndJob();

  // The hooks of one attempt of request.job().
  JobHooks For(const v1::StartJobRequest& request);

  // What StopAtNextStep saw.
  struct StopResult {
    bool reached = false;         // The running job reached a step boundary.
    int64_t step = -1;            // That step (when reached).
    absl::Status checkpoint;      // Its checkpoint (OK when disabled by the spec).
  };
  // Shutdown: from now on, the chief's next pull of every attempt ends that
  // attempt cleanly. At that step boundary (SYNC: every server is at exactly
  // that step, and none can move on without the chief's push) the job's
  // checkpoint is written, and the attempt returns CANCELLED. Waits at most
  // `timeout` for it; returns at once, reached = false, when no job is
  // running (between BeginJob and EndJob). Terminal: the request stays set.
  StopResult StopAtNextStep(absl::Duration timeout);

 private:
  // Called by after_pull with mu_ held once a stop is requested: saves the
  // checkpoint of `step` (mu_ released around it) and reports the stop.
  absl::Status StopHere(const std::string& job_id, const v1::JobSpec& spec, int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnMetrics(const std::string& job_id, const v1::Metrics& m, bool epoch_end,
                 common::EventWriter* tb);

  JobStore& store_;
  Checkpointer& checkpointer_;
  const common::PathRoots* const roots_;  // Not owned; may be null.
  absl::Mutex mu_;
  std::shared_ptr<common::EventWriter> tb_ ABSL_GUARDED_BY(mu_);  // Null: none.
  bool job_active_ ABSL_GUARDED_BY(mu_) = false;  // Between BeginJob and EndJob.
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;  // An attempt stopped at a boundary.
  StopResult stop_result_ ABSL_GUARDED_BY(mu_);
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_CHIEF_CHIEF_HOOKS_H_
