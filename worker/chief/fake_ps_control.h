// FakePsControl: an in-memory parameter server's control surface with real
// semantics (jobs are held until deleted; only a held job can be saved) and
// error injection (unreachable), for the chief's unit tests.
//
// Thread-safe: tests drive it while the chief's threads call it.
#ifndef TOWERPS_WORKER_CHIEF_FAKE_PS_CONTROL_H_
#define TOWERPS_WORKER_CHIEF_FAKE_PS_CONTROL_H_

#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/chief/ps_control.h"

namespace towerps::worker {

class FakePsControl : public PsControl {
 public:
  explicit FakePsControl(int task_index = 0);

  absl::StatusOr<v1::DeleteJobResponse> DeleteJob(const std::string& job_id,
                                                  absl::Duration timeout) override;
  absl::StatusOr<v1::SaveResponse> SaveCheckpoint(const v1::SaveRequest& request,
                                                  absl::Duration timeout) override;
  absl::StatusOr<v1::StatusResponse> GetStatus(const std::string& job_id,
                                               absl::Duration timeout) override;

  // The server holds `job_id` at `global_step`, with a step open for
  // `step_open_s` seconds waiting for `waiting_for`.
  void SetJob(const std::string& job_id, int64_t global_step, double step_open_s = 0,
              std::vector<int> waiting_for = {});
  // The server's JobStatus.updates_skipped for `job_id` (held: SetJob first).
  void SetUpdatesSkipped(const std::string& job_id, int64_t skipped);
  // While unreachable every call answers Unavailable "ps N unreachable".
  void SetUnreachable(bool unreachable);
  // The server's StatusResponse.memory_budget_bytes / _reserved_bytes.
  void SetBudget(int64_t budget_bytes, int64_t reserved_bytes);

  int deletes() const;
  int saves() const;
  bool holds(const std::string& job_id) const;

 private:
  const int task_index_;
  mutable absl::Mutex mu_;
  std::map<std::string, v1::JobStatus> jobs_ ABSL_GUARDED_BY(mu_);
  bool unreachable_ ABSL_GUARDED_BY(mu_) = false;
  int64_t budget_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int deletes_ ABSL_GUARDED_BY(mu_) = 0;
  int saves_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_CHIEF_FAKE_PS_CONTROL_H_
