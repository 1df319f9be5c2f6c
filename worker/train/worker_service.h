// A worker as a long-running service: runs the jobs the chief sends, one at
// a time, each on its own thread, and reports its devices and progress.
//
// Lifecycle of one job on this worker:
//
//   IDLE/DONE/FAILED/STOPPED --Start--> RUNNING --(trainer returns)--> DONE | FAILED
//                                          |
//                                          +--Stop--> (cancel token; the trainer
//                                                      returns at its next step
//                                                      or wait) --> STOPPED
//
// WorkerRuntime is thread-safe. WorkerServiceImpl is its gRPC adapter.
#ifndef TOWERPS_WORKER_TRAIN_WORKER_SERVICE_H_
#define TOWERPS_WORKER_TRAIN_WORKER_SERVICE_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "proto/worker.grpc.pb.h"
#include "worker/train/job_runner.h"

namespace towerps::worker {

class WorkerRuntime {
 public:
  // `env.devices` must outlive the runtime.
  explicit WorkerRuntime(WorkerEnv env);
  // Stops a running job and joins its thread.
  ~WorkerRuntime();
  WorkerRuntime(const WorkerRuntime&) = delete;
  WorkerRuntime& operator=(const WorkerRuntime&) = delete;

  // Starts this worker's part of request.job on a new thread and returns.
  // `hooks` (the chief's callbacks) are used as given, except that the
  // cancellation flag and progress counters are the runtime's own.
  // FailedPrecondition if a job is running; InvalidArgument for a request
  // without a job_id.
  absl::Status Start(const v1::StartJobRequest& request, JobHooks hooks = {});

  // Asks the job to stop, then waits up to `wait` for its thread to end.
  // Returns whether `job_id` (or any job, if empty) was running.
  bool Stop(const std::string& job_id, absl::Duration wait = absl::Seconds(30));

  v1::WorkerStatus Status() const;

 private:
  void Run(v1::StartJobRequest request, JobHooks hooks);

  const WorkerEnv env_;
  const absl::Time started_ = absl::Now();

  mutable absl::Mutex mu_;
  std::thread thread_ ABSL_GUARDED_BY(mu_);
  v1::WorkerStatus status_ ABSL_GUARDED_BY(mu_);
  // The running job's; a new one at each Start, after the previous job's
  // thread has been joined.
  std::shared_ptr<common::CancellationToken> cancel_ ABSL_GUARDED_BY(mu_);
  // Shared with the running trainer; reset at each Start, after the previous
  // job's thread has been joined.
  std::atomic<int64_t> last_step_{0};
  std::atomic<int64_t> iterations_{0};
};

class WorkerServiceImpl final : public v1::WorkerService::Service {
 public:
  explicit WorkerServiceImpl(WorkerRuntime& runtime) : runtime_(runtime) {}
  grpc::Status StartJob(grpc::ServerContext*, const v1::StartJobRequest* request,
                        v1::StartJobResponse* response) override;
  grpc::Status StopJob(grpc::ServerContext*, const v1::StopJobRequest* request,
                       v1::StopJobResponse* response) override;
  grpc::Status GetStatus(grpc::ServerContext*, const v1::WorkerStatusRequest* request,
                         v1::WorkerStatus* response) override;

 private:
  WorkerRuntime& runtime_;
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_TRAIN_WORKER_SERVICE_H_
