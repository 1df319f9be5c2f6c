// ChiefHooks: the callbacks the chief's own worker trains with. They turn
// its progress into the job's record and events (metrics), TensorBoard
// scalars and histograms, and checkpoints on the job's schedule.
//
// Thread-safe. BeginJob/EndJob bracket one job (one at a time); For() is
// called at each attempt's StartJob. The store and checkpointer are not
// owned and must outlive it.
#ifndef TOWERPS_WORKER_CHIEF_CHIEF_HOOKS_H_
#define TOWERPS_WORKER_CHIEF_CHIEF_HOOKS_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/storage/event_writer.h"
#include "proto/worker.pb.h"
#include "worker/chief/checkpointer.h"
#include "worker/chief/job_store.h"
#include "worker/train/job_runner.h"

namespace towerps::worker {

class ChiefHooks {
 public:
  ChiefHooks(JobStore& store, Checkpointer& checkpointer);

  // Opens the job's TensorBoard writer (a failure is an event of the job).
  void BeginJob(const v1::JobSpec& spec);
  // Flushes and closes it.
  void EndJob();

  // The hooks of one attempt of request.job().
  JobHooks For(const v1::StartJobRequest& request);

 private:
  void OnMetrics(const std::string& job_id, const v1::Metrics& m, bool epoch_end,
                 common::EventWriter* tb);

  JobStore& store_;
  Checkpointer& checkpointer_;
  absl::Mutex mu_;
  std::shared_ptr<common::EventWriter> tb_ ABSL_GUARDED_BY(mu_);  // Null: none.
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_CHIEF_CHIEF_HOOKS_H_
