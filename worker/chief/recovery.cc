#include "worker/chief/recovery.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/storage/checkpoint.h"

namespace towerps::worker {

common::RetryPolicy RestartPolicy(const v1::JobSpec& spec, absl::Duration backoff,
                                  int restarts_used) {
  common::RetryPolicy policy =
      common::RetryPolicy()
          .RetryingOn({absl::StatusCode::kUnavailable, absl::StatusCode::kNotFound,
                       absl::StatusCode::kAborted, absl::StatusCode::kDeadlineExceeded})
          .WithBackoff(backoff, backoff)
          .WithMaxAttempts(std::max(0, spec.max_restarts() - restarts_used) + 1);
  policy.multiplier = 1.0;
  policy.jitter = 0.0;
  return policy;
}

absl::Status PeerCancelIsAFailure(const absl::Status& status,
                                  const common::CancellationToken* own) {
  if (!absl::IsCancelled(status) || (own != nullptr && own->cancelled())) return status;
  return absl::UnavailableError(absl::StrCat(
      status.message(), " (CANCELLED by a peer, e.g. a stopping server; not a cancel of this job)"));
}

absl::Status RunWithRestarts(
    const common::RetryPolicy& policy, const common::CancellationToken* cancel,
    const std::function<absl::Status(int attempt)>& attempt,
    const std::function<void(int attempt, const absl::Status& failure, int restart)>& on_restart,
    int first_attempt) {
  common::Backoff backoff(policy, cancel);
  for (int n = first_attempt;; ++n) {
    const absl::Status result = PeerCancelIsAFailure(attempt(n), cancel);
    if (result.ok() || absl::IsCancelled(result)) return result;
    TOWERPS_RETURN_IF_ERROR(backoff.Wait(result));
    if (on_restart) on_restart(n, result, n - first_attempt + 1);
  }
}

RestorePoint ChooseRestorePoint(const v1::JobSpec& spec, int attempt,
                                const std::function<void(const std::string&)>& log) {
  RestorePoint point;
  if (attempt <= 1 && !spec.resume()) return point;
  auto latest = common::FindLatestValidCheckpoint(spec.checkpoint().dir(), log);
  if (latest.ok()) {
    point.dir = absl::StrCat(spec.checkpoint().dir(), "/", latest->dir_name);
    point.step = latest->step;
    log(absl::StrCat("restoring checkpoint ", latest->dir_name, " (step ", latest->step, ")"));
  } else {
    log(absl::StrCat("no usable checkpoint (", latest.status().message(),
                     "): starting from the initializers"));
  }
  return point;
}

}  // namespace towerps::worker
