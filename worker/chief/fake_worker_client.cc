#include "worker/chief/fake_worker_client.h"

#include "absl/strings/str_cat.h"

namespace towerps::worker {

FakeWorkerClient::FakeWorkerClient(int task_index) : task_index_(task_index) {
  absl::MutexLock lock(&mu_);
  status_.set_task_index(task_index);
}

absl::Status FakeWorkerClient::StartJob(const v1::StartJobRequest& request) {
  absl::MutexLock lock(&mu_);
  if (unreachable_) return absl::UnavailableError(absl::StrCat("worker ", task_index_, " unreachable"));
  if (start_errors_left_ > 0) {
    --start_errors_left_;
    return start_error_;
  }
  if (status_.state() == v1::WORK_RUNNING) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", task_index_, " is running job \"", status_.job_id(), "\""));
  }
  ++starts_;
  status_.set_job_id(request.job().job_id());
  status_.set_attempt(request.attempt());
  status_.set_error("");
  status_.set_error_code(0);
  switch (on_start_) {
    case OnStart::kRun:
      status_.set_state(v1::WORK_RUNNING);
      break;
    case OnStart::kFinish:
      status_.set_state(v1::WORK_DONE);
      break;
    case OnStart::kFail:
      status_.set_state(v1::WORK_FAILED);
      status_.set_error(std::string(on_start_error_.message()));
      status_.set_error_code(static_cast<int>(on_start_error_.code()));
      break;
  }
  return absl::OkStatus();
}

absl::Status FakeWorkerClient::StopJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  if (unreachable_) return absl::UnavailableError(absl::StrCat("worker ", task_index_, " unreachable"));
  ++stops_;
  if (status_.state() == v1::WORK_RUNNING && (job_id.empty() || job_id == status_.job_id())) {
    status_.set_state(v1::WORK_STOPPED);
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::WorkerStatus> FakeWorkerClient::GetStatus(absl::Duration) {
  absl::MutexLock lock(&mu_);
  if (unreachable_) return absl::UnavailableError(absl::StrCat("worker ", task_index_, " unreachable"));
  return status_;
}

void FakeWorkerClient::SetOnStart(OnStart what, absl::Status error) {
  absl::MutexLock lock(&mu_);
  on_start_ = what;
  on_start_error_ = std::move(error);
}

void FakeWorkerClient::Finish() {
  absl::MutexLock lock(&mu_);
  if (status_.state() == v1::WORK_RUNNING) status_.set_state(v1::WORK_DONE);
}

void FakeWorkerClient::Fail(const absl::Status& error) {
  absl::MutexLock lock(&mu_);
  if (status_.state() != v1::WORK_RUNNING) return;
  status_.set_state(v1::WORK_FAILED);
  status_.set_error(std::string(error.message()));
  status_.set_error_code(static_cast<int>(error.code()));
}

void FakeWorkerClient::SetUnreachable(bool unreachable) {
  absl::MutexLock lock(&mu_);
  unreachable_ = unreachable;
}

void FakeWorkerClient::FailStarts(const absl::Status& error, int times) {
  absl::MutexLock lock(&mu_);
  start_error_ = error;
  start_errors_left_ = times;
}

int FakeWorkerClient::starts() const {
  absl::MutexLock lock(&mu_);
  return starts_;
}

int FakeWorkerClient::stops() const {
  absl::MutexLock lock(&mu_);
  return stops_;
}

v1::WorkerStatus FakeWorkerClient::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

bool FakeWorkerClient::AwaitStarts(int n, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return starts_ >= n; };
  return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
}

// ---------------------------------------------------------------------------

FakePsControl::FakePsControl(int task_index) : task_index_(task_index) {}

absl::StatusOr<v1::DeleteJobResponse> FakePsControl::DeleteJob(const std::string& job_id,
                                                               absl::Duration) {
  absl::MutexLock lock(&mu_);
  if (unreachable_) return absl::UnavailableError(absl::StrCat("ps ", task_index_, " unreachable"));
  ++deletes_;
  v1::DeleteJobResponse response;
  response.set_existed(jobs_.erase(job_id) > 0);
  return response;
}

absl::StatusOr<v1::SaveResponse> FakePsControl::SaveCheckpoint(const v1::SaveRequest& request,
                                                               absl::Duration) {
  absl::MutexLock lock(&mu_);
  if (unreachable_) return absl::UnavailableError(absl::StrCat("ps ", task_index_, " unreachable"));
  auto it = jobs_.find(request.job_id());
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("job \"", request.job_id(), "\" not found"));
  }
  ++saves_;
  v1::SaveResponse response;
  response.set_path(absl::StrCat(request.checkpoint_dir(), "/shard-", task_index_));
  response.set_global_step(it->second.global_step());
  return response;
}

absl::StatusOr<v1::StatusResponse> FakePsControl::GetStatus(const std::string& job_id,
                                                            absl::Duration) {
  absl::MutexLock lock(&mu_);
  if (unreachable_) return absl::UnavailableError(absl::StrCat("ps ", task_index_, " unreachable"));
  v1::StatusResponse response;
  response.set_task_index(task_index_);
  for (const auto& [id, job] : jobs_) {
    if (job_id.empty() || id == job_id) *response.add_jobs() = job;
  }
  return response;
}

void FakePsControl::SetJob(const std::string& job_id, int64_t global_step, double step_open_s,
                           std::vector<int> waiting_for) {
  absl::MutexLock lock(&mu_);
  v1::JobStatus& job = jobs_[job_id];
  job.set_job_id(job_id);
  job.set_global_step(global_step);
  job.set_step_open_s(step_open_s);
  job.clear_waiting_for();
  for (int w : waiting_for) job.add_waiting_for(w);
}

void FakePsControl::SetUnreachable(bool unreachable) {
  absl::MutexLock lock(&mu_);
  unreachable_ = unreachable;
}

int FakePsControl::deletes() const {
  absl::MutexLock lock(&mu_);
  return deletes_;
}

int FakePsControl::saves() const {
  absl::MutexLock lock(&mu_);
  return saves_;
}

bool FakePsControl::holds(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  return jobs_.count(job_id) > 0;
}

}  // namespace towerps::worker
