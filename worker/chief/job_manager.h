// The chief's job queue: jobs are submitted, validated, queued, and run one
// after another on the cluster's ps and worker processes; each job's
// variables live in their own namespace (its job_id) on the servers and are
// freed when it ends or is cancelled.
//
// Job records and their events are kept under `state_dir` and survive a
// restart of the chief; a job that was running when the chief stopped is
// queued again and resumes from its latest checkpoint.
//
// Life of a job:
//
//   QUEUED --(runner picks it)--> RUNNING --(every worker done)--> SUCCEEDED
//     |                            |  ^
//     | Cancel                     |  | retryable failure (a ps or worker lost):
//     v                            |  | restart from the latest checkpoint,
//   CANCELLED <--------- Cancel ---+  | at most max_restarts times
//                                  +--+--> FAILED (other errors, or too many)
//
// The parts, one job each: JobStore (queue + records + events on disk),
// Dispatcher (one attempt on the workers and servers), recovery (the restart
// decision), ChiefHooks + Checkpointer (the chief's own worker's callbacks),
// live_status (GetJob's live part), job_watch (Watch), exporter (Export).
// Workers and servers are reached through WorkerClient and PsControl; the
// chief's own worker is an in-process WorkerClient like any other.
//
// Thread-safe. No lock is held across an RPC.
#ifndef TOWERPS_WORKER_CHIEF_JOB_MANAGER_H_
#define TOWERPS_WORKER_CHIEF_JOB_MANAGER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/cluster_spec.h"
#include "common/rpc_security.h"
#include "proto/job.pb.h"
#include "proto/job_service.pb.h"
#include "worker/chief/ps_control.h"
#include "worker/chief/submission.h"  // ValidateSubmission, part of this API.
#include "worker/chief/worker_client.h"
#include "worker/train/worker_service.h"

namespace towerps::worker {

struct JobManagerOptions {
  common::ClusterSpec cluster;  // REQUIRED; this task is the chief.
  // REQUIRED: job records, events, default dirs. Every checkpoint and
  // TensorBoard dir a job names must lie under it (a relative one is below
  // it); made absolute against the current directory.
  std::string state_dir;
  // Where data.dir may point, besides state_dir (--data_root).
  std::vector<std::string> data_roots = {"/usr/share/datasets"};
  // The chief's own worker. Not owned. REQUIRED unless `worker_factory` is set.
  WorkerRuntime* local = nullptr;
  // How often the runner polls workers while a job runs.
  absl::Duration poll_interval = absl::Milliseconds(200);
  // A worker unreachable this long fails the attempt (retryable).
  absl::Duration worker_lost_after = absl::Seconds(15);
  // Longest wait for a server or worker to answer control RPCs.
  absl::Duration control_timeout = absl::Minutes(5);
  // Wait before restarting a failed attempt.
  absl::Duration restart_backoff = absl::Seconds(1);
  // Most jobs QUEUED at once (--max_queued_jobs): a submit beyond it is
  // refused with ResourceExhausted naming the flag (issue 15, limits).
  // Concurrent submits may pass it by the number of callers racing.
  int max_queued_jobs = 100;
  // A worker's --memory_budget_bytes (the chief's own, taken for every
  // worker's): a submitted model over it is refused (ValidateSubmission).
  int64_t worker_budget_bytes = INT64_MAX;
  // Called once per submit refused by a limit, with the limit's name:
  // "max_queued_jobs", "memory_budget_bytes" (worker_budget_bytes), or
  // "spec_limits" for a spec over a size bound (for
  // towerps_refusals_total). Optional.
  std::function<void(const std::string& reason)> on_refusal;
  // TLS and token of the channels to the servers and workers. Default:
  // plaintext, no token.
  std::shared_ptr<const common::RpcSecurity> security = common::RpcSecurity::Insecure();

  // Seams for tests. Default: gRPC clients to the cluster's addresses, and
  // `local` in-process (with `hooks`) for the chief's own task.
  std::function<std::unique_ptr<PsControl>(int ps_task)> ps_factory;
  std::function<std::unique_ptr<WorkerClient>(int task, JobHooksProvider hooks)> worker_factory;
};

class JobManager {
 public:
  static absl::StatusOr<std::unique_ptr<JobManager>> Create(JobManagerOptions options);
  // Shutdown(0): stops the running job without waiting for a step boundary.
  ~JobManager();

  // Stops the queue (no job is taken any more), then stops the running job,
  // if any: waits up to `checkpoint_timeout` for its next step boundary,
  // where the job's checkpoint is written (SYNC: every server at that step),
  // then stops its workers. The job is QUEUED again with resume set, first in
  // line, so that a restarted chief resumes it from that checkpoint (or the
  // latest one, if no boundary came in time or the save failed; an event
  // says which). Joins the runner. Idempotent; the manager takes no job after.
  void Shutdown(absl::Duration checkpoint_timeout);

  // Loads the store and starts the runner thread.
  absl::Status Start();

  // InvalidArgument naming the field for a bad spec; AlreadyExists for a
  // job_id in use; NotFound for an unknown resume_job_id; FailedPrecondition
  // to resume a job that is queued or running.
  absl::StatusOr<v1::JobRecord> Submit(const v1::SubmitJobRequest& request);
  std::vector<v1::JobRecord> List();
  // NotFound for an unknown job. The live part queries the servers.
  absl::StatusOr<v1::GetJobResponse> Get(const std::string& job_id);
  // Queued: cancelled at once. Running: stopped within seconds (workers
  // stopped, variables freed) and then CANCELLED. Ended: FailedPrecondition.
  absl::StatusOr<v1::JobRecord> Cancel(const std::string& job_id);
  // Sends the events after `after_seq`; with `follow`, keeps sending until the
  // job has ended or `write` returns false or `stop()` is true.
  absl::Status Watch(const std::string& job_id, int64_t after_seq, bool follow,
                     const std::function<bool(const v1::JobEvent&)>& write,
                     const std::function<bool()>& stop);
  v1::ClusterResponse Cluster();
  // The weights of the job's latest valid checkpoint, variable by variable in
  // the model's order, in chunks of at most `chunk_bytes`.
  absl::Status Export(const std::string& job_id, int64_t chunk_bytes,
                      const std::function<bool(const v1::ExportChunk&)>& write);

  class Impl;

 private:
  explicit JobManager(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_CHIEF_JOB_MANAGER_H_
