// ParameterServer::Pull: a pull waits for its step (sync), for the
// staleness bound (async) or for the caller's own push, gives up on a worker
// that is lost, and hands out the job's weights snapshot (with a lease on a
// worker's shared segment where it writes there). The class is in
// parameter_server.h; its other calls are in parameter_server.cc, the push
// in parameter_server_push.cc.

#include "ps/parameter_server.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/status.h"
#include "ps/job_state.h"

namespace towerps::ps {

using internal::Job;

namespace {

// ParameterServer::Pull's segment lease: one of the job's segment writers
// until destroyed.
struct SegmentLease {
  explicit SegmentLease(std::shared_ptr<Job> j) : job(std::move(j)) {}
  ~SegmentLease() {
    absl::MutexLock lock(&job->mu);
    --job->segment_writers;
    job->changed.SignalAll();
  }
  SegmentLease(const SegmentLease&) = delete;
  SegmentLease& operator=(const SegmentLease&) = delete;
  std::shared_ptr<Job> job;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> ParameterServer::Pull(
    const v1::PullRequest& request, absl::Time deadline, std::shared_ptr<void>* segment_lease,
    std::vector<char>* in_place, const std::function<bool()>& cancelled) {
  TOWERPS_ASSIGN_OR_RETURN(std::shared_ptr<Job> job_ptr, FindJob(request.job_id()));
  Job& job = *job_ptr;
  deadline = std::min(deadline, absl::Now() + options_.max_pull_wait);
  if (request.max_wait_ms() > 0) {
    deadline = std::min(deadline, absl::Now() + absl::Milliseconds(request.max_wait_ms()));
  }
  const int64_t staleness = job.config.max_staleness();
  const bool bounded = job.config.mode() == v1::ASYNC && staleness > 0;
  if (request.after_push() > 0) {
    TOWERPS_RETURN_IF_ERROR(
        CheckWorkerTask("pull", request.worker_task(), job.config.num_workers()));
  }
  absl::MutexLock lock(&job.mu);
  job.HeardLocked(request.worker_task(), "pull");
  // Listed while it waits (Job::segment_pulls_waiting).
  struct Listed {
    Job& job;
    const v1::SharedSegment* segment;
    ~Listed() ABSL_NO_THREAD_SAFETY_ANALYSIS {  // job.mu is held: `lock` goes after
      if (segment == nullptr) return;
      auto& list = job.segment_pulls_waiting;
      list.erase(std::find(list.begin(), list.end(), segment));
    }
  } listed{job, segment_lease != nullptr && request.has_segment() ? &request.segment() : nullptr};
  if (listed.segment != nullptr) job.segment_pulls_waiting.push_back(listed.segment);
  // The caller's own push this pull comes after is taken (or none is named).
  auto own_push_taken = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
    if (request.after_push() == 0) return true;
    const internal::WorkerRecord& rec = job.workers[request.worker_task()];
    return rec.seen && rec.incarnation == request.incarnation() &&
           rec.last_sequence >= request.after_push();
  };
  auto slowest = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
    int64_t m = INT64_MAX;
    for (const auto& w : job.workers) m = std::min(m, w.completed);
    return m;
  };
  // The step (and staleness) this pull waits for is there.
  auto step_ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
    if (job.global_step < request.min_step() || !own_push_taken()) return false;
    return !bounded || slowest() >= request.worker_iteration() - staleness;
  };
  // And a push waiting for the segment writers goes first; one writing
  // into a segment finishes first.
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
    return step_ready() && (segment_lease == nullptr ||
                            (job.pushes_waiting == 0 && job.writing_through == 0));
  };
  // The workers this pull waits for; the caller itself is alive.
  auto awaited = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
    std::vector<int> out;
    const bool step_wait = job.global_step < request.min_step();
    if (!step_wait && !bounded) return out;  // only for its own push
    const int64_t need = step_wait ? request.worker_iteration()
                                   : request.worker_iteration() - staleness;
    for (int w = 0; w < job.config.num_workers(); ++w) {
      if (w == request.worker_task()) continue;
      const bool waits = job.config.mode() == v1::SYNC
                             ? step_wait && !job.pushed.count(w)
                             : job.workers[w].completed < need;
      if (waits) out.push_back(w);
    }
    return out;
  };
  // A non-OK status when the awaited workers that are lost make the wait
  // hopeless; *wake gets when the next awaited worker would become lost.
  auto check_lost = [&](absl::Time now, absl::Time* wake)
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) -> absl::Status {
    const std::vector<int> waiting = awaited();
    std::vector<std::string> lost;
    std::string key;
    for (int w : waiting) {
      const absl::Time lost_at = job.LostAtLocked(w);
      if (now >= lost_at) {
        lost.push_back(job.LostReasonLocked(w, now));
        absl::StrAppend(&key, w, ",");
      } else {
        *wake = std::min(*wake, lost_at);
      }
    }
    if (lost.empty()) return absl::OkStatus();
    if (job.config.mode() == v1::SYNC) {
      // Backup workers: the step still completes if enough others can push.
      const int can_push = job.config.num_workers() - static_cast<int>(job.pushed.size()) -
                           static_cast<int>(lost.size());
      if (static_cast<int>(job.pushed.size()) + can_push >= job.replicas) {
        return absl::OkStatus();
      }
    }
    const std::string what =
        job.global_step < request.min_step()
            ? absl::StrCat("step ", request.min_step(), " waits for ")
            : absl::StrCat("worker ", request.worker_task(), "'s iteration ",
                           request.worker_iteration(), " (max_staleness ", staleness,
                           ") waits for ");
    const std::string message = absl::StrCat(
        "job \"", job.id, "\" on ps ", options_.task_index, ": ", what,
        absl::StrJoin(lost, "; "), "; peer_timeout_s=", job.config.peer_timeout_s());
    absl::StrAppend(&key, job.global_step);
    if (key != job.lost_logged) {
      job.lost_logged = key;
      TLOG(ERROR) << "ps " << options_.task_index << ": " << message;
    }
    return absl::AbortedError(absl::StrCat("pull: ", message));
  };
  const absl::Time start = absl::Now();
  absl::Time next_log = start + options_.wait_log_interval;
  while (!ready()) {
    // Read under job.mu, which StopWaiting takes to signal: no lost wake-up.
    if (stopping_.load()) {
      return absl::UnavailableError(absl::StrCat("pull: ps ", options_.task_index,
                                                 " is shutting down"));
    }
    if (job.deleted) {
      return absl::AbortedError(absl::StrCat("pull: job \"", job.id, "\" was deleted on ps ",
                                             options_.task_index, " while waiting"));
    }
    if (cancelled && cancelled()) {
      return absl::CancelledError(absl::StrCat("pull: job \"", job.id, "\" on ps ",
                                               options_.task_index,
                                               ": the call ended while it waited"));
    }
    const absl::Time now = absl::Now();
    absl::Time wake = std::min(deadline, next_log);
    if (cancelled) wake = std::min(wake, now + kCancelledPoll);
    // Waiting only for a push to go first waits for no worker.
    if (!step_ready()) TOWERPS_RETURN_IF_ERROR(check_lost(now, &wake));
    if (now >= deadline && !own_push_taken()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "pull: job \"", job.id, "\" on ps ", options_.task_index, ": waited ",
          absl::FormatDuration(now - start), " for push ", request.after_push(),
          " of worker ", request.worker_task(), " (this pull comes after it)"));
    }
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "pull: job \"", job.id, "\" on ps ", options_.task_index, " is at step ",
          job.global_step, ", waited ", absl::FormatDuration(now - start),
          " for step ", request.min_step(), "; step waits for workers [",
          absl::StrJoin(job.WaitingForLocked(), ","), "]"));
    }
    if (now >= next_log) {
      TLOG(WARNING) << "ps " << options_.task_index << ": job \"" << job.id
                    << "\" step " << job.global_step << " open for "
                    << absl::FormatDuration(now - job.step_opened)
                    << "; waiting for workers ["
                    << absl::StrJoin(job.WaitingForLocked(), ",") << "] (worker "
                    << request.worker_task() << " wants step " << request.min_step()
                    << ")";
      next_log = now + options_.wait_log_interval;
    }
    // Counted while it waits (Status reports it, so tests and operators can
    // see a pull blocked without timing it). Only the wait releases job.mu, so
    // counting around it alone is what any reader can see.
    ++job.pulls_waiting;
    job.changed.WaitWithDeadline(&job.mu, wake + absl::Milliseconds(1));
    --job.pulls_waiting;
  }
  if (job.deleted) {
    return absl::AbortedError(absl::StrCat("pull: job \"", job.id, "\" was deleted on ps ",
                                           options_.task_index));
  }
  if (!job.snapshot) {
    auto snap = std::make_shared<WeightsSnapshot>();
    snap->global_step = job.global_step;
    snap->publication = job.publishing;  // null unless a Commit is under way
    snap->values.reserve(job.vars.size());
    for (const auto& v : job.vars) snap->values.emplace_back(v.value);
    job.snapshot = std::move(snap);
  }
  if (segment_lease != nullptr) {
    if (in_place != nullptr) {
      const v1::SharedSegment& seg = request.segment();
      const size_t n = job.vars.size();
      in_place->assign(n, 0);
      auto rec = request.has_segment() ? job.written.find(seg.nonce()) : job.written.end();
      if (rec != job.written.end() && seg.offsets_size() == static_cast<int>(n) &&
          rec->second.at.size() == n) {
        for (size_t v = 0; v < n; ++v) {
          (*in_place)[v] = rec->second.version[v] == job.steps_applied &&
                           rec->second.at[v] == seg.offsets(static_cast<int>(v));
          job.values_in_place += (*in_place)[v];
        }
      }
      job.segment_pull_values += static_cast<int64_t>(n);
    }
    // Only the worker's next pull into its segment takes the values as
    // they lie there: once it returned, the worker may write its weights
    // or give their memory back, so a later pull (a retry, a pull after
    // training) writes them again.
    if (request.has_segment()) job.written.erase(request.segment().nonce());
    ++job.segment_writers;
    job.writer = 0;  // it may write any variable there
    *segment_lease = std::make_shared<SegmentLease>(std::move(job_ptr));
  }
  return job.snapshot;
}

}  // namespace towerps::ps
