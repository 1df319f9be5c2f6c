#include "worker/chief/job_manager.h"

#include <algorithm>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/cancellation.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "common/paths.h"
#include "common/skipped_updates.h"
#include "common/status.h"
#include "proto/job.pb.h"
#include "proto/job_service.pb.h"
#include "worker/chief/checkpointer.h"
#include "worker/chief/chief_hooks.h"
#include "worker/chief/dispatcher.h"
#include "worker/chief/exporter.h"
#include "worker/chief/job_store.h"
#include "worker/chief/job_watch.h"
#include "worker/chief/live_status.h"
#include "worker/chief/recovery.h"
#include "worker/chief/submission.h"

namespace towerps::worker {
namespace {

double UnixNow() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

template <typename T>
std::vector<T*> Pointers(const std::vector<std::unique_ptr<T>>& v) {
  std::vector<T*> out;
  for (const auto& p : v) out.push_back(p.get());
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------

// The facade: wires the parts and runs the queue, one job at a time, on the
// runner thread.
class JobManager::Impl {
 public:
  Impl(JobManagerOptions options, common::PathRoots state_roots, common::PathRoots data_roots)
      : options_(std::move(options)),
        state_roots_(std::move(state_roots)),
        data_roots_(std::move(data_roots)) {}

  ~Impl() { Shutdown(absl::ZeroDuration()); }

  void Shutdown(absl::Duration checkpoint_timeout) {
    // The queue stops first, so no job is taken after the running one stops.
    shutdown_.Cancel("the chief shut down");
    if (hooks_ != nullptr && checkpoint_timeout > absl::ZeroDuration()) {
      const ChiefHooks::StopResult stop = hooks_->StopAtNextStep(checkpoint_timeout);
      absl::MutexLock lock(&mu_);
      shutdown_stop_ = stop;
    }
    if (store_ != nullptr) store_->CancelRunning("the chief shut down");
    if (runner_.joinable()) runner_.join();
  }

  absl::Status Start() {
    TOWERPS_ASSIGN_OR_RETURN(store_, JobStore::Open(options_.state_dir));
    const common::ClusterSpec& c = options_.cluster;
    for (int p = 0; p < static_cast<int>(c.ps.size()); ++p) {
      ps_.push_back(options_.ps_factory ? options_.ps_factory(p)
                                        : NewGrpcPsControl(c.ps[p], options_.security));
    }
    checkpointer_ = std::make_unique<Checkpointer>(Pointers(ps_), *store_, &state_roots_);
    hooks_ = std::make_unique<ChiefHooks>(*store_, *checkpointer_, &state_roots_);
    JobHooksProvider hooks = [this](const v1::StartJobRequest& r) { return hooks_->For(r); };
    for (int w = 0; w < static_cast<int>(c.worker.size()); ++w) {
      if (options_.worker_factory) {
        workers_.push_back(options_.worker_factory(w, hooks));
      } else if (w == c.task_index) {
        workers_.push_back(NewInProcessWorkerClient(*options_.local, hooks));
      } else {
        workers_.push_back(NewGrpcWorkerClient(c.worker[w], options_.security));
      }
    }
    DispatcherOptions d;
    d.poll_interval = options_.poll_interval;
    d.worker_lost_after = options_.worker_lost_after;
    d.control_timeout = options_.control_timeout;
    d.start_last = c.task_index;
    dispatcher_ = std::make_unique<Dispatcher>(Pointers(workers_), Pointers(ps_), d);
    runner_ = std::thread([this] { RunnerLoop(); });
    return absl::OkStatus();
  }

  absl::StatusOr<v1::JobRecord> Submit(const v1::SubmitJobRequest& request) {
    TOWERPS_RETURN_IF_ERROR(Started());
    if (!request.resume_job_id().empty()) return store_->Resubmit(request.resume_job_id());
    v1::JobSpec spec = JobWithDefaults(request.spec());
    const bool named = !request.spec().job_id().empty() && request.spec().job_id() != "default";
    if (named && !ValidJobId(spec.job_id())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job spec: job_id \"", spec.job_id(),
          "\" must be 1-64 letters, digits, '-', '_' or '.' (not starting with '.')"));
    }
    // Paths first: a dir outside the roots is refused before anything looks
    // into it (data files are looked for next).
    TOWERPS_RETURN_IF_ERROR(ConfineJobPaths(state_roots_, data_roots_, &spec));
    if (absl::Status valid = ValidateSubmission(
            spec, static_cast<int>(options_.cluster.worker.size()), options_.worker_budget_bytes);
        !valid.ok()) {
      if (absl::IsResourceExhausted(valid)) {
        Refused("memory_budget_bytes");
      } else if (absl::StrContains(valid.message(), "(limit ")) {
        Refused("spec_limits");
      }
      return valid;
    }
    if (!named) spec.clear_job_id();
    const std::vector<v1::JobRecord> jobs = store_->List();
    const int64_t queued = std::count_if(jobs.begin(), jobs.end(), [](const v1::JobRecord& j) {
      return j.state() == v1::QUEUED;
    });
    if (queued >= options_.max_queued_jobs) {
      Refused("max_queued_jobs");
      return absl::ResourceExhaustedError(absl::StrCat(
          "submit: ", queued, " jobs are queued on this chief (limit --max_queued_jobs=",
          options_.max_queued_jobs, "); wait for some to run, or cancel some"));
    }
    TOWERPS_ASSIGN_OR_RETURN(v1::JobRecord record, store_->Add(std::move(spec)));
    TLOG(INFO) << "chief: job \"" << record.job_id() << "\" queued";
    return record;
  }

