// CancellationToken: the one way a long-running operation learns that it
// should stop (a job cancelled by a user, a worker told to stop, a server
// shutting down). Replaces raw `std::atomic<bool>*` flags.
//
// Thread-safe. Cancel() may be called from any thread, any number of times;
// the first call wins. Callbacks run exactly once: on the thread that calls
// Cancel() (outside the token's lock), or at once in AddCallback() on the
// calling thread when the token is already cancelled.
//
//   common::CancellationToken token;
//   int id = token.AddCallback([&ctx] { ctx.TryCancel(); });  // e.g. an RPC
//   ...
//   token.RemoveCallback(id);  // before ctx goes away; waits for a running callback
#ifndef TOWERPS_COMMON_CANCELLATION_H_
#define TOWERPS_COMMON_CANCELLATION_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace towerps::common {

class CancellationToken {
 public:
  CancellationToken() = default;
  CancellationToken(const CancellationToken&) = delete;
  CancellationToken& operator=(const CancellationToken&) = delete;

  // Cancels, recording `reason` (the first reason given is kept), and runs
  // the registered callbacks. Idempotent.
  void Cancel(absl::string_view reason = "cancelled");

  bool cancelled() const { return notification_.HasBeenNotified(); }

  // OK, or CANCELLED "<what>: <reason>" once cancelled.
  absl::Status Check(absl::string_view what = "") const;

  // Blocks until cancelled or `timeout` passes. Returns true if cancelled.
  // Use it instead of absl::SleepFor in retry and poll loops.
  bool WaitFor(absl::Duration timeout) const;

  // Registers `callback`; runs it at once (and returns -1) if already
  // cancelled, and then cancelled() is true already: a waiter may register a
  // wake-up callback, check cancelled() and sleep without missing the wake. The id removes it again. Const: being told is observing, so a
  // holder of a const token (one that may not cancel it) may register too.
  int64_t AddCallback(std::function<void()> callback) const;

  // Unregisters a callback. If Cancel() is running it on another thread, waits
  // until it has returned, so what it touches may be destroyed after this.
  // (Called from a callback itself, it returns at once.)
  void RemoveCallback(int64_t id) const;

 private:
  absl::Notification notification_;
  mutable absl::Mutex mu_;
  std::string reason_ ABSL_GUARDED_BY(mu_);
  bool cancelling_ ABSL_GUARDED_BY(mu_) = false;
  bool callbacks_done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread::id cancel_thread_ ABSL_GUARDED_BY(mu_);  // Runs the callbacks.
  mutable int64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  mutable std::map<int64_t, std::function<void()>> callbacks_ ABSL_GUARDED_BY(mu_);
};

// Registers a callback for the lifetime of this object. `token` may be null
// (nothing is registered).
class ScopedCancellationCallback {
 public:
  ScopedCancellationCallback(const CancellationToken* token, std::function<void()> callback);
  ~ScopedCancellationCallback();
  ScopedCancellationCallback(const ScopedCancellationCallback&) = delete;
  ScopedCancellationCallback& operator=(const ScopedCancellationCallback&) = delete;

 private:
  const CancellationToken* token_;  // Not owned; may be null.
  int64_t id_ = -1;
};

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_CANCELLATION_H_
