#include "worker/train/worker_service.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/thread_name.h"

namespace towerps::worker {

WorkerRuntime::WorkerRuntime(WorkerEnv env) : env_(std::move(env)) {
  absl::MutexLock lock(&mu_);
  status_.set_task_index(env_.cluster.task_index);
  status_.set_state(v1::WORK_IDLE);
}

WorkerRuntime::~WorkerRuntime() {
  Stop("", absl::Seconds(30));
  std::thread t;
  {
    absl::MutexLock lock(&mu_);
    t = std::move(thread_);
  }
  if (t.joinable()) t.join();
}

absl::Status WorkerRuntime::Start(const v1::StartJobRequest& request, JobHooks hooks) {
  if (request.job().job_id().empty()) {
    return absl::InvalidArgumentError("start: the job has no job_id");
  }
  absl::MutexLock lock(&mu_);
  if (status_.state() == v1::WORK_RUNNING) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", env_.cluster.task_index, " is running job \"", status_.job_id(),
        "\" (attempt ", status_.attempt(), ")"));
  }
  // The previous job's thread has set its final state, its last use of mu_:
  // it is exiting, and joining it here cannot deadlock. After the join, no
  // thread uses the counters and they can be reset.
  if (thread_.joinable()) thread_.join();
  cancel_ = std::make_shared<common::CancellationToken>();
  last_step_ = 0;
  iterations_ = 0;
  hooks.cancel = cancel_.get();
  hooks.last_step = &last_step_;
  hooks.iterations = &iterations_;
  status_.set_job_id(request.job().job_id());
  status_.set_attempt(request.attempt());
  status_.set_state(v1::WORK_RUNNING);
  status_.clear_error();
  status_.set_error_code(0);
  status_.set_towers(request.job().towers());
  thread_ = std::thread([this, request, hooks]() mutable {
    common::SetCurrentThreadName("job");
    Run(std::move(request), std::move(hooks));
  });
  TLOG(INFO) << "worker " << env_.cluster.task_index << ": starting job \""
             << request.job().job_id() << "\" attempt " << request.attempt()
             << (request.restore_from().empty() ? "" : " from " + request.restore_from());
  return absl::OkStatus();
}

void WorkerRuntime::Run(v1::StartJobRequest request, JobHooks hooks) {
  absl::StatusOr<TrainResult> result =
      RunJob(env_, request.job(), request.restore_from(), hooks);
  absl::MutexLock lock(&mu_);
  if (result.ok()) {
    status_.set_state(v1::WORK_DONE);
    TLOG(INFO) << "worker " << env_.cluster.task_index << ": job \"" << request.job().job_id()
               << "\" done: " << result->iterations << " iterations, step "
               << result->global_steps;
  } else if (hooks.cancel->cancelled()) {
    status_.set_state(v1::WORK_STOPPED);
    TLOG(INFO) << "worker " << env_.cluster.task_index << ": job \"" << request.job().job_id()
               << "\" stopped";
  } else {
    status_.set_state(v1::WORK_FAILED);
    status_.set_error(std::string(result.status().message()));
    // Our token did not fire: a CANCELLED came from a peer (a ps stopping
    // mid-call) and is a lost peer to the chief, never a user's cancel.
    absl::StatusCode code = result.status().code();
    if (code == absl::StatusCode::kCancelled) code = absl::StatusCode::kUnavailable;
    status_.set_error_code(static_cast<int32_t>(code));
    TLOG(WARNING) << "worker " << env_.cluster.task_index << ": job \""
                  << request.job().job_id() << "\" failed: " << result.status();
  }
}

bool WorkerRuntime::Stop(const std::string& job_id, absl::Duration wait) {
  std::shared_ptr<common::CancellationToken> cancel;
  {
    absl::MutexLock lock(&mu_);
    if (status_.state() != v1::WORK_RUNNING) return false;
    if (!job_id.empty() && status_.job_id() != job_id) return false;
    cancel = cancel_;
  }
  cancel->Cancel("job cancelled");  // outside mu_: it runs callbacks
  const absl::Time deadline = absl::Now() + wait;
  absl::MutexLock lock(&mu_);
  auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return status_.state() != v1::WORK_RUNNING;
  };
  mu_.AwaitWithDeadline(absl::Condition(&stopped), deadline);
  return true;
}

v1::WorkerStatus WorkerRuntime::Status() const {
  absl::MutexLock lock(&mu_);
  v1::WorkerStatus s = status_;
  s.set_uptime_s(absl::ToDoubleSeconds(absl::Now() - started_));
  s.set_last_step(last_step_);
  s.set_iterations(iterations_);
  for (const auto* d : env_.devices->devices()) {
    v1::DeviceInfo* info = s.add_devices();
    info->set_name(d->name());
    info->set_type(d->type());
    info->set_physical(absl::StrCat(d->type(), ":", d->physical_index()));
    info->set_memory_limit_bytes(d->memory_limit());
    info->set_memory_in_use_bytes(d->bytes_in_use());
  }
  return s;
}

grpc::Status WorkerServiceImpl::StartJob(grpc::ServerContext*, const v1::StartJobRequest* request,
                                         v1::StartJobResponse*) {
  return common::ToGrpcStatus(runtime_.Start(*request));
}

grpc::Status WorkerServiceImpl::StopJob(grpc::ServerContext*, const v1::StopJobRequest* request,
                                        v1::StopJobResponse* response) {
  response->set_was_running(runtime_.Stop(request->job_id()));
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::GetStatus(grpc::ServerContext*, const v1::WorkerStatusRequest*,
                                          v1::WorkerStatus* response) {
  *response = runtime_.Status();
  return grpc::Status::OK;
}

}  // namespace towerps::worker
