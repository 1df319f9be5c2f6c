#include "worker/chief/job_manager.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <filesystem>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "common/optimizer_spec.h"
#include "common/parallel.h"
#include "common/rpc.h"
#include "common/status.h"
#include "common/storage/checkpoint.h"
#include "common/storage/event_writer.h"
#include "common/storage/file_util.h"
#include "common/storage/record_io.h"
#include "proto/job.pb.h"
#include "proto/job_service.pb.h"
#include "proto/ps.grpc.pb.h"
#include "proto/tensor.pb.h"
#include "proto/worker.grpc.pb.h"
#include "worker/device/backend.h"
#include "worker/model/dataset.h"
#include "worker/model/model.h"

namespace towerps::worker {
namespace {

using common::FromGrpcStatus;

constexpr char kRecordFile[] = "record";
constexpr char kEventsFile[] = "events";

double UnixNow() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

bool Terminal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

// Failures that a restart from the latest checkpoint can cure: a server or
// worker went away or came back without the job.
bool Retryable(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kNotFound ||
         code == absl::StatusCode::kAborted || code == absl::StatusCode::kDeadlineExceeded;
}

bool ValidJobId(const std::string& id) {
  if (id.empty() || id.size() > 64 || id[0] == '.') return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

std::chrono::system_clock::time_point DeadlineIn(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}

}  // namespace

absl::Status ValidateSubmission(const v1::JobSpec& job, int num_workers) {
  TOWERPS_RETURN_IF_ERROR(ValidateJob(job, num_workers));
  TOWERPS_RETURN_IF_ERROR(common::Annotate(common::ValidateOptimizer(job.optimizer()), "job spec"));
  // The model: layer types, units, names (Model::Create names the layer).
  std::unique_ptr<Backend> backend = NewCpuBackend();
  auto model = Model::Create(job.model(), *backend);
  if (!model.ok()) return common::Annotate(model.status(), "job spec: model");
  const v1::DataSpec& d = job.data();
  if (d.source() == v1::DataSpec::FASHION_MNIST) {
    constexpr int kPixels = 28 * 28, kClasses = 10;
    if ((*model)->input_dim() != kPixels) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job spec: model.input_dim = ", (*model)->input_dim(), " but Fashion-MNIST examples have ",
          kPixels, " features"));
    }
    if (job.model().loss() == v1::SOFTMAX_CROSS_ENTROPY && (*model)->output_dim() != kClasses) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job spec: model.layers[", job.model().layers_size() - 1, "].units = ",
          (*model)->output_dim(), " but Fashion-MNIST has ", kClasses,
          " classes (softmax cross-entropy needs one output per class)"));
    }
    for (bool train : {true, false}) {
      auto files = FindFashionMnistFiles(d.dir(), train);
      if (!files.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("job spec: data.dir = \"", d.dir(),
                                                       "\": ", files.status().message()));
      }
    }
  } else if (d.source() == v1::DataSpec::ONES && d.ones_target_dim() > 0 &&
             d.ones_target_dim() != (*model)->output_dim()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job spec: data.ones_target_dim = ", d.ones_target_dim(), " but the model outputs ",
        (*model)->output_dim(), " values"));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------

struct JobEntry {
  v1::JobRecord record;
  std::vector<v1::JobEvent> events;
  std::unique_ptr<common::RecordWriter> event_file;
  bool cancel_requested = false;
};

// Per attempt, touched only by the chief's training thread (checkpoint hook).
struct AttemptState {
  int64_t last_checkpoint_step = -1;
  absl::Time last_checkpoint_time = absl::Now();
};

class JobManager::Impl {
 public:
  explicit Impl(JobManagerOptions options) : options_(std::move(options)) {
    for (const auto& a : options_.cluster.ps) {
      ps_.push_back(v1::ParameterService::NewStub(common::NewChannel(a)));
    }
    for (size_t w = 0; w < options_.cluster.worker.size(); ++w) {
      workers_.push_back(static_cast<int>(w) == options_.cluster.task_index
                             ? nullptr
                             : v1::WorkerService::NewStub(
                                   common::NewChannel(options_.cluster.worker[w])));
    }
  }

  ~Impl() {
    {
      absl::MutexLock lock(&mu_);
      shutdown_ = true;
      for (auto& [id, e] : jobs_) {
        if (e->record.state() == v1::RUNNING) e->cancel_requested = true;
      }
    }
    if (runner_.joinable()) runner_.join();
  }

  absl::Status Start() {
    TOWERPS_RETURN_IF_ERROR(common::MakeDirs(JobsDir()));
    TOWERPS_RETURN_IF_ERROR(Load());
    runner_ = std::thread([this] { RunnerLoop(); });
    return absl::OkStatus();
  }

