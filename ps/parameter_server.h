// The parameter server's logic: one shard of every job's variables, their
// optimizer slots and the global step of that shard. No gRPC here; see
// ps_service.h for the adapter.
//
// Update rules: an OPTIMIZER variable (VariableDef.update) is trained by the
// job's optimizer. A MOVING_AVERAGE variable (batch norm's moving mean and
// variance) receives a batch statistic in the gradient's place; it is
// averaged over workers exactly like a gradient (below), then applied as
// value = decay * value + (1 - decay) * mean, with no learning rate, weight
// decay or slots. Both kinds are pulled and checkpointed alike.
//
// Thread-safe. Each job has its own mutex; no lock is held while the caller
// reads from or writes to the network.
//
// Push protocol (so that a broken or malformed stream never touches state):
//   BeginPush(header) -> session; session.AddSlice(...) for every slice
//   (validated and copied into a staging buffer; on the same host, a
//   variable in the worker's segment is validated and read in place by the
//   update instead, AddShared); FinishPush(session) checks
//   that every variable was covered exactly once and commits atomically:
//   the update it decides (Commit) may run after the push is answered, but
//   every reader sees whole steps (a pull waits for each variable of its
//   step; saves, deletions and other pushes wait for the update).
// How a push is received (its slices staged or read in place, its update
// formed ahead, its gradients named with the commit): push_session.h; how
// the update runs after it was answered: commit.h; what a registration must
// hold and what its job will hold: register_request.h. The class's calls are
// defined in parameter_server.cc (registration, saves, status, deletion),
// parameter_server_push.cc (BeginPush, FinishPush) and
// parameter_server_pull.cc (Pull).
// A push is identified by (worker_task, incarnation, sequence): a retry with a
// sequence already taken is acknowledged as DUPLICATE and never applied twice.
//
// SYNC: gradients for step t are summed weighted by num_examples; when
// `replicas_to_aggregate` distinct workers have pushed, the weighted mean is
// applied once and the step advances. Pushes for a step already applied are
// STALE: dropped and counted.
// ASYNC: each push is applied on arrival. With max_staleness s > 0, a pull
// for iteration i waits until every worker has completed i - s iterations.
//
// Liveness: the server notes when it last heard from each worker of a job
// (register with worker_task, push, pull, heartbeat); a worker never heard
// from counts from the job's registration here. A pull waiting on workers
// silent longer than the job's peer_timeout_s (so that the wait cannot end:
// in SYNC, too few others left to reach replicas_to_aggregate) fails with
// ABORTED naming them and why, and the server logs one line saying the same.
// The server itself keeps serving.
#ifndef TOWERPS_PS_PARAMETER_SERVER_H_
#define TOWERPS_PS_PARAMETER_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/paths.h"
#include "common/serial_executor.h"
#include "ps/apply_log.h"
#include "ps/commit.h"
#include "ps/optimizer.h"
#include "ps/publication.h"
#include "ps/push_session.h"
#include "ps/register_request.h"
#include "ps/weights_snapshot.h"
#include "proto/ps.pb.h"
#include "proto/tensor.pb.h"

namespace towerps::ps {

struct ParameterServerOptions {
  int task_index = 0;
  // Longest a Pull waits server-side before answering DEADLINE_EXCEEDED (the
  // caller retries). Default: 30 s.
  absl::Duration max_pull_wait = absl::Seconds(30);
  // A waiting pull logs which workers the step waits for this often.
  absl::Duration wait_log_interval = absl::Seconds(5);
  // Largest job a Register may create on this server, everything it will
  // hold counted (RegisterFootprintBytes). Default: 8 GiB.
  int64_t max_job_bytes = int64_t{8} << 30;
  // Most bytes all jobs together may hold on this server, counted as
  // RegisterFootprintBytes: a Register that would pass it is refused with
  // ResourceExhausted naming the largest variable, the bytes already held and
  // the limit; DeleteJob returns a job's bytes. Default here: no total (the
  // binary sets --memory_budget_bytes, by default half the physical memory).
  int64_t memory_budget_bytes = INT64_MAX;
  // Where Save's checkpoint_dir and Register's restore_from may point (the
  // ps's --state_dir): anything else is refused with InvalidArgument naming
  // the field. Unset: anywhere (in-process tests only; the ps binary always
  // sets it).
  std::optional<common::PathRoots> checkpoint_roots;
  // Not owned; null (the default): no record. When set, every registration,
  // accepted push, written shard and deletion appends a line (apply_log.h).
  ApplyLog* apply_log = nullptr;
  // Called (from the updater thread, without any lock) for each variable
  // update of a job that is not applied (JobStatus.updates_skipped), with
  // the job's id; null: none.
  std::function<void(const std::string&)> on_update_skipped;
  // Tests only: called by Save between taking its view of the job and
  // writing it (without the job's lock), to interleave an update.
  std::function<void()> after_save_view;
  // Tests only: called by Register before it builds a new job, without any
  // lock, to hold it there.
  std::function<void()> before_create_job;
  // Tests only: called by a Commit after it published each variable (with
  // the count published), without any lock, to hold an update part way.
  std::function<void(size_t)> after_publish;
  // Tests only: called under the job's lock when a push, save or deletion
  // starts waiting for a Commit to finish (it must not take that lock).
  std::function<void()> on_commit_wait;
  // Tests only: a same-host push is taken as from a worker on cores apart
  // (push_session.h, "Updates ahead": formed ahead where it may be; its gradients wanted as
  // they are named) even where the worker may run on the CPUs of the thread
  // reading it (in a test, the same process).
  bool as_if_on_cores_apart = false;
};

namespace internal {
class Job;
struct Variable;
}

class ParameterServer {
 public:
  explicit ParameterServer(ParameterServerOptions options);
  ~ParameterServer();
  ParameterServer(const ParameterServer&) = delete;
  ParameterServer& operator=(const ParameterServer&) = delete;

