// FakeWorkerClient: an in-memory worker with real semantics (one job at a
// time; a stopped job is WORK_STOPPED) and error injection, for the chief's
// unit tests.
//
// Thread-safe: tests drive them while the chief's threads call them.
#ifndef TOWERPS_WORKER_CHIEF_FAKE_WORKER_CLIENT_H_
#define TOWERPS_WORKER_CHIEF_FAKE_WORKER_CLIENT_H_

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/chief/worker_client.h"

namespace towerps::worker {

class FakeWorkerClient : public WorkerClient {
 public:
  // What a started job does by itself.
  enum class OnStart { kRun, kFinish, kFail };

  explicit FakeWorkerClient(int task_index = 0);

  absl::Status StartJob(const v1::StartJobRequest& request) override;
  absl::Status StopJob(const std::string& job_id) override;
  absl::StatusOr<v1::WorkerStatus> GetStatus(absl::Duration timeout) override;

  // kFail: every started attempt fails at once with `error`.
  void SetOnStart(OnStart what, absl::Status error = absl::OkStatus());
  // The running attempt ends: done, or failed with `error`.
  void Finish();
  void Fail(const absl::Status& error);
  // While unreachable every call answers Unavailable "worker N unreachable".
  void SetUnreachable(bool unreachable);
  // The next `times` StartJob calls answer `error`.
  void FailStarts(const absl::Status& error, int times);

  int starts() const;
  int stops() const;
  v1::WorkerStatus status() const;
  // Blocks until `starts() >= n` or `timeout`; returns whether it got there.
  bool AwaitStarts(int n, absl::Duration timeout) const;

 private:
  const int task_index_;
  mutable absl::Mutex mu_;
  v1::WorkerStatus status_ ABSL_GUARDED_BY(mu_);
  OnStart on_start_ ABSL_GUARDED_BY(mu_) = OnStart::kRun;
  absl::Status on_start_error_ ABSL_GUARDED_BY(mu_);
  bool unreachable_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status start_error_ ABSL_GUARDED_BY(mu_);
  int start_errors_left_ ABSL_GUARDED_BY(mu_) = 0;
  int starts_ ABSL_GUARDED_BY(mu_) = 0;
  int stops_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_CHIEF_FAKE_WORKER_CLIENT_H_
