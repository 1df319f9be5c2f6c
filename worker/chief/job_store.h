// JobStore: the chief's job records and their event logs, in submission
// order, kept under <state_dir>/jobs/<job_id>/{record,events} so that they
// survive a restart of the chief. It owns the queue (QUEUED jobs in
// submission order) but runs nothing: the job manager takes jobs from it.
//
// Thread-safe. Every record change is written before the call returns (the
// lock is held across the local file write, never across an RPC or a
// callback), except UpdateSoon's (a running job's progress), which the
// store's writer thread writes; waiters (TakeNext, AwaitEnded,
// EventsAfter) wake on changes.
#ifndef TOWERPS_WORKER_CHIEF_JOB_STORE_H_
#define TOWERPS_WORKER_CHIEF_JOB_STORE_H_

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "common/storage/record_io.h"
#include "proto/job_service.pb.h"

namespace towerps::worker {

bool IsTerminal(v1::JobState state);

class JobStore {
 public:
  // Loads every record under <state_dir>/jobs (creating it), oldest first;
  // corrupt records are skipped with a warning. A job that was RUNNING when
  // the chief stopped is QUEUED again with spec.resume set.
  // Errors: the directory cannot be created (naming it).
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& state_dir);
  // Writes what UpdateSoon left pending, then stops the writer thread.
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  std::string JobDir(const std::string& job_id) const;

  // Queues a new job. An empty spec.job_id gets the next free "job-N"; an
  // empty checkpoint dir or TensorBoard dir gets one under JobDir().
  // AlreadyExists for a job_id in use. If the job's directory or record
  // cannot be written, returns that error naming the path and keeps nothing.
  absl::StatusOr<v1::JobRecord> Add(v1::JobSpec spec);
  // Queues an ended job again, resuming from its latest checkpoint.
  // NotFound; FailedPrecondition for a job that has not ended.
  absl::StatusOr<v1::JobRecord> Resubmit(const std::string& job_id);

  // NotFound for an unknown job.
  absl::StatusOr<v1::JobRecord> Get(const std::string& job_id) const;
  std::vector<v1::JobRecord> List() const;

  // A job taken to run: its record (now RUNNING) and this run's token,
  // which RequestCancel and CancelRunning fire.
  struct Run {
    v1::JobRecord record;
    std::shared_ptr<common::CancellationToken> cancel;
  };
  // Blocks until a job is QUEUED (the oldest is taken: it becomes RUNNING)
  // or `stop` is cancelled (CANCELLED).
  absl::StatusOr<Run> TakeNext(common::CancellationToken& stop);

  // Cancel as a user asks: a QUEUED job becomes CANCELLED at once; a RUNNING
  // one has its run's token cancelled ("cancelled by user") and keeps
  // running until the manager ends it. NotFound; FailedPrecondition for a
  // job that has ended.
  absl::StatusOr<v1::JobRecord> RequestCancel(const std::string& job_id);
  // Cancels the token of every RUNNING job with `reason` (e.g. shutdown).
  void CancelRunning(absl::string_view reason);

  // Changes the record with `fn` and writes it. NotFound, or the write's
  // error naming the path (the change is kept in memory).
  absl::Status Update(const std::string& job_id, const std::function<void(v1::JobRecord&)>& fn);
  // Like Update, for what a crash of the chief may lose (a running job's
  // latest metrics): the change is made, and seen, at once, but the record
  // is written by the store's writer thread soon after, not by the caller,
  // so that training never waits for the disk (each write syncs it: a
  // millisecond or more, every log_every_steps). Any later write of the
  // record carries the change too; one never overwrites a later one. A
  // write that fails is logged, the change kept in memory. NotFound.
  absl::Status UpdateSoon(const std::string& job_id,
                          const std::function<void(v1::JobRecord&)>& fn);
  // Like Update, then appends an event of `kind` (its state is the new one).
  absl::Status UpdateWithEvent(const std::string& job_id,
                               const std::function<void(v1::JobRecord&)>& fn,
                               v1::JobEvent::Kind kind, const std::string& message);
  // Appends an event (seq = previous + 1) to the job's log and events file.
  void AddEvent(const std::string& job_id, v1::JobEvent::Kind kind, const std::string& message,
                const v1::Metrics* metrics = nullptr);

  struct EventBatch {
    std::vector<v1::JobEvent> events;  // seq > after_seq, in order.
    bool ended = false;                // The job had ended when read.
  };
  // The events after `after_seq`; if there are none and the job has not
  // ended, first waits up to `wait` for one. NotFound.
  absl::StatusOr<EventBatch> EventsAfter(const std::string& job_id, int64_t after_seq,
                                         absl::Duration wait) const;
  // Blocks until the job has ended or `timeout`; returns its record.
  absl::StatusOr<v1::JobRecord> AwaitEnded(const std::string& job_id,
                                           absl::Duration timeout) const;

 private:
  struct Entry {
    v1::JobRecord record;
    std::vector<v1::JobEvent> events;
    std::unique_ptr<common::RecordWriter> event_file;  // Null if it cannot be written.
    // The current run's token; null unless the job has been taken to run.
    std::shared_ptr<common::CancellationToken> cancel;
    int64_t version = 0;  // Changes made to `record` since it was loaded or added.
  };

  explicit JobStore(std::string state_dir);
  absl::Status Load();
  Entry* FindLocked(const std::string& job_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the record (a new version of it) before returning.
  absl::Status PersistLocked(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes `serialized`, version `version` of the job's record, unless a
  // later version was written already.
  absl::Status WriteRecord(const std::string& job_id, const std::string& serialized,
                           int64_t version) ABSL_LOCKS_EXCLUDED(write_mu_);
  // The writer thread: writes the records UpdateSoon changed, until the
  // destructor stops it with none pending.
  void WriterLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void AddEventLocked(Entry& e, v1::JobEvent::Kind kind, const std::string& message,
                      const v1::Metrics* metrics) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasQueuedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string jobs_dir_;

  mutable absl::Mutex mu_;
  mutable absl::CondVar changed_;
  std::map<std::string, std::unique_ptr<Entry>> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);  // Submission order.
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::set<std::string> pending_ ABSL_GUARDED_BY(mu_);  // Jobs UpdateSoon changed.
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Taken after mu_ (never mu_ while holding it): one record write at a
  // time, each job's version on disk.
  absl::Mutex write_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::map<std::string, int64_t> written_ ABSL_GUARDED_BY(write_mu_);
  std::thread writer_;  // WriterLoop; started by Open.
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_CHIEF_JOB_STORE_H_
