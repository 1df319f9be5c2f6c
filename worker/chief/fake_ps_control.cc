#include "worker/chief/fake_ps_control.h"

#include "absl/strings/str_cat.h"

namespace towerps::worker {

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
  response.set_memory_budget_bytes(budget_bytes_);
  response.set_memory_reserved_bytes(reserved_bytes_);
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

void FakePsControl::SetUpdatesSkipped(const std::string& job_id, int64_t skipped) {
  absl::MutexLock lock(&mu_);
  jobs_[job_id].set_updates_skipped(skipped);
}

void FakePsControl::SetUnreachable(bool unreachable) {
  absl::MutexLock lock(&mu_);
  unreachable_ = unreachable;
}

void FakePsControl::SetBudget(int64_t budget_bytes, int64_t reserved_bytes) {
  absl::MutexLock lock(&mu_);
  budget_bytes_ = budget_bytes;
  reserved_bytes_ = reserved_bytes;
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
