#include "worker/chief/job_store.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/paths.h"
#include "common/status.h"
#include "common/storage/file_util.h"

namespace towerps::worker {
namespace {

constexpr char kRecordFile[] = "record";
constexpr char kEventsFile[] = "events";

double UnixNow() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

absl::Status NotFound(const std::string& job_id) {
  return absl::NotFoundError(absl::StrCat("job \"", job_id, "\" not found"));
}

}  // namespace

bool IsTerminal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

JobStore::JobStore(std::string state_dir) : jobs_dir_(std::move(state_dir) + "/jobs") {}

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& state_dir) {
  std::unique_ptr<JobStore> store(new JobStore(state_dir));
  TOWERPS_RETURN_IF_ERROR(common::MakeDirs(store->jobs_dir_));
  TOWERPS_RETURN_IF_ERROR(store->Load());
  store->writer_ = std::thread([s = store.get()] { s->WriterLoop(); });
  return store;
}

JobStore::~JobStore() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (writer_.joinable()) writer_.join();
}

void JobStore::WriterLoop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || !pending_.empty();
    };
    mu_.Await(absl::Condition(&wake));
    if (pending_.empty()) return;  // stopping, with nothing left to write
    const std::string id = *pending_.begin();
    pending_.erase(pending_.begin());
    Entry* e = FindLocked(id);
    if (e == nullptr) continue;
    const std::string serialized = e->record.SerializeAsString();
    const int64_t version = e->version;
    mu_.Unlock();  // the write (and its fsync) without the store's lock
    absl::Status s = WriteRecord(id, serialized, version);
    if (!s.ok()) TLOG(WARNING) << "chief: " << s << " (the change is kept in memory)";
    mu_.Lock();
  }
}

std::string JobStore::JobDir(const std::string& job_id) const {
  return absl::StrCat(jobs_dir_, "/", job_id);
}

absl::Status JobStore::Load() {
  std::error_code ec;
  std::vector<std::string> ids;
  for (const auto& entry : std::filesystem::directory_iterator(jobs_dir_, ec)) {
    if (entry.is_directory()) ids.push_back(entry.path().filename().string());
  }
  std::vector<std::unique_ptr<Entry>> loaded;
  for (const auto& id : ids) {
    const std::string path = absl::StrCat(JobDir(id), "/", kRecordFile);
    auto text = common::ReadFileToString(path);
    if (!text.ok()) {
      TLOG(WARNING) << "chief: skipping " << JobDir(id) << ": " << text.status();
      continue;
    }
    common::RecordReader reader(*text, path);
    auto rec = reader.Next();
    auto e = std::make_unique<Entry>();
    if (!rec.ok() || !e->record.ParseFromString(std::string(*rec))) {
      TLOG(WARNING) << "chief: skipping corrupt job record " << path << ": "
                    << (rec.ok() ? "not a JobRecord" : rec.status().ToString());
      continue;
    }
    // Records written before issue 15 may name dirs relative to the chief's
    // working directory: they keep that meaning, made absolute (the roots
    // are checked where the dirs are used).
    for (std::string* dir : {e->record.mutable_spec()->mutable_checkpoint()->mutable_dir(),
                             e->record.mutable_spec()->mutable_tensorboard_dir(),
                             e->record.mutable_checkpoint_dir(),
                             e->record.mutable_tensorboard_dir()}) {
      if (!dir->empty() && (*dir)[0] != '/') *dir = common::AbsoluteNormalPath(*dir);
    }
    const std::string events_path = absl::StrCat(JobDir(id), "/", kEventsFile);
    if (auto ev = common::ReadFileToString(events_path); ev.ok()) {
      common::RecordReader er(*ev, events_path);
      for (auto r = er.Next(); r.ok(); r = er.Next()) {
        v1::JobEvent event;
        if (event.ParseFromString(std::string(*r))) e->events.push_back(std::move(event));
      }
    }
    if (auto w = common::RecordWriter::Open(events_path, /*append=*/true); w.ok()) {
      e->event_file = std::move(*w);
    }
    loaded.push_back(std::move(e));
  }
  std::sort(loaded.begin(), loaded.end(), [](const auto& a, const auto& b) {
    return a->record.submit_time() < b->record.submit_time();
  });
  absl::MutexLock lock(&mu_);
  for (auto& e : loaded) {
    const std::string id = e->record.job_id();
    int64_t n = 0;
    if (id.rfind("job-", 0) == 0 && absl::SimpleAtoi(absl::string_view(id).substr(4), &n)) {
      next_id_ = std::max(next_id_, n + 1);
    }
    if (e->record.state() == v1::RUNNING) {
      // The attempt died with the chief: a restart, like a failed attempt
      // (a chief in a crash loop must not retry a job forever).
      e->record.set_state(v1::QUEUED);
      e->record.mutable_spec()->set_resume(true);
      e->record.set_restarts(e->record.restarts() + 1);
      AddEventLocked(*e, v1::JobEvent::STATE,
                     absl::StrCat("the chief restarted while this job ran: queued again, resumes "
                                  "from its latest checkpoint (restart ",
                                  e->record.restarts(), " of ",
                                  e->record.spec().max_restarts(), ")"),
                     nullptr);
      if (absl::Status s = PersistLocked(*e); !s.ok()) TLOG(WARNING) << "chief: " << s;
    }
    order_.push_back(id);
    jobs_[id] = std::move(e);
  }
  TLOG(INFO) << "chief: " << jobs_.size() << " job record(s) loaded from " << jobs_dir_;
  return absl::OkStatus();
}

