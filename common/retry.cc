#include "common/retry.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"

namespace towerps::common {

bool RetryPolicy::IsRetryable(const absl::Status& status) const {
  return !status.ok() &&
         std::find(retry_on.begin(), retry_on.end(), status.code()) != retry_on.end();
}

RetryPolicy RetryPolicy::RetryingOn(std::initializer_list<absl::StatusCode> codes) const {
  RetryPolicy p = *this;
  p.retry_on.assign(codes.begin(), codes.end());
  return p;
}

RetryPolicy RetryPolicy::WithMaxAttempts(int attempts) const {
  RetryPolicy p = *this;
  p.max_attempts = attempts;
  return p;
}

RetryPolicy RetryPolicy::WithDeadline(absl::Duration d) const {
  RetryPolicy p = *this;
  p.deadline = d;
  return p;
}

RetryPolicy RetryPolicy::WithBackoff(absl::Duration initial, absl::Duration max) const {
  RetryPolicy p = *this;
  p.initial_backoff = initial;
  p.max_backoff = max;
  return p;
}

Backoff::Backoff(RetryPolicy policy, const CancellationToken* cancel)
    : policy_(std::move(policy)),
      cancel_(cancel),
      start_(absl::Now()),
      delay_(policy_.initial_backoff) {}

void Backoff::Reset() { delay_ = policy_.initial_backoff; }

absl::Duration Backoff::NextDelay() {
  const absl::Duration nominal = delay_;
  delay_ = std::min(policy_.max_backoff, delay_ * std::max(1.0, policy_.multiplier));
  if (policy_.jitter <= 0) return nominal;
  // Seeded at the first jittered delay, not at construction: a Backoff is
  // made for every call, and most calls never back off (std::random_device
  // was 0.7% of a local MLP cluster's CPU samples, perf).
  if (!rng_.has_value()) rng_.emplace(std::random_device{}());
  std::uniform_real_distribution<double> factor(1.0 - policy_.jitter, 1.0 + policy_.jitter);
  return nominal * factor(*rng_);
}

absl::Status Backoff::Pause() {
  const absl::Duration d = NextDelay();
  if (cancel_ != nullptr) {
    if (cancel_->WaitFor(d)) return cancel_->Check();
    return absl::OkStatus();
  }
  absl::SleepFor(d);
  return absl::OkStatus();
}

absl::Status Backoff::Decide(const absl::Status& last) {
  ++attempts_;
  if (cancel_ != nullptr && cancel_->cancelled()) return cancel_->Check();
  if (!policy_.IsRetryable(last)) return last;
  if (policy_.max_attempts > 0 && attempts_ >= policy_.max_attempts) return last;
  return absl::OkStatus();
}

absl::Status Backoff::PastDeadline(const absl::Status& last, absl::Duration wait) const {
  if (absl::Now() - start_ + wait <= policy_.deadline) return absl::OkStatus();
  return absl::DeadlineExceededError(
      absl::StrCat("gave up after ", absl::FormatDuration(policy_.deadline), " (", attempts_,
                   attempts_ == 1 ? " attempt" : " attempts", "): ",
                   last.message().empty() ? absl::StatusCodeToString(last.code())
                                          : std::string(last.message())));
}

absl::Status Backoff::Wait(const absl::Status& last) {
  absl::Status st = Decide(last);
  if (!st.ok()) return st;
  const absl::Duration d = NextDelay();
  st = PastDeadline(last, d);
  if (!st.ok()) return st;
  if (cancel_ != nullptr) {
    if (cancel_->WaitFor(d)) return cancel_->Check();
  } else {
    absl::SleepFor(d);
  }
  return absl::OkStatus();
}

absl::Status Backoff::AgainAtOnce(const absl::Status& last) {
  const absl::Status st = Decide(last);
  if (!st.ok()) return st;
  return PastDeadline(last, absl::ZeroDuration());
}

absl::Status Retry(const RetryPolicy& policy, const CancellationToken* cancel,
                   const std::function<absl::Status()>& attempt) {
  Backoff backoff(policy, cancel);
  while (true) {
    if (cancel != nullptr) {
      absl::Status c = cancel->Check();
      if (!c.ok()) return c;
    }
    absl::Status st = attempt();
    if (st.ok()) return st;
    absl::Status next = backoff.Wait(st);
    if (!next.ok()) return next;
  }
}

}  // namespace towerps::common