  // Creates the job's variables (initialized from their Initializer) or, if it
  // exists, checks that the request matches it (FailedPrecondition if not).
  // InvalidArgument for a malformed request (naming the variable and field
  // for a bad dtype, shape, update or moving_average_decay; nothing is
  // created then); ResourceExhausted if too large. On restore_from,
  // FailedPrecondition if the shard's variables (names, shapes, update rule,
  // optimizer slots) do not match; InvalidArgument naming restore_from when it
  // is outside options.checkpoint_roots. Every worker registers the job:
  // one creates it, and the others wait for it and are checked against it
  // (a job is never built twice, which held twice its bytes for a moment).
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request);
  // Registers waiting for another one to create their job.
  int registers_waiting();

  // NotFound for an unknown job; InvalidArgument for a bad header (an
  // unknown slice_encoding included).
  absl::StatusOr<std::unique_ptr<PushSession>> BeginPush(const v1::PushHeader& header);
  // Commits a complete push. InvalidArgument if a variable is incomplete or
  // the gradient is not finite (nothing is applied then);
  // FailedPrecondition for a SYNC push ahead of the server's step.
  // With `commit`, a push that changes the values (an ASYNC push, the push
  // that completes a SYNC step) leaves *commit set to the update, which the
  // caller hands to RunLater before it answers; otherwise *commit is null. Without it, the
  // update is done before FinishPush returns.
  absl::StatusOr<v1::PushResponse> FinishPush(std::unique_ptr<PushSession> session,
                                              std::unique_ptr<Commit>* commit = nullptr);

  // Runs `commit` (from FinishPush) on one of the server's updater threads,
  // so that the caller answers the push and ends its call at once. The push's
  // own service time `served` plus the update's counts as one request of the
  // job (RecordRequest). The server's destructor waits for what it started.
  void RunLater(std::unique_ptr<Commit> commit, absl::Duration served);

  // Blocks until the job's step reaches request.min_step (and, in ASYNC with
  // max_staleness, the slowest worker is close enough), or `deadline` (capped
  // at max_pull_wait and request.max_wait_ms) passes: DEADLINE_EXCEEDED
  // naming the awaited workers. ABORTED when an awaited worker is lost (see
  // "Liveness" above), naming it and how long it has been silent.
  //
  // With `segment_lease` (a pull that writes the values into a worker's
  // shared memory segment): *segment_lease is set to a lease that, until it
  // is released, makes a push that would change the values wait for it
  // (Status: pushes_waiting) instead of copying them away from under the
  // writes; and while a push waits so, such a pull is not ready, so the
  // push is never starved. The holder must only write (no wait on the
  // worker, the network or the job) and must drop its snapshot before the
  // lease, or the push still copies.
  //
  // With `in_place` as well (and a request naming a segment), *in_place is
  // set, by var_index, to 1 where that segment already holds the
  // snapshot's values at the offset the request names, written by a push
  // as it formed them (PushSession::AddShared) or by the update (Commit::
  // Run), so that the pull need not write them, and 0 elsewhere; only the
  // first such pull after they were written (the worker may change that
  // memory once it returned). Such a pull also waits while a push writes
  // new values into a segment of the job.
  //
  // With `cancelled`, a wait also ends, with CANCELLED, within
  // kCancelledPoll once it returns true (the caller went away, or a
  // same-host channel stops: the thread is free for its next call, not
  // held to the deadline).
  absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> Pull(
      const v1::PullRequest& request, absl::Time deadline,
      std::shared_ptr<void>* segment_lease = nullptr, std::vector<char>* in_place = nullptr,
      const std::function<bool()>& cancelled = nullptr);
  static constexpr absl::Duration kCancelledPoll = absl::Milliseconds(100);