absl::StatusOr<v1::JobRecord> JobStore::Add(v1::JobSpec spec) {
  absl::MutexLock lock(&mu_);
  if (spec.job_id().empty()) {
    do {
      spec.set_job_id(absl::StrCat("job-", next_id_++));
    } while (jobs_.count(spec.job_id()));
  } else if (jobs_.count(spec.job_id())) {
    return absl::AlreadyExistsError(absl::StrCat(
        "job spec: job_id \"", spec.job_id(), "\" is already used by a job on this cluster"));
  }
  if (spec.model().name() == "default") spec.mutable_model()->set_name(spec.job_id());
  const std::string job_dir = JobDir(spec.job_id());
  if (spec.checkpoint().dir().empty()) spec.mutable_checkpoint()->set_dir(job_dir + "/checkpoints");
  if (spec.tensorboard_dir().empty()) spec.set_tensorboard_dir(job_dir + "/tensorboard");
  auto entry = std::make_unique<Entry>();
  v1::JobRecord& r = entry->record;
  r.set_job_id(spec.job_id());
  *r.mutable_spec() = spec;
  r.set_state(v1::QUEUED);
  r.set_submit_time(UnixNow());
  r.set_restored_step(-1);
  r.set_checkpoint_step(-1);
  r.set_checkpoint_dir(spec.checkpoint().dir());
  r.set_tensorboard_dir(spec.tensorboard_dir());
  // The record is on disk before the job is queued: a job answered OK
  // survives a restart of the chief.
  TOWERPS_RETURN_IF_ERROR(
      common::Annotate(common::MakeDirs(job_dir), "cannot create the job's directory"));
  TOWERPS_RETURN_IF_ERROR(PersistLocked(*entry));
  auto events = common::RecordWriter::Open(absl::StrCat(job_dir, "/", kEventsFile), true);
  if (events.ok()) {
    entry->event_file = std::move(*events);
  } else {
    TLOG(WARNING) << "chief: job \"" << r.job_id() << "\": no events file: " << events.status();
  }
  Entry& e = *entry;
  jobs_[r.job_id()] = std::move(entry);
  order_.push_back(e.record.job_id());
  AddEventLocked(e, v1::JobEvent::STATE, "", nullptr);
  return e.record;
}

