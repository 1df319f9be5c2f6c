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

}  // namespace towerps::worker
