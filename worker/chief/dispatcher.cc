#include "worker/chief/dispatcher.h"

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/parallel.h"
#include "common/retry.h"
#include "common/status.h"

namespace towerps::worker {
namespace {

constexpr absl::Duration kStatusTimeout = absl::Seconds(2);
constexpr absl::Duration kDeleteTimeout = absl::Seconds(2);

}  // namespace

Dispatcher::Dispatcher(std::vector<WorkerClient*> workers, std::vector<PsControl*> ps,
                       DispatcherOptions options)
    : workers_(std::move(workers)), ps_(std::move(ps)), options_(options) {}

absl::Status Dispatcher::RunAttempt(const v1::StartJobRequest& request,
                                    const common::CancellationToken& cancel) {
  const std::string& id = request.job().job_id();
  TOWERPS_RETURN_IF_ERROR(FreeEverywhere(id, &cancel));
  if (absl::Status started = StartAll(request, cancel); !started.ok()) {
    StopEverywhere(id);
    return started;
  }
  // A fixed pace (no growth, no jitter) that a cancel cuts short.
  common::RetryPolicy pace = common::RetryPolicy().WithBackoff(options_.poll_interval,
                                                               options_.poll_interval);
  pace.multiplier = 1.0;
  pace.jitter = 0.0;
  common::Backoff poll(pace, &cancel);
  std::vector<absl::Time> last_seen(workers_.size(), absl::Now());
  while (true) {
    if (!poll.Pause().ok()) {
      StopEverywhere(id);
      return absl::CancelledError("cancelled");
    }
    bool all_done = false;
    absl::Status st = PollOnce(request, last_seen, &all_done);
    if (!st.ok()) {
      StopEverywhere(id);
      return st;
    }
    if (all_done) return absl::OkStatus();
  }
}

absl::Status Dispatcher::PollOnce(const v1::StartJobRequest& request,
                                  std::vector<absl::Time>& last_seen, bool* all_done) {
  const std::string& id = request.job().job_id();
  int done = 0;
  for (int w = 0; w < num_workers(); ++w) {
    absl::StatusOr<v1::WorkerStatus> s = workers_[w]->GetStatus(kStatusTimeout);
    if (!s.ok()) {
      if (absl::Now() - last_seen[w] > options_.worker_lost_after) {
        return absl::UnavailableError(absl::StrCat(
            "worker ", w, " unreachable for ", absl::FormatDuration(absl::Now() - last_seen[w]),
            ": ", s.status().message()));
      }
      continue;
    }
    last_seen[w] = absl::Now();
    if (s->job_id() != id || s->attempt() != request.attempt()) {
      // A restarted worker process lost the attempt.
      return absl::AbortedError(absl::StrCat("worker ", w, " is not running the job (restarted?)"));
    }
    if (s->state() == v1::WORK_FAILED) {
      // The worker's own stop reports WORK_STOPPED; a CANCELLED failure came
      // from one of its peers (a ps that stopped mid-call): a lost peer.
      absl::StatusCode code = static_cast<absl::StatusCode>(s->error_code());
      if (code == absl::StatusCode::kCancelled) code = absl::StatusCode::kUnavailable;
      return absl::Status(code, absl::StrCat("worker ", w, ": ", s->error()));
    }
    if (s->state() == v1::WORK_STOPPED) {
      return absl::AbortedError(absl::StrCat("worker ", w, " stopped"));
    }
    if (s->state() == v1::WORK_DONE) ++done;
  }
  *all_done = done == num_workers();
  return absl::OkStatus();
}

absl::Status Dispatcher::StartAll(const v1::StartJobRequest& request,
                                  const common::CancellationToken& cancel) {
  const int last = options_.start_last;
  std::vector<absl::Status> started = common::RunInParallel(num_workers(), [&](int w) {
    return w == last ? absl::OkStatus() : StartOne(w, request, cancel);
  });
  for (int w = 0; w < num_workers(); ++w) {
    if (!started[w].ok()) return common::Annotate(started[w], absl::StrCat("worker ", w));
  }
  if (last >= 0 && last < num_workers()) {
    TOWERPS_RETURN_IF_ERROR(
        common::Annotate(StartOne(last, request, cancel), "chief"));
  }
  return absl::OkStatus();
}

absl::Status Dispatcher::StartOne(int w, const v1::StartJobRequest& request,
                                  const common::CancellationToken& cancel) {
  // A worker still busy with an earlier attempt or job (FailedPrecondition)
  // is told to stop it, then asked again; one that is not up yet is waited for.
  const common::RetryPolicy policy =
      common::RetryPolicy()
          .RetryingOn({absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded,
                       absl::StatusCode::kFailedPrecondition})
          .WithBackoff(absl::Milliseconds(200), absl::Seconds(1))
          .WithDeadline(options_.control_timeout);
  return common::Retry(policy, &cancel, [&]() {
    absl::Status st = workers_[w]->StartJob(request);
    if (absl::IsFailedPrecondition(st)) workers_[w]->StopJob("").IgnoreError();
    return st;
  });
}

absl::Status Dispatcher::FreeEverywhere(const std::string& job_id,
                                        const common::CancellationToken* cancel) {
  // Every ps must confirm, so that no attempt starts on stale variables.
  const common::RetryPolicy policy =
      common::RetryPolicy()
          .RetryingOn({absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded})
          .WithDeadline(options_.control_timeout);
  std::vector<absl::Status> r = common::RunInParallel(num_ps(), [&](int p) {
    return common::Annotate(common::Retry(policy, cancel,
                                          [&]() {
                                            return ps_[p]->DeleteJob(job_id, kDeleteTimeout).status();
                                          }),
                            absl::StrCat("ps ", p));
  });
  for (const auto& s : r) TOWERPS_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

void Dispatcher::FreeOnce(const std::string& job_id) {
  common::RunInParallel(num_ps(), [&](int p) {
    absl::StatusOr<v1::DeleteJobResponse> r = ps_[p]->DeleteJob(job_id, absl::Seconds(5));
    if (r.ok() && r->existed()) {
      TLOG(INFO) << "chief: job \"" << job_id << "\" freed on ps " << p << " ("
                 << r->bytes_freed() << " bytes)";
    }
    return r.status();
  });
}

void Dispatcher::StopEverywhere(const std::string& job_id) {
  // Stop flags first (each StopJob blocks until its worker's thread ends),
  // then free the job on the servers to wake pulls blocked on it.
  std::vector<std::thread> stops;
  for (WorkerClient* w : workers_) {
    stops.emplace_back([w, &job_id] { w->StopJob(job_id).IgnoreError(); });
  }
  // Not a retry: a head start for the stop flags before the servers drop
  // the job (a worker that sees its pulls fail first reports a failure).
  absl::SleepFor(absl::Milliseconds(100));
  FreeOnce(job_id);
  for (auto& t : stops) t.join();
}

std::vector<v1::JobStatus> Dispatcher::ShardStatuses(const std::string& job_id,
                                                     absl::Duration timeout) {
  std::vector<v1::JobStatus> shards(ps_.size());
  common::RunInParallel(num_ps(), [&](int p) {
    absl::StatusOr<v1::StatusResponse> s = ps_[p]->GetStatus(job_id, timeout);
    if (s.ok() && s->jobs_size() == 1) shards[p] = s->jobs(0);
    return absl::OkStatus();
  });
  return shards;
}

}  // namespace towerps::worker