  void Refused(const std::string& reason) {
    if (options_.on_refusal) options_.on_refusal(reason);
  }

  std::vector<v1::JobRecord> List() { return store_ ? store_->List() : std::vector<v1::JobRecord>(); }

  absl::StatusOr<v1::GetJobResponse> Get(const std::string& job_id) {
    TOWERPS_RETURN_IF_ERROR(Started());
    v1::GetJobResponse response;
    TOWERPS_ASSIGN_OR_RETURN(*response.mutable_job(), store_->Get(job_id));
    if (response.job().state() == v1::RUNNING) {
      *response.mutable_live() =
          GatherLive(response.job(), options_.cluster, Pointers(ps_), Pointers(workers_));
    }
    return response;
  }

  absl::StatusOr<v1::JobRecord> Cancel(const std::string& job_id) {
    TOWERPS_RETURN_IF_ERROR(Started());
    // A running job's token is fired: its poll and backoff waits end at once.
    TOWERPS_ASSIGN_OR_RETURN(v1::JobRecord record, store_->RequestCancel(job_id));
    if (record.state() != v1::RUNNING) return record;
    // Wait (bounded) for the runner to stop the workers and free the variables.
    return store_->AwaitEnded(job_id, absl::Seconds(30));
  }

  absl::Status Watch(const std::string& job_id, int64_t after_seq, bool follow,
                     const std::function<bool(const v1::JobEvent&)>& write,
                     const std::function<bool()>& stop) {
    TOWERPS_RETURN_IF_ERROR(Started());
    return WatchJob(*store_, job_id, after_seq, follow, write, stop);
  }

  v1::ClusterResponse Cluster() {
    return GatherCluster(options_.cluster, Pointers(ps_), Pointers(workers_));
  }

  absl::Status Export(const std::string& job_id, int64_t chunk_bytes,
                      const std::function<bool(const v1::ExportChunk&)>& write) {
    TOWERPS_RETURN_IF_ERROR(Started());
    TOWERPS_ASSIGN_OR_RETURN(v1::JobRecord record, store_->Get(job_id));
    // Read only from under --state_dir, like every write (a record may
    // predate the check at submit).
    if (!record.checkpoint_dir().empty()) {
      auto dir = state_roots_.Resolve("checkpoint_dir", record.checkpoint_dir());
      if (!dir.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat("export: job \"", job_id, "\": ", dir.status().message()));
      }
      record.set_checkpoint_dir(*dir);
    }
    return ExportJob(record, chunk_bytes, write);
  }

 private:
  absl::Status Started() const {
    if (store_ == nullptr) return absl::FailedPreconditionError("the job manager is not started");
    return absl::OkStatus();
  }

  void RunnerLoop() {
    while (true) {
      absl::StatusOr<JobStore::Run> next = store_->TakeNext(shutdown_);
      if (!next.ok()) return;  // Shutting down.
      RunJob(next->record, *next->cancel);
    }
  }

