// Checkpointer: writes a job's checkpoint (every ps its shard, then the
// manifest names it) and decides when the chief's training thread should.
//
// Thread-safe. The clients and the store are not owned and must outlive it.
#ifndef TOWERPS_WORKER_CHIEF_CHECKPOINTER_H_
#define TOWERPS_WORKER_CHIEF_CHECKPOINTER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/paths.h"
#include "proto/job.pb.h"
#include "worker/chief/job_store.h"
#include "worker/chief/ps_control.h"

namespace towerps::worker {

class Checkpointer {
 public:
  // `roots`: where checkpoint.dir may point (the chief's --state_dir). Not
  // owned; null: anywhere (tests).
  Checkpointer(std::vector<PsControl*> ps, JobStore& store,
               const common::PathRoots* roots = nullptr);

  // Every ps writes its shard of `job_id` under <spec.checkpoint.dir>/
  // ckpt-<step>; then the manifest names it as the checkpoint of `step` and
  // the job's record its checkpoint_step. A ps's error annotated "ps N".
  // InvalidArgument naming checkpoint.dir when it is outside the roots
  // (checked again here: the spec was checked at submit, but a record may
  // predate that, and links can change); nothing is asked of a ps then.
  absl::Status Save(const std::string& job_id, const v1::JobSpec& spec, int64_t step);

  // Periodic checkpoints that may fail in a row before the job fails.
  static constexpr int kMaxFailuresInARow = 3;

  // Per attempt, touched only by the chief's training thread.
  struct Schedule {
    int64_t last_step = -1;
    absl::Time last_time = absl::Now();
    int failures_in_a_row = 0;
  };
  // Called after each pull (SYNC: every server is at exactly `step`): saves
  // when checkpoint.every_steps or every_seconds says so. A failure is an
  // event of the job and the next scheduled checkpoint tries again; the
  // kMaxFailuresInARow-th failure in a row is returned (annotated with the
  // count), and the training fails with it. OK otherwise.
  absl::Status MaybeSave(const std::string& job_id, const v1::JobSpec& spec, int64_t step,
                         Schedule& schedule);

 private:
  // After a failed Save: removes <dir>/<name> (shards some servers wrote)
  // unless the MANIFEST lists it, so that nothing half-written is left that
  // looks like a checkpoint; an event says so.
  void RemovePartial(const std::string& job_id, const std::string& dir, const std::string& name);

  const std::vector<PsControl*> ps_;  // Not owned.
  JobStore& store_;
  const common::PathRoots* const roots_;  // Not owned; may be null.
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_CHIEF_CHECKPOINTER_H_