absl::StatusOr<v1::JobRecord> JobStore::Resubmit(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindLocked(job_id);
  if (e == nullptr) return NotFound(job_id);
  if (!IsTerminal(e->record.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", job_id, "\" is ", v1::JobState_Name(e->record.state()),
                     "; only an ended job can be resumed"));
  }
  v1::JobRecord updated = e->record;
  updated.mutable_spec()->set_resume(true);
  updated.set_state(v1::QUEUED);
  updated.set_submit_time(UnixNow());
  updated.set_end_time(0);
  updated.clear_error();
  updated.set_restarts(0);  // A new run: max_restarts anew (attempts go on counting).
  std::swap(updated, e->record);
  if (absl::Status s = PersistLocked(*e); !s.ok()) {
    std::swap(updated, e->record);  // Not queued: it would not survive a restart.
    return s;
  }
  AddEventLocked(*e, v1::JobEvent::STATE, "resubmitted: resumes from its latest checkpoint",
                 nullptr);
  return e->record;
}

absl::StatusOr<v1::JobRecord> JobStore::Get(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  Entry* e = FindLocked(job_id);
  if (e == nullptr) return NotFound(job_id);
  return e->record;
}

std::vector<v1::JobRecord> JobStore::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::JobRecord> out;
  for (const auto& id : order_) out.push_back(jobs_.at(id)->record);
  return out;
}

bool JobStore::HasQueuedLocked() const {
  for (const auto& id : order_) {
    if (jobs_.at(id)->record.state() == v1::QUEUED) return true;
  }
  return false;
}

absl::StatusOr<JobStore::Run> JobStore::TakeNext(common::CancellationToken& stop) {
  // Cancel() does not signal our CondVar: wake it from the token.
  common::ScopedCancellationCallback wake(&stop, [this] {
    absl::MutexLock lock(&mu_);
    changed_.SignalAll();
  });
  absl::MutexLock lock(&mu_);
  while (!stop.cancelled() && !HasQueuedLocked()) changed_.Wait(&mu_);
  if (stop.cancelled()) return stop.Check("job queue");
  for (const auto& id : order_) {
    Entry& e = *jobs_.at(id);
    if (e.record.state() != v1::QUEUED) continue;
    e.record.set_state(v1::RUNNING);
    e.record.set_start_time(UnixNow());
    e.cancel = std::make_shared<common::CancellationToken>();
    AddEventLocked(e, v1::JobEvent::STATE, "", nullptr);
    if (absl::Status s = PersistLocked(e); !s.ok()) TLOG(WARNING) << "chief: " << s;
    return Run{e.record, e.cancel};
  }
  return absl::InternalError("job queue: no queued job");  // Unreachable.
}

absl::StatusOr<v1::JobRecord> JobStore::RequestCancel(const std::string& job_id) {
  std::shared_ptr<common::CancellationToken> running;
  v1::JobRecord record;
  {
    absl::MutexLock lock(&mu_);
    Entry* e = FindLocked(job_id);
    if (e == nullptr) return NotFound(job_id);
    if (IsTerminal(e->record.state())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job \"", job_id, "\" has already ended (", v1::JobState_Name(e->record.state()), ")"));
    }
    if (e->record.state() == v1::QUEUED) {
      e->record.set_state(v1::CANCELLED);
      e->record.set_end_time(UnixNow());
      e->record.set_error("cancelled while queued");
      AddEventLocked(*e, v1::JobEvent::STATE, "cancelled while queued", nullptr);
      if (absl::Status s = PersistLocked(*e); !s.ok()) TLOG(WARNING) << "chief: " << s;
      return e->record;
    }
    running = e->cancel;
    if (running != nullptr && !running->cancelled()) {
      AddEventLocked(*e, v1::JobEvent::LOG, "cancel requested", nullptr);
    }
    record = e->record;
  }
  // Outside the lock: Cancel() runs the token's callbacks.
  if (running != nullptr) running->Cancel("cancelled by user");
  return record;
}

void JobStore::CancelRunning(absl::string_view reason) {
  std::vector<std::shared_ptr<common::CancellationToken>> running;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, e] : jobs_) {
      if (e->record.state() == v1::RUNNING && e->cancel != nullptr) running.push_back(e->cancel);
    }
  }
  for (const auto& token : running) token->Cancel(reason);
}

