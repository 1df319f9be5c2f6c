// Recovery: whether and how a failed attempt of a job is restarted.
//
// A failure that a restart from the latest checkpoint can cure (a ps or
// worker went away, or came back without the job: UNAVAILABLE, NOT_FOUND,
// ABORTED, DEADLINE_EXCEEDED) restarts the job, at most spec.max_restarts
// times; any other failure, or a cancel, ends it at once.
//
// Thread-compatible: plain functions of their arguments.
#ifndef TOWERPS_WORKER_CHIEF_RECOVERY_H_
#define TOWERPS_WORKER_CHIEF_RECOVERY_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "common/retry.h"
#include "proto/job.pb.h"

namespace towerps::worker {

// retry_on {UNAVAILABLE, NOT_FOUND, ABORTED, DEADLINE_EXCEEDED};
// max_attempts = the restarts left (spec.max_restarts - restarts_used, at
// least 0) + 1; a fixed `backoff` between attempts.
common::RetryPolicy RestartPolicy(const v1::JobSpec& spec, absl::Duration backoff,
                                  int restarts_used = 0);

// Only `own` (the job's token: a user's cancel, or the chief stopping) may
// end a job as cancelled. A CANCELLED that comes from elsewhere (a server or
// worker that stopped and cancelled its calls) while `own` has not fired is a
// lost peer like any other: UNAVAILABLE, with a note. Others pass unchanged.
absl::Status PeerCancelIsAFailure(const absl::Status& status,
                                  const common::CancellationToken* own);

// Runs `attempt(n)` for n = first_attempt, first_attempt + 1, ... until it
// returns OK, `policy` says to give up (the last failure is returned) or
// `cancel` fires (CANCELLED). A CANCELLED from an attempt while `cancel` has
// not fired is a failure (see PeerCancelIsAFailure) and restarts.
// `on_restart(n, failure, k)` is called before the k-th restart of this call
// (k = 1, 2, ...), after the backoff. `cancel` may be null.
absl::Status RunWithRestarts(
    const common::RetryPolicy& policy, const common::CancellationToken* cancel,
    const std::function<absl::Status(int attempt)>& attempt,
    const std::function<void(int attempt, const absl::Status& failure, int restart)>& on_restart,
    int first_attempt = 1);

// The checkpoint an attempt restores from.
struct RestorePoint {
  std::string dir;    // Empty: start from the initializers.
  int64_t step = -1;  // The checkpoint's step; -1 without one.
};
// For the first attempt of a new job: none. Otherwise (a restart, or a
// resumed job) the latest valid checkpoint under spec.checkpoint.dir; `log`
// receives a line on each skipped checkpoint and on the choice made.
RestorePoint ChooseRestorePoint(const v1::JobSpec& spec, int attempt,
                                const std::function<void(const std::string&)>& log);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_CHIEF_RECOVERY_H_
