// RetryPolicy: the one vocabulary for asking again. Which status codes are
// worth another try, how long to wait between tries (exponential backoff with
// jitter), and when to give up (attempts, total time, cancellation). Every
// retry loop in the project is a Backoff or a call to Retry().
//
// Thread-compatible: a RetryPolicy is a value; a Backoff belongs to one loop.
#ifndef TOWERPS_COMMON_RETRY_H_
#define TOWERPS_COMMON_RETRY_H_

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/cancellation.h"

namespace towerps::common {

struct RetryPolicy {
  // Codes worth another try. Default: the transport's (UNAVAILABLE) and a
  // deadline that ran out (DEADLINE_EXCEEDED). ABORTED, NOT_FOUND and the rest
  // are a server's verdict and are not retried by default.
  std::vector<absl::StatusCode> retry_on = {absl::StatusCode::kUnavailable,
                                            absl::StatusCode::kDeadlineExceeded};
  // Wait before the second attempt. Default: 100 ms.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  // Longest wait between attempts. Default: 1 s.
  absl::Duration max_backoff = absl::Seconds(1);
  // Each wait is the previous one times this. Default: 2. REQUIRES: >= 1.
  double multiplier = 2.0;
  // Each wait is drawn uniformly from [1 - jitter, 1 + jitter] times the
  // nominal one, so that clients that failed together do not retry together.
  // Default: 0.2. REQUIRES: in [0, 1).
  double jitter = 0.2;
  // Attempts in all, the first included; 0 = unbounded. Default: 0.
  int max_attempts = 0;
  // Give up once this much time has passed since the first attempt.
  // Default: infinite.
  absl::Duration deadline = absl::InfiniteDuration();

  // True if `status` is not OK and its code is in retry_on.
  bool IsRetryable(const absl::Status& status) const;

  // The policy for calls to a peer that may be restarting: the defaults.
  static RetryPolicy Transport() { return RetryPolicy(); }
  // A copy with other codes retried.
  RetryPolicy RetryingOn(std::initializer_list<absl::StatusCode> codes) const;
  RetryPolicy WithMaxAttempts(int attempts) const;
  RetryPolicy WithDeadline(absl::Duration d) const;
  RetryPolicy WithBackoff(absl::Duration initial, absl::Duration max) const;
};

// The state of one retry loop:
//
//   common::Backoff backoff(policy, cancel);
//   while (true) {
//     absl::Status st = TryOnce();
//     if (st.ok()) break;
//     TOWERPS_RETURN_IF_ERROR(backoff.Wait(st));  // st, or a reason to stop
//   }
class Backoff {
 public:
  // `cancel` may be null; not owned, must outlive this.
  explicit Backoff(RetryPolicy policy, const CancellationToken* cancel = nullptr);

  // Called after a failed attempt with its status. Returns OK after waiting
  // the next delay: try again. Otherwise returns, at once or as soon as it
  // knows, why not:
  //   - `last` itself when it is not retryable or the attempts are used up;
  //   - CANCELLED (the token's reason) when cancelled, also during the wait;
  //   - DEADLINE_EXCEEDED "gave up after <deadline> (<n> attempts): <last>"
  //     when the deadline has passed or would pass during the wait.
  absl::Status Wait(const absl::Status& last);

  // Wait()'s decision without its wait, for an attempt that did its own
  // waiting (a long poll that ran out on the server): OK to try again at once,
  // else the same reasons to stop as Wait(). The delay does not grow.
  absl::Status AgainAtOnce(const absl::Status& last);

  // Like Wait() without the decision: waits the next delay (or until
  // cancelled: CANCELLED) whatever the last status. For poll loops.
  absl::Status Pause();

  // Back to the initial delay (e.g. after a call that made progress).
  void Reset();

  int attempts() const { return attempts_; }  // Failed attempts so far.
  absl::Duration elapsed() const { return absl::Now() - start_; }
  // The delay the next Wait() will use (before jitter).
  absl::Duration next_delay() const { return delay_; }

 private:
  absl::Duration NextDelay();
  // Counts the failed attempt `last`; returns why not to try again
  // (cancelled, not retryable, attempts used up), or OK.
  absl::Status Decide(const absl::Status& last);
  // DEADLINE_EXCEEDED if the deadline has passed or would pass during `wait`.
  absl::Status PastDeadline(const absl::Status& last, absl::Duration wait) const;

  const RetryPolicy policy_;
  const CancellationToken* cancel_;  // Not owned; may be null.
  const absl::Time start_;
  absl::Duration delay_;
  int attempts_ = 0;
  std::optional<std::mt19937_64> rng_;  // seeded at the first jittered delay
};

// Calls `attempt` until it returns OK or Backoff::Wait says stop; returns the
// last status (or the reason for stopping).
absl::Status Retry(const RetryPolicy& policy, const CancellationToken* cancel,
                   const std::function<absl::Status()>& attempt);

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_RETRY_H_
