// Dispatcher: runs one attempt of a job on the cluster's workers and
// servers, through WorkerClient and PsControl (no gRPC here):
//
//   free the job on every ps (a clean namespace)
//     -> StartJob on every worker (`start_last` after the others: the
//        chief's own worker registers the variables)
//     -> poll the workers every poll_interval until every one is done
//        (OK), one fails, one is lost, or `cancel` fires
//     -> on failure or cancel: stop every worker, free the job everywhere.
//
// Thread-safe: holds no state between calls but its constant clients.
// The clients are not owned and must outlive the dispatcher.
#ifndef TOWERPS_WORKER_CHIEF_DISPATCHER_H_
#define TOWERPS_WORKER_CHIEF_DISPATCHER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "proto/ps.pb.h"
#include "proto/worker.pb.h"
#include "worker/chief/ps_control.h"
#include "worker/chief/worker_client.h"

namespace towerps::worker {

struct DispatcherOptions {
  // How often workers are polled while an attempt runs. Default: 200 ms.
  absl::Duration poll_interval = absl::Milliseconds(200);
  // A worker unreachable this long fails the attempt (Unavailable).
  // Default: 15 s.
  absl::Duration worker_lost_after = absl::Seconds(15);
  // Longest wait for a server or worker to answer a start or a delete.
  // Default: 5 min.
  absl::Duration control_timeout = absl::Minutes(5);
  // The chief's own worker (-1: none): started after the others, since it
  // registers the variables; its errors are annotated "chief" rather than
  // "worker N". Default: 0.
  int start_last = 0;
};

class Dispatcher {
 public:
  Dispatcher(std::vector<WorkerClient*> workers, std::vector<PsControl*> ps,
             DispatcherOptions options);

  int num_workers() const { return static_cast<int>(workers_.size()); }
  int num_ps() const { return static_cast<int>(ps_.size()); }

  // One attempt of request.job(). OK when every worker reports WORK_DONE
  // (the job is still held by the servers: see ShardStatuses, FreeOnce).
  // Errors, after stopping every worker:
  //   CANCELLED when `cancel` fires (also frees the job on the servers);
  //   a worker's own error code and "worker N: <error>" when it fails;
  //   ABORTED "worker N is not running the job (restarted?)" or
  //     "worker N stopped";
  //   UNAVAILABLE "worker N unreachable for <d>: ..." after worker_lost_after;
  //   a start's error annotated "worker N" (or "chief"); a delete's "ps N".
  absl::Status RunAttempt(const v1::StartJobRequest& request,
                          const common::CancellationToken& cancel);

  // Frees the job on every ps, retrying each until it confirms (a ps that
  // is down comes back without the job) or control_timeout or `cancel`.
  absl::Status FreeEverywhere(const std::string& job_id, const common::CancellationToken* cancel);
  // One best-effort try per ps.
  void FreeOnce(const std::string& job_id);

  // Asks every worker to stop the job and frees it on the servers (which
  // wakes pulls blocked on it); returns once the workers have stopped.
  void StopEverywhere(const std::string& job_id);

  // Every ps's status of the job (a default JobStatus where it does not
  // answer or does not hold it).
  std::vector<v1::JobStatus> ShardStatuses(const std::string& job_id, absl::Duration timeout);

 private:
  absl::Status StartAll(const v1::StartJobRequest& request,
                        const common::CancellationToken& cancel);
  absl::Status StartOne(int w, const v1::StartJobRequest& request,
                        const common::CancellationToken& cancel);
  // One round of GetStatus: OK (with *all_done once every worker is done)
  // or the attempt's failure as RunAttempt returns it.
  absl::Status PollOnce(const v1::StartJobRequest& request, std::vector<absl::Time>& last_seen,
                        bool* all_done);

  const std::vector<WorkerClient*> workers_;  // Not owned.
  const std::vector<PsControl*> ps_;          // Not owned.
  const DispatcherOptions options_;
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_CHIEF_DISPATCHER_H_