  // Notes that the worker is alive; returns the job's step and this server's
  // incarnation. NotFound for a job not held here; InvalidArgument for a
  // worker_task out of range.
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);

  // Status of one job, or of all when job_id is empty.
  v1::StatusResponse Status(const v1::StatusRequest& request);

  // Frees the job's variables and optimizer slots. Pulls waiting on it fail
  // with ABORTED; later calls for it get NotFound. OK (existed=false) for an
  // unknown job.
  v1::DeleteJobResponse DeleteJob(const v1::DeleteJobRequest& request);

  // Writes this server's shard of the job (values, optimizer slots, global
  // step, async progress) under request.checkpoint_dir, atomically. The file
  // is written without the job's lock, from the job's own memory at the
  // step the save began: if an update comes while it writes, the save keeps
  // the old buffers and the job continues on copies (copy on write), so a
  // save costs no memory unless it overlaps an update. NotFound
  // for an unknown job; errors from the file system name the path.
  // InvalidArgument naming checkpoint_dir when it is outside
  // options.checkpoint_roots (nothing is written or created then).
  absl::StatusOr<v1::SaveResponse> Save(const v1::SaveRequest& request);

  // For shutdown: every waiting Pull (and each later one that would wait)
  // returns UNAVAILABLE "pull: ps N is shutting down" at once, so that the
  // server's Shutdown is not held up to max_pull_wait by long polls. Pulls
  // that are ready are still served. Idempotent.
  void StopWaiting();

  // Counts one served push or pull of `job_id` taking `service_time` (the
  // adapter's time streaming and applying, without waits) for the
  // requests/s and latency figures of Status().
  void RecordRequest(const std::string& job_id, absl::Duration service_time);

  // The job's variable definitions, in var_index order (NotFound if unknown).
  absl::StatusOr<std::vector<v1::VariableDef>> Variables(const std::string& job_id);

  // Bytes counted against options.memory_budget_bytes by the jobs held now.
  int64_t reserved_bytes();

 private:
  // `dir` in its normal form when it is under options_.checkpoint_roots (or
  // as given when they are unset); InvalidArgument naming `field` otherwise.
  absl::StatusOr<std::string> ConfinedDir(absl::string_view field, const std::string& dir) const;
  absl::StatusOr<std::shared_ptr<internal::Job>> FindJob(const std::string& id);
  // What StatusResponse, RegisterResponse and HeartbeatResponse report.
  int64_t Incarnation() const { return static_cast<int64_t>(incarnation_ >> 1); }
  // Appends `event` to options_.apply_log when there is one.
  void Record(absl::string_view event) const {
    if (options_.apply_log != nullptr) options_.apply_log->Append(Incarnation(), event);
  }

  // FinishPush's decision, under the job's lock; *update: as FinishPush's
  // *commit.
  absl::StatusOr<v1::PushResponse> DecidePush(std::unique_ptr<PushSession> session,
                                              std::unique_ptr<Commit>* update);
  std::unique_ptr<Commit> MakeCommit(
      std::shared_ptr<internal::Job> job, std::shared_ptr<Publication> publication,
      std::vector<GradientPart> parts, std::vector<char> prepared = {}) const;

  absl::StatusOr<std::shared_ptr<internal::Job>> CreateJob(
      const v1::RegisterRequest& request, const v1::TrainingConfig& config);

  const ParameterServerOptions options_;
  const absl::Time started_ = absl::Now();
  const uint64_t incarnation_;
  std::atomic<bool> stopping_{false};  // StopWaiting() was called.
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<internal::Job>> jobs_ ABSL_GUARDED_BY(mu_);
  // Sum of RegisterFootprintBytes of the jobs in jobs_ and of those being
  // created (reserved before CreateJob, returned if it fails).
  int64_t reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Jobs being created (outside mu_), which other Registers of them await.
  std::set<std::string> creating_ ABSL_GUARDED_BY(mu_);
  int registers_waiting_ ABSL_GUARDED_BY(mu_) = 0;
  absl::CondVar created_;
  // RunLater's threads; a job's updates always go to the same one (by its
  // id), and different jobs' updates mostly to different ones. Last: they
  // stop first (the destructor also waits for them before anything else).
  std::vector<std::unique_ptr<common::SerialExecutor>> updaters_;
};

// How a job's updates went, for the logs: how many were formed ahead
// (JobStatus.updates_ahead, steps_applied: "N of its M updates formed
// ahead, during their push"; none applied, nothing), how many pushes named
// their gradients at once (pushes_named_at_once, pushes_applied: "N of its
// M pushes named every gradient at once, with the commit"; none applied,
// nothing), and what its pulls
// into workers' shared memory found there already (segment_pull_values,
// values_in_place: "of the N variables pulled into workers' shared
// memory, M were there already"; none pulled there, nothing), and how busy
// the server process was from the job's first update to its latest
// (update_span_s, update_span_cpu_s: "process cpu from its first update to
// its last C s in S s (C/S cores)"; under 2 updates, nothing); "; "
// between them.
std::string DescribeUpdates(const v1::JobStatus& status);

}  // namespace towerps::ps

#endif  // TOWERPS_PS_PARAMETER_SERVER_H_