  // `cancel` is this run's token (fired by Cancel() and at shutdown).
  void RunJob(const v1::JobRecord& record, const common::CancellationToken& cancel) {
    const std::string id = record.job_id();
    const v1::JobSpec spec = record.spec();
    hooks_->BeginJob(spec);
    // Restarts and attempt numbers go on from earlier chiefs (the record):
    // max_restarts bounds the job, not one chief's lifetime.
    const int used = record.restarts();
    absl::Status result;
    if (used > std::max(0, spec.max_restarts())) {
      result = absl::FailedPreconditionError(absl::StrCat(
          "max_restarts (", spec.max_restarts(), ") used up: the chief restarted while this job "
          "ran (", used, " restarts in all); resubmit it with --resume to go on"));
    } else {
      result = RunWithRestarts(
          RestartPolicy(spec, options_.restart_backoff, used), &cancel,
          [&](int attempt) { return RunAttempt(id, spec, attempt, cancel); },
          [&](int attempt, const absl::Status& failure, int restart) {
            LogIfError(store_->Update(id, [&](v1::JobRecord& r) { r.set_restarts(used + restart); }));
            store_->AddEvent(id, v1::JobEvent::LOG,
                             absl::StrCat("attempt ", attempt, " failed: ", failure.message(),
                                          "; restarting from the latest checkpoint (restart ",
                                          used + restart, " of ", spec.max_restarts(), ")"));
            TLOG(WARNING) << "chief: job \"" << id << "\" attempt " << attempt
                          << " failed: " << failure << "; restarting";
          },
          /*first_attempt=*/record.attempts() + 1);
    }
    hooks_->EndJob();
    if (shutdown_.cancelled() && !result.ok()) {
      Requeue(id);
      return;
    }
    v1::JobState state = v1::SUCCEEDED;
    std::string error;
    // Only this job's own token (a user's Cancel) makes it CANCELLED: a
    // CANCELLED from a stopping peer was a failure (see PeerCancelIsAFailure).
    if (!result.ok() && cancel.cancelled()) {
      state = v1::CANCELLED;
      error = "cancelled by user";
    } else if (!result.ok()) {
      state = v1::FAILED;
      error = std::string(result.message());
    }
    absl::Status saved = store_->UpdateWithEvent(
        id,
        [&](v1::JobRecord& r) {
          r.set_end_time(UnixNow());
          r.set_state(state);
          r.set_error(error);
        },
        v1::JobEvent::STATE, error);
    if (!saved.ok()) TLOG(WARNING) << "chief: " << saved;
    TLOG(INFO) << "chief: job \"" << id << "\" " << v1::JobState_Name(state)
               << (error.empty() ? "" : ": " + error);
  }

  // The chief shut down while job `id` ran: it is QUEUED again (first in
  // line, by its submit time) and resumes from its latest checkpoint, which
  // is the one written at the step boundary it stopped at, if it reached one.
  void Requeue(const std::string& id) {
    ChiefHooks::StopResult stop;
    {
      absl::MutexLock lock(&mu_);
      stop = shutdown_stop_;
    }
    std::string where = "from its latest checkpoint";
    if (stop.reached && stop.checkpoint.ok()) {
      where = absl::StrCat("from the checkpoint written at step ", stop.step, " as it stopped");
    } else if (stop.reached) {
      where = absl::StrCat("from its latest checkpoint (the one at step ", stop.step,
                           " failed: ", stop.checkpoint.message(), ")");
    } else {
      where = "from its latest checkpoint (it reached no step boundary in time)";
    }
    const std::string message =
        absl::StrCat("the chief shut down while this job ran: queued again, resumes ", where);
    absl::Status saved = store_->UpdateWithEvent(
        id,
        [](v1::JobRecord& r) {
          r.set_state(v1::QUEUED);
          r.mutable_spec()->set_resume(true);
        },
        v1::JobEvent::STATE, message);
    if (!saved.ok()) TLOG(WARNING) << "chief: " << saved;  // Open() requeues a RUNNING record.
    TLOG(INFO) << "chief: job \"" << id << "\": " << message;
  }

  // One attempt: the restore point, the workers' run, and once every worker
  // is done the servers' last word, a final checkpoint, and the job freed.
  absl::Status RunAttempt(const std::string& id, const v1::JobSpec& spec, int attempt,
                          const common::CancellationToken& cancel) {
    RestorePoint restore = ChooseRestorePoint(spec, attempt, [&](const std::string& line) {
      store_->AddEvent(id, v1::JobEvent::LOG, line);
      TLOG(INFO) << "chief: job \"" << id << "\": " << line;
    });
    LogIfError(store_->Update(id, [&](v1::JobRecord& r) {
      if (restore.step >= 0) r.set_restored_step(restore.step);
      r.set_attempts(attempt);
    }));
    v1::StartJobRequest request;
    *request.mutable_job() = spec;
    request.set_attempt(attempt);
    request.set_restore_from(restore.dir);
    TOWERPS_RETURN_IF_ERROR(dispatcher_->RunAttempt(request, cancel));
    std::vector<v1::JobStatus> shards = dispatcher_->ShardStatuses(id, absl::Seconds(10));
    // The final checkpoint is what `towerctl export` and a resume read: a job
    // whose last checkpoint was not written has not succeeded. (A retryable
    // cause, e.g. a ps lost while saving, restarts the attempt like any other.)
    absl::Status final_checkpoint = absl::OkStatus();
    if (!spec.checkpoint().disabled()) {
      final_checkpoint = common::Annotate(
          checkpointer_->Save(id, spec, shards.empty() ? 0 : shards[0].global_step()),
          "final checkpoint");
      if (!final_checkpoint.ok()) {
        store_->AddEvent(id, v1::JobEvent::LOG, std::string(final_checkpoint.message()));
      }
    }
    // Variable updates the servers did not apply (values not finite): an
    // event, so that `towerctl logs` says so as well as `status`.
    std::vector<std::pair<int, int64_t>> skipped;
    for (size_t i = 0; i < shards.size(); ++i) {
      skipped.emplace_back(static_cast<int>(i), shards[i].updates_skipped());
    }
    const std::string skipped_note = common::SkippedUpdatesNote(skipped);
    if (!skipped_note.empty()) store_->AddEvent(id, v1::JobEvent::LOG, skipped_note);
    int64_t bytes = 0;
    for (const auto& s : shards) bytes += s.bytes_held();
    LogIfError(store_->Update(id, [&](v1::JobRecord& r) {
      r.clear_final_shards();
      for (const auto& s : shards) *r.add_final_shards() = s;
      r.set_variables_bytes(bytes);
    }));
    dispatcher_->FreeOnce(id);
    return final_checkpoint;
  }

