#include "common/cancellation.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace towerps::common {

void CancellationToken::Cancel(absl::string_view reason) {
  std::map<int64_t, std::function<void()>> callbacks;
  {
    absl::MutexLock lock(&mu_);
    if (cancelling_) return;
    cancelling_ = true;
    cancel_thread_ = std::this_thread::get_id();
    reason_ = std::string(reason);
    callbacks.swap(callbacks_);
    // Under mu_, with cancelling_: a callback added from now on runs at once
    // in AddCallback, and its caller must then see cancelled(), or a waiter
    // that registered a wake-up callback, found cancelled() false and went to
    // sleep would never wake (found by the job_service fuzzer: a chief's
    // shutdown hung joining its runner).
    notification_.Notify();
  }
  // Callbacks run outside the lock (they may call back into this token, e.g.
  // RemoveCallback of another id).
  for (auto& [id, callback] : callbacks) callback();
  absl::MutexLock lock(&mu_);
  callbacks_done_ = true;
}

absl::Status CancellationToken::Check(absl::string_view what) const {
  if (!cancelled()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  return absl::CancelledError(what.empty() ? reason_ : absl::StrCat(what, ": ", reason_));
}

bool CancellationToken::WaitFor(absl::Duration timeout) const {
  return notification_.WaitForNotificationWithTimeout(timeout);
}

int64_t CancellationToken::AddCallback(std::function<void()> callback) const {
  {
    absl::MutexLock lock(&mu_);
    if (!cancelling_) {
      const int64_t id = next_id_++;
      callbacks_.emplace(id, std::move(callback));
      return id;
    }
  }
  callback();
  return -1;
}

void CancellationToken::RemoveCallback(int64_t id) const {
  absl::MutexLock lock(&mu_);
  if (callbacks_.erase(id) > 0 || !cancelling_) return;
  if (cancel_thread_ == std::this_thread::get_id()) return;  // from a callback
  // Cancel() took it and may be running it now: wait until all have run.
  mu_.Await(absl::Condition(&callbacks_done_));
}

ScopedCancellationCallback::ScopedCancellationCallback(const CancellationToken* token,
                                                       std::function<void()> callback)
    : token_(token) {
  if (token_ != nullptr) id_ = token_->AddCallback(std::move(callback));
}

ScopedCancellationCallback::~ScopedCancellationCallback() {
  if (token_ != nullptr && id_ >= 0) token_->RemoveCallback(id_);
}

}  // namespace towerps::common