absl::Status JobStore::Update(const std::string& job_id,
                              const std::function<void(v1::JobRecord&)>& fn) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindLocked(job_id);
  if (e == nullptr) return NotFound(job_id);
  fn(e->record);
  changed_.SignalAll();
  return PersistLocked(*e);
}

absl::Status JobStore::UpdateSoon(const std::string& job_id,
                                  const std::function<void(v1::JobRecord&)>& fn) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindLocked(job_id);
  if (e == nullptr) return NotFound(job_id);
  fn(e->record);
  ++e->version;
  pending_.insert(job_id);
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::Status JobStore::UpdateWithEvent(const std::string& job_id,
                                       const std::function<void(v1::JobRecord&)>& fn,
                                       v1::JobEvent::Kind kind, const std::string& message) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindLocked(job_id);
  if (e == nullptr) return NotFound(job_id);
  fn(e->record);
  AddEventLocked(*e, kind, message, nullptr);
  return PersistLocked(*e);
}

void JobStore::AddEvent(const std::string& job_id, v1::JobEvent::Kind kind,
                        const std::string& message, const v1::Metrics* metrics) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindLocked(job_id);
  if (e != nullptr) AddEventLocked(*e, kind, message, metrics);
}

absl::StatusOr<JobStore::EventBatch> JobStore::EventsAfter(const std::string& job_id,
                                                           int64_t after_seq,
                                                           absl::Duration wait) const {
  absl::MutexLock lock(&mu_);
  Entry* e = FindLocked(job_id);
  if (e == nullptr) return NotFound(job_id);
  const size_t from = static_cast<size_t>(std::max<int64_t>(0, after_seq));
  if (e->events.size() <= from && !IsTerminal(e->record.state())) {
    changed_.WaitWithTimeout(&mu_, wait);
  }
  EventBatch batch;
  for (size_t i = from; i < e->events.size(); ++i) batch.events.push_back(e->events[i]);
  batch.ended = IsTerminal(e->record.state());
  return batch;
}

absl::StatusOr<v1::JobRecord> JobStore::AwaitEnded(const std::string& job_id,
                                                   absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  Entry* e = FindLocked(job_id);
  if (e == nullptr) return NotFound(job_id);
  auto ended = [e]() { return IsTerminal(e->record.state()); };
  mu_.AwaitWithTimeout(absl::Condition(&ended), timeout);
  return e->record;
}

JobStore::Entry* JobStore::FindLocked(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

absl::Status JobStore::PersistLocked(Entry& e) {
  ++e.version;
  return WriteRecord(e.record.job_id(), e.record.SerializeAsString(), e.version);
}

absl::Status JobStore::WriteRecord(const std::string& job_id, const std::string& serialized,
                                   int64_t version) {
  absl::MutexLock lock(&write_mu_);
  int64_t& on_disk = written_[job_id];
  if (version <= on_disk) return absl::OkStatus();  // a later one is there
  const std::string path = absl::StrCat(JobDir(job_id), "/", kRecordFile);
  std::string framed;
  common::AppendRecord(serialized, &framed);
  TOWERPS_RETURN_IF_ERROR(common::Annotate(common::WriteFileAtomically(path, framed),
                                           absl::StrCat("cannot save job record ", path)));
  on_disk = version;
  return absl::OkStatus();
}

void JobStore::AddEventLocked(Entry& e, v1::JobEvent::Kind kind, const std::string& message,
                              const v1::Metrics* metrics) {
  v1::JobEvent ev;
  ev.set_seq(static_cast<int64_t>(e.events.size()) + 1);
  ev.set_time(UnixNow());
  ev.set_kind(kind);
  ev.set_message(message);
  ev.set_state(e.record.state());
  if (metrics != nullptr) *ev.mutable_metrics() = *metrics;
  if (e.event_file) {
    if (!e.event_file->Write(ev.SerializeAsString()).ok() || !e.event_file->Flush().ok()) {
      TLOG(WARNING) << "chief: cannot append to " << e.event_file->path()
                    << "; events kept in memory only";
      e.event_file.reset();
    }
  }
  e.events.push_back(std::move(ev));
  changed_.SignalAll();
}

}  // namespace towerps::worker