  static void LogIfError(const absl::Status& s) {
    if (!s.ok()) TLOG(WARNING) << "chief: " << s;
  }

  const JobManagerOptions options_;
  const common::PathRoots state_roots_;  // --state_dir: checkpoint and TensorBoard dirs.
  const common::PathRoots data_roots_;   // --data_root and --state_dir: data.dir.
  // Set once by Start(), before the runner starts; constant afterwards.
  std::unique_ptr<JobStore> store_;
  std::vector<std::unique_ptr<PsControl>> ps_;
  std::vector<std::unique_ptr<WorkerClient>> workers_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::unique_ptr<ChiefHooks> hooks_;
  std::unique_ptr<Dispatcher> dispatcher_;
  std::thread runner_;
  // Stops the queue; each running job has its own token (JobStore::Run).
  common::CancellationToken shutdown_;
  absl::Mutex mu_;
  ChiefHooks::StopResult shutdown_stop_ ABSL_GUARDED_BY(mu_);  // What Shutdown() saw.
};

// ---------------------------------------------------------------------------

JobManager::JobManager(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
JobManager::~JobManager() = default;
void JobManager::Shutdown(absl::Duration checkpoint_timeout) { impl_->Shutdown(checkpoint_timeout); }

absl::StatusOr<std::unique_ptr<JobManager>> JobManager::Create(JobManagerOptions options) {
  if (options.state_dir.empty()) return absl::InvalidArgumentError("--state_dir is empty");
  // Absolute, so that the default dirs the store fills in (and sends to the
  // servers) mean the same directory on every process.
  options.state_dir = common::AbsoluteNormalPath(options.state_dir);
  TOWERPS_ASSIGN_OR_RETURN(common::PathRoots state_roots,
                           common::PathRoots::Create("--state_dir", {options.state_dir}));
  std::vector<std::string> data = options.data_roots;
  data.push_back(options.state_dir);
  TOWERPS_ASSIGN_OR_RETURN(common::PathRoots data_roots,
                           common::PathRoots::Create("--data_root", std::move(data)));
  if (options.local == nullptr && !options.worker_factory) {
    return absl::InvalidArgumentError("job manager: no local worker");
  }
  if (!options.cluster.is_chief()) {
    return absl::FailedPreconditionError("the job service runs on the chief (worker 0) only");
  }
  return std::unique_ptr<JobManager>(new JobManager(std::make_unique<Impl>(
      std::move(options), std::move(state_roots), std::move(data_roots))));
}

absl::Status JobManager::Start() { return impl_->Start(); }
absl::StatusOr<v1::JobRecord> JobManager::Submit(const v1::SubmitJobRequest& r) {
  return impl_->Submit(r);
}
std::vector<v1::JobRecord> JobManager::List() { return impl_->List(); }
absl::StatusOr<v1::GetJobResponse> JobManager::Get(const std::string& id) { return impl_->Get(id); }
absl::StatusOr<v1::JobRecord> JobManager::Cancel(const std::string& id) { return impl_->Cancel(id); }
absl::Status JobManager::Watch(const std::string& id, int64_t after, bool follow,
                               const std::function<bool(const v1::JobEvent&)>& write,
                               const std::function<bool()>& stop) {
  return impl_->Watch(id, after, follow, write, stop);
}
v1::ClusterResponse JobManager::Cluster() { return impl_->Cluster(); }
absl::Status JobManager::Export(const std::string& id, int64_t chunk_bytes,
                                const std::function<bool(const v1::ExportChunk&)>& write) {
  return impl_->Export(id, chunk_bytes, write);
}

}  // namespace towerps::worker