  absl::StatusOr<v1::JobRecord> Submit(const v1::SubmitJobRequest& request) {
    const int num_workers = static_cast<int>(options_.cluster.worker.size());
    if (!request.resume_job_id().empty()) {
      absl::MutexLock lock(&mu_);
      auto it = jobs_.find(request.resume_job_id());
      if (it == jobs_.end()) {
        return absl::NotFoundError(absl::StrCat("job \"", request.resume_job_id(), "\" not found"));
      }
      JobEntry& e = *it->second;
      if (!Terminal(e.record.state())) {
        return absl::FailedPreconditionError(absl::StrCat(
            "job \"", e.record.job_id(), "\" is ", v1::JobState_Name(e.record.state()),
            "; only an ended job can be resumed"));
      }
      e.record.mutable_spec()->set_resume(true);
      e.record.set_state(v1::QUEUED);
      e.record.set_submit_time(UnixNow());
      e.record.set_end_time(0);
      e.record.clear_error();
      e.cancel_requested = false;
      AddEventLocked(e, v1::JobEvent::STATE, "resubmitted: resumes from its latest checkpoint");
      PersistLocked(e);
      changed_.SignalAll();
      return e.record;
    }
    v1::JobSpec spec = JobWithDefaults(request.spec());
    const bool named = !request.spec().job_id().empty() && request.spec().job_id() != "default";
    if (named && !ValidJobId(spec.job_id())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job spec: job_id \"", spec.job_id(),
          "\" must be 1-64 letters, digits, '-', '_' or '.' (not starting with '.')"));
    }
    TOWERPS_RETURN_IF_ERROR(ValidateSubmission(spec, num_workers));
    absl::MutexLock lock(&mu_);
    if (named) {
      if (jobs_.count(spec.job_id())) {
        return absl::AlreadyExistsError(absl::StrCat(
            "job spec: job_id \"", spec.job_id(), "\" is already used by a job on this cluster"));
      }
    } else {
      do {
        spec.set_job_id(absl::StrCat("job-", next_id_++));
      } while (jobs_.count(spec.job_id()));
    }
    if (spec.model().name() == "default") spec.mutable_model()->set_name(spec.job_id());
    const std::string job_dir = absl::StrCat(JobsDir(), "/", spec.job_id());
    if (spec.checkpoint().dir().empty()) {
      spec.mutable_checkpoint()->set_dir(job_dir + "/checkpoints");
    }
    if (spec.tensorboard_dir().empty()) spec.set_tensorboard_dir(job_dir + "/tensorboard");
    auto entry = std::make_shared<JobEntry>();
    v1::JobRecord& r = entry->record;
    r.set_job_id(spec.job_id());
    *r.mutable_spec() = spec;
    r.set_state(v1::QUEUED);
    r.set_submit_time(UnixNow());
    r.set_restored_step(-1);
    r.set_checkpoint_step(-1);
    r.set_checkpoint_dir(spec.checkpoint().dir());
    r.set_tensorboard_dir(spec.tensorboard_dir());
    TOWERPS_RETURN_IF_ERROR(common::MakeDirs(job_dir));
    auto events = common::RecordWriter::Open(job_dir + "/" + kEventsFile, /*append=*/true);
    if (events.ok()) entry->event_file = std::move(*events);
    jobs_[r.job_id()] = entry;
    order_.push_back(r.job_id());
    AddEventLocked(*entry, v1::JobEvent::STATE, "");
    PersistLocked(*entry);
    changed_.SignalAll();
    TLOG(INFO) << "chief: job \"" << r.job_id() << "\" queued";
    return r;
  }

  std::vector<v1::JobRecord> List() {
    absl::MutexLock lock(&mu_);
    std::vector<v1::JobRecord> out;
    for (const auto& id : order_) out.push_back(jobs_[id]->record);
    return out;
  }

  absl::StatusOr<v1::GetJobResponse> Get(const std::string& job_id) {
    v1::GetJobResponse response;
    {
      absl::MutexLock lock(&mu_);
      auto it = jobs_.find(job_id);
      if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job \"", job_id, "\" not found"));
      *response.mutable_job() = it->second->record;
    }
    if (response.job().state() == v1::RUNNING) *response.mutable_live() = Live(response.job());
    return response;
  }

  absl::StatusOr<v1::JobRecord> Cancel(const std::string& job_id) {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job \"", job_id, "\" not found"));
    JobEntry& e = *it->second;
    if (Terminal(e.record.state())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job \"", job_id, "\" has already ended (", v1::JobState_Name(e.record.state()), ")"));
    }
    if (e.record.state() == v1::QUEUED) {
      e.record.set_state(v1::CANCELLED);
      e.record.set_end_time(UnixNow());
      e.record.set_error("cancelled while queued");
      AddEventLocked(e, v1::JobEvent::STATE, "cancelled while queued");
      PersistLocked(e);
      return e.record;
    }
    e.cancel_requested = true;
    AddEventLocked(e, v1::JobEvent::LOG, "cancel requested");
    // Wait (bounded) for the runner to stop the workers and free the variables.
    auto ended = [&e]() { return Terminal(e.record.state()); };
    mu_.AwaitWithTimeout(absl::Condition(&ended), absl::Seconds(30));
    return e.record;
  }

  absl::Status Watch(const std::string& job_id, int64_t after_seq, bool follow,
                     const std::function<bool(const v1::JobEvent&)>& write,
                     const std::function<bool()>& stop) {
    std::shared_ptr<JobEntry> e;
    {
      absl::MutexLock lock(&mu_);
      auto it = jobs_.find(job_id);
      if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job \"", job_id, "\" not found"));
      e = it->second;
    }
    int64_t sent = std::max<int64_t>(0, after_seq);
    while (true) {
      std::vector<v1::JobEvent> batch;
      bool ended;
      {
        absl::MutexLock lock(&mu_);
        if (follow && static_cast<int64_t>(e->events.size()) <= sent && !Terminal(e->record.state())) {
          changed_.WaitWithTimeout(&mu_, absl::Milliseconds(500));
        }
        for (size_t i = sent; i < e->events.size(); ++i) batch.push_back(e->events[i]);
        ended = Terminal(e->record.state());
      }
      for (const auto& ev : batch) {
        if (!write(ev)) return absl::OkStatus();
        sent = ev.seq();
      }
      if (!follow || (ended && batch.empty()) || (stop && stop())) return absl::OkStatus();
    }
  }

  v1::ClusterResponse Cluster() {
    const auto& c = options_.cluster;
    const int nps = static_cast<int>(c.ps.size()), nw = static_cast<int>(c.worker.size());
    v1::ClusterResponse response;
    std::vector<v1::TaskInfo> tasks(nps + nw);
    common::RunInParallel(nps + nw, [&](int i) {
      v1::TaskInfo& t = tasks[i];
      if (i < nps) {
        t.set_job("ps");
        t.set_index(i);
        t.set_address(c.ps[i]);
        v1::StatusResponse s;
        absl::Status st = PsStatus(i, /*job_id=*/"", absl::Seconds(2), &s);
        t.set_healthy(st.ok());
        if (!st.ok()) t.set_error(std::string(st.message()));
        t.set_uptime_s(s.uptime_s());
        int64_t bytes = 0;
        for (const auto& j : s.jobs()) bytes += j.bytes_held() + j.slot_bytes();
        t.set_bytes_held(bytes);
        t.set_jobs(s.jobs_size());
      } else {
        const int w = i - nps;
        t.set_job("worker");
        t.set_index(w);
        t.set_address(c.worker[w]);
        t.set_is_chief(w == c.task_index);
        v1::WorkerStatus s;
        absl::Status st = WorkerStatus(w, absl::Seconds(2), &s);
        t.set_healthy(st.ok());
        if (!st.ok()) t.set_error(std::string(st.message()));
        t.set_uptime_s(s.uptime_s());
        *t.mutable_devices() = s.devices();
      }
      return absl::OkStatus();
    });
    for (auto& t : tasks) *response.add_tasks() = std::move(t);
    return response;
  }

  absl::Status Export(const std::string& job_id, int64_t chunk_bytes,
                      const std::function<bool(const v1::ExportChunk&)>& write) {
    v1::JobRecord record;
    {
      absl::MutexLock lock(&mu_);
      auto it = jobs_.find(job_id);
      if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job \"", job_id, "\" not found"));
      record = it->second->record;
    }
    const std::string dir = record.checkpoint_dir();
    auto latest = common::FindLatestValidCheckpoint(
        dir, [](const std::string& line) { TLOG(WARNING) << "export: " << line; });
    if (!latest.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job \"", job_id, "\" has no usable checkpoint to export (", latest.status().message(), ")"));
    }
    std::map<std::string, common::VariableState> by_name;
    for (int s = 0; s < latest->num_ps; ++s) {
      TOWERPS_ASSIGN_OR_RETURN(
          common::ShardState shard,
          common::ReadShard(absl::StrCat(dir, "/", latest->dir_name, "/",
                                         common::ShardFileName(s, latest->num_ps))));
      for (auto& v : shard.vars) by_name[v.def.name()] = std::move(v);
    }
    TOWERPS_ASSIGN_OR_RETURN(std::vector<v1::VariableDef> defs, JobVariables(record.spec()));
    const int64_t per_chunk = std::max<int64_t>(1, chunk_bytes / 4);
    for (const auto& def : defs) {
      auto it = by_name.find(def.name());
      if (it == by_name.end()) {
        return absl::DataLossError(absl::StrCat("checkpoint ", latest->dir_name,
                                                " has no variable \"", def.name(), "\""));
      }
      const std::vector<float>& values = it->second.value;
      int64_t offset = 0;
      do {
        const int64_t n = std::min<int64_t>(per_chunk, values.size() - offset);
        v1::ExportChunk chunk;
        if (offset == 0) *chunk.mutable_def() = it->second.def;
        chunk.set_offset(offset);
        chunk.set_global_step(latest->step);
        chunk.set_data(reinterpret_cast<const char*>(values.data() + offset), n * 4);
        if (!write(chunk)) return absl::CancelledError("export: client went away");
        offset += n;
      } while (offset < static_cast<int64_t>(values.size()));
    }
    return absl::OkStatus();
  }

 private:
  std::string JobsDir() const { return options_.state_dir + "/jobs"; }
  std::string JobDir(const std::string& id) const { return JobsDir() + "/" + id; }

  // ----- store ------------------------------------------------------------

  void PersistLocked(JobEntry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::string framed;
    common::AppendRecord(e.record.SerializeAsString(), &framed);
    absl::Status s = common::WriteFileAtomically(JobDir(e.record.job_id()) + "/" + kRecordFile, framed);
    if (!s.ok()) TLOG(WARNING) << "chief: cannot save job record: " << s;
  }

  absl::Status Load() {
    std::error_code ec;
    std::vector<std::string> ids;
    for (const auto& entry : std::filesystem::directory_iterator(JobsDir(), ec)) {
      if (entry.is_directory()) ids.push_back(entry.path().filename().string());
    }
    std::vector<std::shared_ptr<JobEntry>> loaded;
    for (const auto& id : ids) {
      const std::string path = JobDir(id) + "/" + kRecordFile;
      auto text = common::ReadFileToString(path);
      if (!text.ok()) {
        TLOG(WARNING) << "chief: skipping " << JobDir(id) << ": " << text.status();
        continue;
      }
      common::RecordReader reader(*text, path);
      auto rec = reader.Next();
      auto e = std::make_shared<JobEntry>();
      if (!rec.ok() || !e->record.ParseFromString(std::string(*rec))) {
        TLOG(WARNING) << "chief: skipping corrupt job record " << path << ": "
                      << (rec.ok() ? "not a JobRecord" : rec.status().ToString());
        continue;
      }
      const std::string events_path = JobDir(id) + "/" + kEventsFile;
      if (auto ev = common::ReadFileToString(events_path); ev.ok()) {
        common::RecordReader er(*ev, events_path);
        for (auto r = er.Next(); r.ok(); r = er.Next()) {
          v1::JobEvent event;
          if (event.ParseFromString(std::string(*r))) e->events.push_back(std::move(event));
        }
      }
      if (auto w = common::RecordWriter::Open(events_path, true); w.ok()) e->event_file = std::move(*w);
      loaded.push_back(std::move(e));
    }
    std::sort(loaded.begin(), loaded.end(), [](const auto& a, const auto& b) {
      return a->record.submit_time() < b->record.submit_time();
    });
    absl::MutexLock lock(&mu_);
    for (auto& e : loaded) {
      const std::string& id = e->record.job_id();
      int64_t n = 0;
      if (absl::SimpleAtoi(absl::string_view(id).substr(id.rfind('-') + 1), &n) &&
          id.rfind("job-", 0) == 0) {
        next_id_ = std::max(next_id_, n + 1);
      }
      if (e->record.state() == v1::RUNNING) {
        e->record.set_state(v1::QUEUED);
        e->record.mutable_spec()->set_resume(true);
        AddEventLocked(*e, v1::JobEvent::STATE,
                       "the chief restarted while this job ran: queued again, resumes from its "
                       "latest checkpoint");
        PersistLocked(*e);
      }
      order_.push_back(id);
      jobs_[id] = std::move(e);
    }
    TLOG(INFO) << "chief: " << jobs_.size() << " job record(s) loaded from " << JobsDir();
    return absl::OkStatus();
  }

  void AddEventLocked(JobEntry& e, v1::JobEvent::Kind kind, const std::string& message,
                      const v1::Metrics* metrics = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    v1::JobEvent ev;
    ev.set_seq(static_cast<int64_t>(e.events.size()) + 1);
    ev.set_time(UnixNow());
    ev.set_kind(kind);
    ev.set_message(message);
    ev.set_state(e.record.state());
    if (metrics != nullptr) *ev.mutable_metrics() = *metrics;
    if (e.event_file) {
      if (!e.event_file->Write(ev.SerializeAsString()).ok() || !e.event_file->Flush().ok()) {
        e.event_file.reset();
      }
    }
    e.events.push_back(std::move(ev));
    changed_.SignalAll();
  }

  void Event(const std::string& id, v1::JobEvent::Kind kind, const std::string& message) {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(id);
    if (it != jobs_.end()) AddEventLocked(*it->second, kind, message);
  }

  template <typename Fn>
  void Update(const std::string& id, Fn fn) {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return;
    fn(*it->second);
    PersistLocked(*it->second);
  }

  bool CancelRequested(const std::string& id) {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(id);
    return shutdown_ || it == jobs_.end() || it->second->cancel_requested;
  }

  // ----- runner -----------------------------------------------------------

  void RunnerLoop() {
    while (true) {
      std::string id;
      {
        absl::MutexLock lock(&mu_);
        auto next = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          if (shutdown_) return true;
          for (const auto& i : order_) {
            if (jobs_[i]->record.state() == v1::QUEUED) return true;
          }
          return false;
        };
        mu_.Await(absl::Condition(&next));
        if (shutdown_) return;
        for (const auto& i : order_) {
          if (jobs_[i]->record.state() == v1::QUEUED) {
            id = i;
            break;
          }
        }
        JobEntry& e = *jobs_[id];
        e.record.set_state(v1::RUNNING);
        e.record.set_start_time(UnixNow());
        AddEventLocked(e, v1::JobEvent::STATE, "");
        PersistLocked(e);
      }
      RunJob(id);
    }
  }

  void RunJob(const std::string& id) {
    v1::JobSpec spec;
    {
      absl::MutexLock lock(&mu_);
      spec = jobs_[id]->record.spec();
    }
    std::unique_ptr<common::EventWriter> tb;
    if (auto w = common::EventWriter::Create(spec.tensorboard_dir()); w.ok()) {
      tb = std::move(*w);
    } else {
      Event(id, v1::JobEvent::LOG, absl::StrCat("no TensorBoard events: ", w.status().message()));
    }
    absl::Status result;
    int restarts = 0;
    for (int attempt = 1;; ++attempt) {
      std::string restore;
      if (attempt > 1 || spec.resume()) {
        auto latest = common::FindLatestValidCheckpoint(
            spec.checkpoint().dir(), [&](const std::string& line) {
              Event(id, v1::JobEvent::LOG, line);
              TLOG(WARNING) << "chief: job \"" << id << "\": " << line;
            });
        if (latest.ok()) {
          restore = absl::StrCat(spec.checkpoint().dir(), "/", latest->dir_name);
          Update(id, [&](JobEntry& e) { e.record.set_restored_step(latest->step); });
          Event(id, v1::JobEvent::LOG,
                absl::StrCat("restoring checkpoint ", latest->dir_name, " (step ", latest->step, ")"));
        } else {
          Event(id, v1::JobEvent::LOG,
                absl::StrCat("no usable checkpoint (", latest.status().message(),
                             "): starting from the initializers"));
        }
      }
      Update(id, [&](JobEntry& e) { e.record.set_attempts(attempt); });
      result = RunAttempt(id, spec, attempt, restore, tb.get());
      if (result.ok() || absl::IsCancelled(result)) break;
      if (!Retryable(result.code()) || restarts >= spec.max_restarts() || CancelRequested(id)) break;
      ++restarts;
      Event(id, v1::JobEvent::LOG,
            absl::StrCat("attempt ", attempt, " failed: ", result.message(),
                         "; restarting from the latest checkpoint (restart ", restarts, " of ",
                         spec.max_restarts(), ")"));
      TLOG(WARNING) << "chief: job \"" << id << "\" attempt " << attempt << " failed: " << result
                    << "; restarting";
      absl::SleepFor(absl::Seconds(1));
    }
    if (tb) tb->Flush().IgnoreError();
    absl::MutexLock lock(&mu_);
    JobEntry& e = *jobs_[id];
    e.record.set_end_time(UnixNow());
    if (result.ok()) {
      e.record.set_state(v1::SUCCEEDED);
    } else if (absl::IsCancelled(result) || e.cancel_requested) {
      e.record.set_state(v1::CANCELLED);
      e.record.set_error(shutdown_ ? "the chief shut down" : "cancelled by user");
    } else {
      e.record.set_state(v1::FAILED);
      e.record.set_error(std::string(result.message()));
    }
    if (shutdown_ && !result.ok()) {
      // Leave it RUNNING on disk: a restarted chief resumes it.
      e.record.set_state(v1::RUNNING);
      PersistLocked(e);
      return;
    }
    AddEventLocked(e, v1::JobEvent::STATE, result.ok() ? "" : e.record.error());
    PersistLocked(e);
    TLOG(INFO) << "chief: job \"" << id << "\" " << v1::JobState_Name(e.record.state())
               << (e.record.error().empty() ? "" : ": " + e.record.error());
  }

  // One attempt; OK when every worker finished. Cancelled if cancelled.
  absl::Status RunAttempt(const std::string& id, const v1::JobSpec& spec, int attempt,
                          const std::string& restore, common::EventWriter* tb) {
    const int nw = static_cast<int>(options_.cluster.worker.size());
    TOWERPS_RETURN_IF_ERROR(DeleteEverywhere(id));
    v1::StartJobRequest req;
    *req.mutable_job() = spec;
    req.set_attempt(attempt);
    req.set_restore_from(restore);
    auto state = std::make_shared<AttemptState>();
    // Remote workers first: the chief's own part registers the variables.
    std::vector<absl::Status> started = common::RunInParallel(nw, [&](int w) -> absl::Status {
      if (workers_[w] == nullptr) return absl::OkStatus();
      return StartRemote(w, req, id);
    });
    for (int w = 0; w < nw; ++w) {
      if (!started[w].ok()) {
        StopEverywhere(id);
        return common::Annotate(started[w], absl::StrCat("worker ", w));
      }
    }
    JobHooks hooks;
    hooks.log_every_steps = spec.log_every_steps();
    hooks.log = [this, id](const std::string& line) {
      TLOG(INFO) << line;
      Event(id, v1::JobEvent::LOG, line);
    };
    hooks.on_metrics = [this, id, tb](const v1::Metrics& m, bool epoch_end) {
      OnMetrics(id, m, epoch_end, tb);
    };
    hooks.after_pull = [this, id, spec, state](int64_t step) {
      MaybeCheckpoint(id, spec, step, state.get());
      return absl::OkStatus();
    };
    hooks.on_epoch = [tb](int64_t step, const std::vector<v1::VariableDef>& defs,
                          const std::vector<common::Tensor*>& weights) {
      if (tb == nullptr) return;
      for (size_t i = 0; i < defs.size() && i < weights.size(); ++i) {
        tb->AddHistogram(defs[i].name(), step,
                         weights[i]->span())
            .IgnoreError();
      }
      tb->Flush().IgnoreError();
    };
    absl::Status local = options_.local->Start(req, hooks);
    if (!local.ok()) {
      StopEverywhere(id);
      return common::Annotate(local, "chief");
    }
    // Poll until every worker is done, one fails, or the job is cancelled.
    std::vector<absl::Time> last_seen(nw, absl::Now());
    while (true) {
      absl::SleepFor(options_.poll_interval);
      if (CancelRequested(id)) {
        StopEverywhere(id);
        DeleteEverywhere(id).IgnoreError();
        return absl::CancelledError("cancelled");
      }
      int done = 0;
      for (int w = 0; w < nw; ++w) {
        v1::WorkerStatus s;
        absl::Status st = WorkerStatus(w, absl::Seconds(2), &s);
        if (!st.ok()) {
          if (absl::Now() - last_seen[w] > options_.worker_lost_after) {
            StopEverywhere(id);
            return absl::UnavailableError(absl::StrCat(
                "worker ", w, " unreachable for ",
                absl::FormatDuration(absl::Now() - last_seen[w]), ": ", st.message()));
          }
          continue;
        }
        last_seen[w] = absl::Now();
        if (s.job_id() != id || s.attempt() != attempt) {
          // A restarted worker process lost the attempt.
          StopEverywhere(id);
          return absl::AbortedError(absl::StrCat("worker ", w, " is not running the job (restarted?)"));
        }
        if (s.state() == v1::WORK_FAILED) {
          StopEverywhere(id);
          return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                              absl::StrCat("worker ", w, ": ", s.error()));
        }
        if (s.state() == v1::WORK_STOPPED) {
          StopEverywhere(id);
          return absl::AbortedError(absl::StrCat("worker ", w, " stopped"));
        }
        if (s.state() == v1::WORK_DONE) ++done;
      }
      if (done == nw) break;
    }
    // Done: the servers' last word on the job, a final checkpoint at their
    // step, then free it.
    std::vector<v1::JobStatus> shards(ps_.size());
    common::RunInParallel(static_cast<int>(ps_.size()), [&](int p) {
      v1::StatusResponse s;
      if (PsStatus(p, id, absl::Seconds(10), &s).ok() && s.jobs_size() == 1) shards[p] = s.jobs(0);
      return absl::OkStatus();
    });
    if (!spec.checkpoint().disabled()) {
      absl::Status s = SaveCheckpoint(id, spec, shards[0].global_step());
      if (!s.ok()) Event(id, v1::JobEvent::LOG, absl::StrCat("final checkpoint failed: ", s.message()));
    }
    int64_t bytes = 0;
    for (const auto& s : shards) bytes += s.bytes_held();
    Update(id, [&](JobEntry& e) {
      e.record.clear_final_shards();
      for (const auto& s : shards) *e.record.add_final_shards() = s;
      e.record.set_variables_bytes(bytes);
    });
    DeleteEverywhere(id).IgnoreError();
    return absl::OkStatus();
  }

  absl::Status StartRemote(int w, const v1::StartJobRequest& req, const std::string& id) {
    const absl::Time give_up = absl::Now() + options_.control_timeout;
    while (true) {
      grpc::ClientContext ctx;
      ctx.set_wait_for_ready(true);
      ctx.set_deadline(DeadlineIn(absl::Seconds(5)));
      v1::StartJobResponse resp;
      absl::Status st = FromGrpcStatus(workers_[w]->StartJob(&ctx, req, &resp));
      if (st.ok()) return st;
      if (absl::IsFailedPrecondition(st)) {
        // Still running an earlier attempt or job: stop it first.
        StopRemote(w, "");
      } else if (!absl::IsUnavailable(st) && !absl::IsDeadlineExceeded(st)) {
        return st;
      }
      if (CancelRequested(id)) return absl::CancelledError("cancelled");
      if (absl::Now() >= give_up) return st;
      absl::SleepFor(absl::Milliseconds(200));
    }
  }

  void StopRemote(int w, const std::string& id) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(absl::Seconds(35)));
    v1::StopJobRequest r;
    r.set_job_id(id);
    v1::StopJobResponse resp;
    workers_[w]->StopJob(&ctx, r, &resp);
  }

  // Asks every worker to stop the job, and frees it on the servers so that
  // waits on it end at once. Waits (bounded) for the workers to stop.
  void StopEverywhere(const std::string& id) {
    const int nw = static_cast<int>(workers_.size());
    // Stop flags first, then delete on the servers to wake blocked pulls.
    std::thread local([&] { options_.local->Stop(id); });
    std::vector<std::thread> remote;
    for (int w = 0; w < nw; ++w) {
      if (workers_[w] != nullptr) remote.emplace_back([&, w] { StopRemote(w, id); });
    }
    absl::SleepFor(absl::Milliseconds(100));
    common::RunInParallel(static_cast<int>(ps_.size()), [&](int p) { return DeleteOn(p, id, absl::Seconds(5)); });
    local.join();
    for (auto& t : remote) t.join();
  }

  absl::Status DeleteOn(int p, const std::string& id, absl::Duration timeout) {
    grpc::ClientContext ctx;
    ctx.set_wait_for_ready(true);
    ctx.set_deadline(DeadlineIn(timeout));
    v1::DeleteJobRequest r;
    r.set_job_id(id);
    v1::DeleteJobResponse resp;
    absl::Status st = FromGrpcStatus(ps_[p]->DeleteJob(&ctx, r, &resp));
    if (st.ok() && resp.existed()) {
      TLOG(INFO) << "chief: job \"" << id << "\" freed on ps " << p << " (" << resp.bytes_freed()
                 << " bytes)";
    }
    return st;
  }

  // Every ps must confirm (a ps that is down is waited for: it will come
  // back without the job), so that no attempt starts on stale variables.
  absl::Status DeleteEverywhere(const std::string& id) {
    const absl::Time give_up = absl::Now() + options_.control_timeout;
    std::vector<absl::Status> r = common::RunInParallel(static_cast<int>(ps_.size()), [&](int p) {
      while (true) {
        absl::Status st = DeleteOn(p, id, absl::Seconds(2));
        if (st.ok()) return st;
        if (CancelRequested(id)) return st;  // cancelling or shutting down: best effort
        if (absl::Now() >= give_up) return common::Annotate(st, absl::StrCat("ps ", p));
      }
    });
    for (const auto& s : r) {
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // One ps's status of `job_id` (every job if empty).
  absl::Status PsStatus(int p, const std::string& job_id, absl::Duration timeout,
                        v1::StatusResponse* out) {
    v1::StatusRequest r;
    r.set_job_id(job_id);
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(timeout));
    return FromGrpcStatus(ps_[p]->GetStatus(&ctx, r, out));
  }

  absl::Status WorkerStatus(int w, absl::Duration timeout, v1::WorkerStatus* out) {
    if (workers_[w] == nullptr) {
      *out = options_.local->Status();
      return absl::OkStatus();
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(timeout));
    return FromGrpcStatus(workers_[w]->GetStatus(&ctx, v1::WorkerStatusRequest(), out));
  }

  void OnMetrics(const std::string& id, const v1::Metrics& m, bool epoch_end,
                 common::EventWriter* tb) {
    {
      absl::MutexLock lock(&mu_);
      auto it = jobs_.find(id);
      if (it == jobs_.end()) return;
      JobEntry& e = *it->second;
      v1::Metrics* r = e.record.mutable_metrics();
      if (epoch_end) {
        r->set_test_loss(m.test_loss());
        r->set_test_accuracy(m.test_accuracy());
        r->set_has_test(true);
        r->set_epoch(m.epoch());
        r->set_epochs(m.epochs());
        r->set_learning_rate(m.learning_rate());
        r->set_has_accuracy(m.has_accuracy());
      } else {
        const v1::Metrics test = *r;
        *r = m;
        r->set_test_loss(test.test_loss());
        r->set_test_accuracy(test.test_accuracy());
        r->set_has_test(test.has_test());
      }
      // The metrics are the message; towerctl formats them.
      AddEventLocked(e, epoch_end ? v1::JobEvent::EPOCH : v1::JobEvent::PROGRESS, "", r);
      PersistLocked(e);
    }
    if (tb == nullptr) return;
    if (epoch_end) {
      tb->AddScalar("test/loss", m.step(), m.test_loss()).IgnoreError();
      if (m.has_accuracy()) tb->AddScalar("test/accuracy", m.step(), m.test_accuracy()).IgnoreError();
      tb->AddScalar("epoch/learning_rate", m.step(), m.learning_rate()).IgnoreError();
    } else {
      tb->AddScalar("train/loss", m.step(), m.loss()).IgnoreError();
      if (m.has_accuracy()) tb->AddScalar("train/accuracy", m.step(), m.accuracy()).IgnoreError();
      tb->AddScalar("train/learning_rate", m.step(), m.learning_rate()).IgnoreError();
      tb->AddScalar("train/examples_per_s", m.step(), m.examples_per_s()).IgnoreError();
    }
    tb->Flush().IgnoreError();
  }

  // Called on the chief's training thread after each pull (SYNC: every
  // server is at exactly `step` while the chief has not pushed).
  void MaybeCheckpoint(const std::string& id, const v1::JobSpec& spec, int64_t step,
                       AttemptState* state) {
    const v1::CheckpointSpec& c = spec.checkpoint();
    if (c.disabled() || step <= 0 || step == state->last_checkpoint_step) return;
    const bool by_steps = c.every_steps() > 0 && step % c.every_steps() == 0;
    const bool by_time = c.every_seconds() > 0 &&
                         absl::Now() - state->last_checkpoint_time >= absl::Seconds(c.every_seconds());
    if (!by_steps && !by_time) return;
    state->last_checkpoint_step = step;
    state->last_checkpoint_time = absl::Now();
    absl::Status s = SaveCheckpoint(id, spec, step);
    if (!s.ok()) {
      Event(id, v1::JobEvent::LOG, absl::StrCat("checkpoint at step ", step, " failed: ", s.message()));
      TLOG(WARNING) << "chief: job \"" << id << "\": checkpoint at step " << step << " failed: " << s;
    }
  }

  // Every ps writes its shard; then the manifest names the checkpoint as the
  // one of `step` (the servers' step: the chief's pull, or the end).
  absl::Status SaveCheckpoint(const std::string& id, const v1::JobSpec& spec, int64_t step) {
    const int nps = static_cast<int>(ps_.size());
    const std::string dir = spec.checkpoint().dir();
    const std::string name = common::CheckpointDirName(step);
    std::vector<v1::SaveResponse> saved(nps);
    std::vector<absl::Status> r = common::RunInParallel(nps, [&](int p) {
      v1::SaveRequest req;
      req.set_job_id(id);
      req.set_checkpoint_dir(dir + "/" + name);
      req.set_num_ps(nps);
      grpc::ClientContext ctx;
      ctx.set_deadline(DeadlineIn(absl::Seconds(120)));
      return common::Annotate(FromGrpcStatus(ps_[p]->SaveCheckpoint(&ctx, req, &saved[p])),
                              absl::StrCat("ps ", p));
    });
    int64_t bytes = 0;
    for (int p = 0; p < nps; ++p) {
      TOWERPS_RETURN_IF_ERROR(r[p]);
      bytes += saved[p].bytes();
      if (saved[p].global_step() != step) {
        Event(id, v1::JobEvent::LOG,
              absl::StrCat("checkpoint ", name, ": ps ", p, " saved step ", saved[p].global_step(),
                           " (asynchronous training moves on while saving)"));
      }
    }
    common::ManifestEntry entry;
    entry.step = step;
    entry.dir_name = name;
    entry.num_ps = nps;
    entry.unix_time = UnixNow();
    TOWERPS_RETURN_IF_ERROR(common::AddToManifest(dir, entry, spec.checkpoint().keep()));
    Update(id, [&](JobEntry& e) { e.record.set_checkpoint_step(step); });
    Event(id, v1::JobEvent::LOG,
          absl::StrFormat("checkpoint %s written: %d shards, %.1f MB", name, nps, bytes / 1e6));
    return absl::OkStatus();
  }

  v1::JobLiveStatus Live(const v1::JobRecord& record) {
    const std::string& id = record.job_id();
    const int nps = static_cast<int>(ps_.size()), nw = static_cast<int>(workers_.size());
    v1::JobLiveStatus live;
    std::vector<v1::ShardStatus> shards(nps);
    std::vector<v1::WorkerProgress> workers(nw);
    common::RunInParallel(nps + nw, [&](int i) {
      if (i < nps) {
        v1::ShardStatus& sh = shards[i];
        sh.set_ps_task(i);
        sh.set_address(options_.cluster.ps[i]);
        v1::StatusResponse s;
        absl::Status st = PsStatus(i, id, absl::Seconds(2), &s);
        sh.set_reachable(st.ok());
        if (!st.ok()) sh.set_error(std::string(st.message()));
        if (st.ok() && s.jobs_size() == 1) *sh.mutable_status() = s.jobs(0);
        if (st.ok() && s.jobs_size() == 0) sh.set_error("job not registered here (yet)");
      } else {
        const int w = i - nps;
        v1::WorkerProgress& wp = workers[w];
        wp.set_task_index(w);
        wp.set_address(options_.cluster.worker[w]);
        v1::WorkerStatus s;
        absl::Status st = WorkerStatus(w, absl::Seconds(2), &s);
        wp.set_reachable(st.ok());
        if (!st.ok()) wp.set_error(std::string(st.message()));
        if (st.ok() && s.job_id() == id) {
          wp.set_state(s.state());
          wp.set_iterations(s.iterations());
          wp.set_last_step(s.last_step());
          wp.set_error(s.error());
        }
      }
      return absl::OkStatus();
    });
    int64_t step = -1;
    double waited = 0;
    std::vector<int> waiting;
    for (auto& sh : shards) {
      if (sh.has_status()) {
        step = step < 0 ? sh.status().global_step() : std::min(step, sh.status().global_step());
        if (sh.status().step_open_s() >= waited) {
          waited = sh.status().step_open_s();
          waiting.assign(sh.status().waiting_for().begin(), sh.status().waiting_for().end());
        }
      }
      *live.add_shards() = std::move(sh);
    }
    for (auto& w : workers) *live.add_workers() = std::move(w);
    live.set_global_step(std::max<int64_t>(step, 0));
    // Past the last step the servers still hold the next step open, but no
    // worker will push it: the chief is evaluating or writing the final
    // checkpoint, and nobody is waited for.
    const int64_t total = record.metrics().total_steps();
    const bool trained = total > 0 && step >= total;
    const bool sync = record.spec().mode() != v1::ASYNC;
    if (sync && !trained) {
      for (int w : waiting) live.add_waiting_for(w);
      live.set_waiting_s(waited);
    }
    // The most useful single line: a step stuck on some workers first (and
    // whether they answer at all), then unreachable tasks.
    std::string explanation;
    if (sync && !trained && !waiting.empty() && waited >= 2.0) {
      std::vector<std::string> silent;
      for (int w : waiting) {
        if (w < static_cast<int>(live.workers_size()) && !live.workers(w).reachable()) {
          silent.push_back(absl::StrCat(w));
        }
      }
      explanation = absl::StrFormat(
          "step %d has waited %.1f s for worker%s %s%s", step, waited, waiting.size() > 1 ? "s" : "",
          absl::StrJoin(waiting, ", "),
          silent.empty() ? ""
                         : absl::StrCat(" (worker ", absl::StrJoin(silent, ", "),
                                        " does not answer status requests either: stopped, "
                                        "hung or overloaded?)"));
    }
    for (const auto& sh : live.shards()) {
      if (explanation.empty() && !sh.reachable()) {
        explanation = absl::StrCat("ps ", sh.ps_task(), " (", sh.address(), ") is unreachable: ",
                                   sh.error());
      }
    }
    for (const auto& w : live.workers()) {
      if (explanation.empty() && !w.reachable()) {
        explanation = absl::StrCat("worker ", w.task_index(), " (", w.address(),
                                   ") is unreachable: ", w.error());
      }
    }
    if (explanation.empty() && trained) {
      explanation = absl::StrCat("trained all ", total,
                                 " steps: evaluating and writing the final checkpoint");
    }
    if (explanation.empty() && step < 0) {
      explanation = "starting: the servers do not hold the job's variables yet";
    }
    if (explanation.empty()) explanation = absl::StrCat("running: step ", step);
    live.set_explanation(explanation);
    return live;
  }

  const JobManagerOptions options_;
  std::vector<std::unique_ptr<v1::ParameterService::Stub>> ps_;
  std::vector<std::unique_ptr<v1::WorkerService::Stub>> workers_;  // null: this task
  std::thread runner_;

  absl::Mutex mu_;
  absl::CondVar changed_;
  std::map<std::string, std::shared_ptr<JobEntry>> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);  // submission order
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

// ---------------------------------------------------------------------------

JobManager::JobManager(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
JobManager::~JobManager() = default;

absl::StatusOr<std::unique_ptr<JobManager>> JobManager::Create(JobManagerOptions options) {
  if (options.state_dir.empty()) return absl::InvalidArgumentError("--state_dir is empty");
  if (options.local == nullptr) return absl::InvalidArgumentError("job manager: no local worker");
  if (!options.cluster.is_chief()) {
    return absl::FailedPreconditionError("the job service runs on the chief (worker 0) only");
  }
  return std::unique_ptr<JobManager>(new JobManager(std::make_unique<Impl>(std::move(options))));
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
