// WorkerClient: the chief's narrow view of one worker task (start, stop and
// poll one job's part), whether the worker is another process (gRPC) or the
// chief's own worker running in-process. The dispatcher treats both alike.
//
// Implementations are thread-safe. Calls block until the worker answers or
// the call's deadline passes; none takes a lock of the caller's.
#ifndef TOWERPS_WORKER_CHIEF_WORKER_CLIENT_H_
#define TOWERPS_WORKER_CHIEF_WORKER_CLIENT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc_security.h"
#include "proto/worker.pb.h"
#include "worker/train/job_runner.h"
#include "worker/train/worker_service.h"

namespace towerps::worker {

class WorkerClient {
 public:
  virtual ~WorkerClient() = default;

  // Starts the worker's part of request.job() and returns once it runs.
  // FailedPrecondition if the worker still runs a job; InvalidArgument for a
  // job it cannot run; Unavailable / DeadlineExceeded when it does not answer.
  virtual absl::Status StartJob(const v1::StartJobRequest& request) = 0;

  // Asks the worker to stop `job_id` (any job if empty) and waits (bounded)
  // until it has stopped. OK also when nothing was running.
  virtual absl::Status StopJob(const std::string& job_id) = 0;

  // The worker's current state; Unavailable / DeadlineExceeded when it does
  // not answer within `timeout`.
  virtual absl::StatusOr<v1::WorkerStatus> GetStatus(absl::Duration timeout) = 0;
};

// Builds the callbacks (metrics, checkpoints, TensorBoard) the chief's own
// worker runs with, for one attempt.
using JobHooksProvider = std::function<JobHooks(const v1::StartJobRequest&)>;

// A worker process at `address` ("host:port"). StartJob waits for the
// channel to be ready for up to 5 s; StopJob up to 35 s.
std::unique_ptr<WorkerClient> NewGrpcWorkerClient(
    const std::string& address, std::shared_ptr<const common::RpcSecurity> security);

// The chief's own worker: `runtime` (not owned, must outlive the client)
// runs each job with the hooks `hooks(request)` returns.
std::unique_ptr<WorkerClient> NewInProcessWorkerClient(WorkerRuntime& runtime,
                                                       JobHooksProvider hooks);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_CHIEF_WORKER_CLIENT_H_
