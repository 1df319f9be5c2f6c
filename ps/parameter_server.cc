#include "ps/parameter_server.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/initializer.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/storage/checkpoint.h"
#include "google/protobuf/util/message_differencer.h"
#include "ps/job_state.h"
#include "ps/optimizer.h"

namespace towerps::ps {

using internal::AllFinite;
using internal::Job;

namespace {

// RunLater's threads. An update is one pass over a job's shard, memory-bound,
// and one job's run one at a time; a second thread lets another job's update
// go meanwhile.
constexpr int kUpdaterThreads = 2;

}  // namespace

ParameterServer::ParameterServer(ParameterServerOptions options)
    : options_(std::move(options)),
      incarnation_(static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())) ^
                   (static_cast<uint64_t>(options_.task_index) << 48)) {
  for (int i = 0; i < kUpdaterThreads; ++i) {
    updaters_.push_back(std::make_unique<common::SerialExecutor>(absl::StrCat("update ", i)));
  }
}

ParameterServer::~ParameterServer() {
  updaters_.clear();  // runs the updates still scheduled, then joins: they use the jobs
}

void ParameterServer::RunLater(std::unique_ptr<Commit> commit, absl::Duration served) {
  const std::string job_id = commit->job_->id;
  common::SerialExecutor& updater =
      *updaters_[std::hash<std::string>()(job_id) % updaters_.size()];
  std::shared_ptr<Commit> c = std::move(commit);
  updater.Schedule([this, c, job_id, served] {
    const absl::Time start = absl::Now();
    c->Run();
    RecordRequest(job_id, served + (absl::Now() - start));
  });
}

absl::StatusOr<std::shared_ptr<Job>> ParameterServer::FindJob(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "job \"", id, "\" is not registered on ps ", options_.task_index));
  }
  return it->second;
}

absl::StatusOr<std::string> ParameterServer::ConfinedDir(absl::string_view field,
                                                         const std::string& dir) const {
  if (!options_.checkpoint_roots.has_value()) return dir;
  return options_.checkpoint_roots->Resolve(field, dir);
}

absl::StatusOr<v1::RegisterResponse> ParameterServer::Register(
    const v1::RegisterRequest& original) {
  // restore_from is read from as checked: its normal form, under --state_dir.
  v1::RegisterRequest confined;
  if (!original.restore_from().empty()) {
    TOWERPS_ASSIGN_OR_RETURN(std::string dir,
                             ConfinedDir("register: restore_from", original.restore_from()));
    if (dir != original.restore_from()) {
      confined = original;
      confined.set_restore_from(dir);
    }
  }
  const v1::RegisterRequest& request = confined.job_id().empty() ? original : confined;
  TOWERPS_RETURN_IF_ERROR(ValidateRegister(request, options_.max_job_bytes));
  const v1::TrainingConfig config = NormalizedConfig(request.config());
  const int64_t need = RegisterFootprintBytes(request, config);
  v1::RegisterResponse response;
  {
    absl::MutexLock lock(&mu_);
    if (creating_.count(request.job_id()) > 0) {
      ++registers_waiting_;
      while (creating_.count(request.job_id()) > 0) created_.Wait(&mu_);
      --registers_waiting_;
    }
    auto it = jobs_.find(request.job_id());
    if (it != jobs_.end()) {
      Job& job = *it->second;
      if (!google::protobuf::util::MessageDifferencer::Equals(job.config, config)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "register: job \"", request.job_id(),
            "\" exists with a different training config (", job.config.ShortDebugString(),
            " vs ", config.ShortDebugString(), ")"));
      }
      absl::MutexLock job_lock(&job.mu);
      if (job.vars.size() != static_cast<size_t>(request.variables_size())) {
        return absl::FailedPreconditionError(absl::StrCat(
            "register: job \"", request.job_id(), "\" exists with ", job.vars.size(),
            " variables here, the request has ", request.variables_size()));
      }
      for (size_t i = 0; i < job.vars.size(); ++i) {
        if (!google::protobuf::util::MessageDifferencer::Equals(job.vars[i].def,
                                                                request.variables(i))) {
          return absl::FailedPreconditionError(absl::StrCat(
              "register: job \"", request.job_id(), "\" variable ", i, " is \"",
              job.vars[i].def.name(), "\" here but differs in the request"));
        }
      }
      if (request.has_worker_task()) job.HeardLocked(request.worker_task(), "register");
      response.set_created(false);
      response.set_global_step(job.global_step);
      response.set_incarnation(Incarnation());
      return response;
    }
    if (need > options_.max_job_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "register: ", FootprintDetail(request, config, need), "; the limit is ",
          options_.max_job_bytes, " bytes per job on this server (--max_job_bytes)"));
    }
    if (need > options_.memory_budget_bytes - reserved_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "register: ", FootprintDetail(request, config, need), ", but ", reserved_bytes_,
          " bytes are already held by ", jobs_.size(), " jobs on this server and its budget is ",
          options_.memory_budget_bytes, " bytes (--memory_budget_bytes)"));
    }
    reserved_bytes_ += need;
    creating_.insert(request.job_id());
  }
  // Build outside the server lock: initialization of large jobs takes time.
  // The bytes are reserved first, so that concurrent registers cannot pass
  // the budget together, and other registers of this job wait for it.
  if (options_.before_create_job) options_.before_create_job();
  absl::StatusOr<std::shared_ptr<Job>> created = CreateJob(request, config);
  absl::MutexLock lock(&mu_);
  creating_.erase(request.job_id());
  created_.SignalAll();
  if (!created.ok()) {
    reserved_bytes_ -= need;
    return created.status();
  }
  std::shared_ptr<Job> job = *std::move(created);
  job->reserved = need;
  auto [it, inserted] = jobs_.emplace(request.job_id(), job);
  if (!inserted) reserved_bytes_ -= need;  // (creating_ rules it out; a guard)
  response.set_created(inserted);
  if (inserted && options_.apply_log != nullptr) {
    absl::MutexLock job_lock(&job->mu);
    Record(absl::StrCat(job->restored_step >= 0 ? "restore " : "create ", request.job_id(), " ",
                        job->global_step));
  }
  if (inserted) {
    int64_t slots = 0;
    {
      absl::MutexLock job_lock(&job->mu);
      slots = job->slot_bytes();
    }
    TLOG(INFO) << "ps " << options_.task_index << ": job \"" << request.job_id()
               << "\" registered: " << request.variables_size() << " variables, "
               << job->bytes() << " bytes, optimizer slots " << slots << " bytes, "
               << v1::Mode_Name(config.mode())
               << ", workers=" << config.num_workers()
               << ", replicas_to_aggregate=" << job->replicas << ", optimizer "
               << config.optimizer().ShortDebugString();
  }
  absl::MutexLock job_lock(&it->second->mu);
  if (request.has_worker_task()) it->second->HeardLocked(request.worker_task(), "register");
  response.set_global_step(it->second->global_step);
  response.set_restored_step(it->second->restored_step);
  response.set_incarnation(Incarnation());
  return response;
}

absl::StatusOr<std::shared_ptr<Job>> ParameterServer::CreateJob(
    const v1::RegisterRequest& request, const v1::TrainingConfig& config) {
  auto job = std::make_shared<Job>(request.job_id(), config);
  absl::MutexLock job_lock(&job->mu);
  for (const auto& def : request.variables()) {
    internal::Variable v;
    v.def = def;
    int64_t n = 1;
    for (int64_t d : def.shape()) n *= d;
    v.value.resize(n);
    TOWERPS_ASSIGN_OR_RETURN(v.optimizer, NewVariableUpdater(def, config.optimizer(), n));
    job->sizes.push_back(n);
    job->update_kinds.push_back(def.update());
    job->vars.push_back(std::move(v));
  }
  job->workers.resize(config.num_workers());
  if (request.restore_from().empty()) {
    for (auto& v : job->vars) {
      common::InitializeValues(v.def.initializer(), absl::MakeSpan(v.value));
      v.bounds = MeasureBounds(v.value, *v.optimizer);
    }
    return job;
  }
  // Restore: the shard must describe exactly the variables registered here
  // (names, shapes, update rule) and the optimizer's slots; anything else is
  // refused and nothing is created. A MOVING_AVERAGE variable has no slots; its
  // decay may differ from the saved one (it is the registration's to choose).
  const int num_ps = std::max(1, request.num_ps());
  const std::string path = absl::StrCat(request.restore_from(), "/",
                                        common::ShardFileName(options_.task_index, num_ps));
  TOWERPS_ASSIGN_OR_RETURN(common::ShardState shard, common::ReadShard(path));
  auto mismatch = [&](const std::string& what) {
    return absl::FailedPreconditionError(
        absl::StrCat("restore: ", path, ": ", what, "; not restored"));
  };
  if (shard.vars.size() != job->vars.size()) {
    return mismatch(absl::StrCat("holds ", shard.vars.size(), " variables, the job registers ",
                                 job->vars.size(), " on this server"));
  }
  for (size_t i = 0; i < job->vars.size(); ++i) {
    internal::Variable& v = job->vars[i];
    common::VariableState& saved = shard.vars[i];
    if (saved.def.name() != v.def.name() ||
        !std::equal(saved.def.shape().begin(), saved.def.shape().end(),
                    v.def.shape().begin(), v.def.shape().end()) ||
        saved.value.size() != v.value.size()) {
      return mismatch(absl::StrCat("variable ", i, " is \"", saved.def.name(), "\" ",
                                   absl::StrJoin(saved.def.shape(), "x"), ", the job has \"",
                                   v.def.name(), "\" ", absl::StrJoin(v.def.shape(), "x")));
    }
    if (saved.def.update() != v.def.update()) {
      // The file's value is not validated: a number where no name exists.
      auto name = [](v1::VariableDef::Update u) {
        return v1::VariableDef::Update_IsValid(u) ? v1::VariableDef::Update_Name(u)
                                                  : absl::StrCat(static_cast<int>(u));
      };
      return mismatch(absl::StrCat("variable \"", v.def.name(), "\" has update ",
                                   name(saved.def.update()), ", the job registers it with update ",
                                   name(v.def.update())));
    }
    auto slots = v.optimizer->Slots();
    if (slots.size() != saved.slots.size()) {
      return mismatch(absl::StrCat("variable \"", v.def.name(), "\" has ", saved.slots.size(),
                                   " optimizer slots, the job's optimizer has ", slots.size()));
    }
    for (size_t k = 0; k < slots.size(); ++k) {
      if (slots[k].first != saved.slots[k].name ||
          slots[k].second.size() != saved.slots[k].values.size()) {
        return mismatch(absl::StrCat("variable \"", v.def.name(), "\" slot \"",
                                     saved.slots[k].name, "\" does not match the optimizer's \"",
                                     slots[k].first, "\""));
      }
      std::copy(saved.slots[k].values.begin(), saved.slots[k].values.end(),
                slots[k].second.begin());
    }
    // What no update leaves: refused, so that a restored job trains from
    // finite state (and the overflow guard's bounds hold).
    if (!AllFinite(saved.value.data(), static_cast<int64_t>(saved.value.size()))) {
      return mismatch(absl::StrCat("variable \"", v.def.name(), "\" holds NaN or Inf"));
    }
    for (const auto& [name, slot] : slots) {
      if (!AllFinite(slot.data(), static_cast<int64_t>(slot.size()))) {
        return mismatch(absl::StrCat("variable \"", v.def.name(), "\" slot \"", name,
                                     "\" holds NaN or Inf"));
      }
    }
    if (absl::Status st = v.optimizer->CheckRestoredSlots(); !st.ok()) {
      return mismatch(absl::StrCat("variable \"", v.def.name(), "\" ", st.message()));
    }
    v.value = std::move(saved.value);
    v.updates = saved.updates;
    v.bounds = MeasureBounds(v.value, *v.optimizer);
  }
  job->global_step = shard.global_step;
  job->restored_step = shard.global_step;
  for (size_t w = 0; w < job->workers.size() && w < shard.worker_completed.size(); ++w) {
    job->workers[w].completed = shard.worker_completed[w];
  }
  TLOG(INFO) << "ps " << options_.task_index << ": job \"" << request.job_id()
             << "\" restored from " << path << " at step " << shard.global_step;
  return job;
}

absl::StatusOr<v1::SaveResponse> ParameterServer::Save(const v1::SaveRequest& request) {
  if (request.checkpoint_dir().empty()) {
    return absl::InvalidArgumentError("save: checkpoint_dir is empty");
  }
  // Checked before anything else: a caller learns nothing about jobs from a
  // path outside --state_dir, and the shard goes to the path as checked.
  TOWERPS_ASSIGN_OR_RETURN(const std::string checkpoint_dir,
                           ConfinedDir("save: checkpoint_dir", request.checkpoint_dir()));
  TOWERPS_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(request.job_id()));
  // A view of the job at its current step, taken under the lock (no copy:
  // spans); written without it. An update meanwhile leaves the view its
  // buffers (Job::DetachViewsLocked).
  auto view = std::make_shared<internal::SaveView>();
  common::ShardView& shard = view->shard;
  shard.job_id = job->id;
  shard.ps_task = options_.task_index;
  shard.num_ps = std::max(1, request.num_ps());
  {
    absl::MutexLock lock(&job->mu);
    job->AwaitCommitLocked(options_.on_commit_wait);  // a whole step, never part of one
    if (job->deleted) return absl::AbortedError("save: job was deleted");
    shard.global_step = job->global_step;
    for (auto& v : job->vars) {
      common::ShardView::Variable& out = shard.vars.emplace_back();
      out.def = v.def;
      out.value = v.value;
      out.updates = v.updates;
      for (auto& [name, span] : v.optimizer->Slots()) out.slots.push_back({name, span});
    }
    for (const auto& w : job->workers) shard.worker_completed.push_back(w.completed);
    job->saves.push_back(view);
  }
  if (options_.after_save_view) options_.after_save_view();
  TOWERPS_ASSIGN_OR_RETURN(std::string path, common::WriteShard(checkpoint_dir, shard));
  if (options_.apply_log != nullptr) {
    Record(absl::StrCat("save ", job->id, " ", shard.global_step));
  }
  int64_t bytes = 0;
  for (const auto& v : shard.vars) {
    bytes += 4 * static_cast<int64_t>(v.value.size());
    for (const auto& sl : v.slots) bytes += 4 * static_cast<int64_t>(sl.values.size());
  }
  const int64_t step = shard.global_step;
  view.reset();  // the job's buffers are its own again
  v1::SaveResponse response;
  response.set_path(path);
  response.set_global_step(step);
  response.set_bytes(bytes);
  return response;
}

v1::StatusResponse ParameterServer::Status(const v1::StatusRequest& request) {
  v1::StatusResponse response;
  response.set_task_index(options_.task_index);
  std::vector<std::shared_ptr<Job>> jobs;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, job] : jobs_) {
      if (request.job_id().empty() || request.job_id() == id) jobs.push_back(job);
    }
  }
  for (const auto& job : jobs) {
    absl::MutexLock lock(&job->mu);
    v1::JobStatus* s = response.add_jobs();
    s->set_job_id(job->id);
    s->set_global_step(job->global_step);
    s->set_num_variables(job->vars.size());
    s->set_bytes_held(job->bytes());
    s->set_pushes_applied(job->applied);
    s->set_pushes_stale(job->stale);
    s->set_pushes_duplicate(job->duplicate);
    s->set_pulls_waiting(job->pulls_waiting);
    s->set_pushes_waiting(job->pushes_waiting);
    const absl::Time now = absl::Now();
    if (job->config.mode() == v1::SYNC) {
      for (int w : job->pushed) s->add_pushed_this_step(w);
      for (int w : job->WaitingForLocked()) s->add_waiting_for(w);
      s->set_step_open_s(absl::ToDoubleSeconds(now - job->step_opened));
    }
    job->RollLocked(now);
    // Rate over the previous full window plus the current partial one, or
    // over the job's life while it is younger than a window (not as though
    // it had idled a whole window before: 8x too low in its first seconds).
    const absl::Time from = std::max(job->window_start - Job::kWindow, job->created);
    const double span = absl::ToDoubleSeconds(now - from);
    const int64_t n = job->window_requests[0] + job->window_requests[1];
    s->set_requests_per_s(n / std::max(span, 1e-3));
    s->set_mean_latency_ms(
        n > 0 ? 1e3 * (job->window_service_s[0] + job->window_service_s[1]) / n : 0);
    s->set_restored_step(job->restored_step);
    s->set_steps_applied(job->steps_applied);
    s->set_updates_ahead(job->updates_ahead);
    s->set_updates_skipped(job->updates_skipped);
    s->set_pushes_named_at_once(job->pushes_named_at_once);
    s->set_segment_pull_values(job->segment_pull_values);
    s->set_values_in_place(job->values_in_place);
    job->UpdateSpanLocked(s);
    s->set_slot_bytes(job->slot_bytes());
  }
  response.set_uptime_s(absl::ToDoubleSeconds(absl::Now() - started_));
  response.set_incarnation(Incarnation());
  if (options_.memory_budget_bytes < INT64_MAX) {
    response.set_memory_budget_bytes(options_.memory_budget_bytes);
  }
  response.set_memory_reserved_bytes(reserved_bytes());
  return response;
}

void ParameterServer::RecordRequest(const std::string& job_id, absl::Duration service_time) {
  std::shared_ptr<Job> job;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return;
    job = it->second;
  }
  absl::MutexLock lock(&job->mu);
  job->RollLocked(absl::Now());
  ++job->window_requests[0];
  job->window_service_s[0] += absl::ToDoubleSeconds(service_time);
}

void ParameterServer::StopWaiting() {
  stopping_.store(true);
  std::vector<std::shared_ptr<Job>> jobs;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, job] : jobs_) jobs.push_back(job);
  }
  for (const auto& job : jobs) {
    absl::MutexLock lock(&job->mu);
    job->changed.SignalAll();
  }
}

int ParameterServer::registers_waiting() {
  absl::MutexLock lock(&mu_);
  return registers_waiting_;
}

int64_t ParameterServer::reserved_bytes() {
  absl::MutexLock lock(&mu_);
  return reserved_bytes_;
}

v1::DeleteJobResponse ParameterServer::DeleteJob(const v1::DeleteJobRequest& request) {
  v1::DeleteJobResponse response;
  std::shared_ptr<Job> job;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(request.job_id());
    if (it == jobs_.end()) return response;
    job = std::move(it->second);
    jobs_.erase(it);
    if (options_.apply_log != nullptr) Record(absl::StrCat("delete ", request.job_id()));
    reserved_bytes_ -= job->reserved;
  }
  int64_t freed = job->bytes();
  std::string details;  // DescribeUpdates
  {
    absl::MutexLock lock(&job->mu);
    // A Commit updates the variables in place; a push preparing ahead reads
    // them.
    while (job->committing || job->preparing > 0) {
      job->AwaitCommitLocked(options_.on_commit_wait);
      job->AwaitPreparingLocked();
    }
    v1::JobStatus counts;
    counts.set_steps_applied(job->steps_applied);
    counts.set_updates_ahead(job->updates_ahead);
    counts.set_updates_skipped(job->updates_skipped);
    counts.set_pushes_applied(job->applied);
    counts.set_pushes_named_at_once(job->pushes_named_at_once);
    counts.set_segment_pull_values(job->segment_pull_values);
    counts.set_values_in_place(job->values_in_place);
    job->UpdateSpanLocked(&counts);
    details = DescribeUpdates(counts);
    if (!details.empty()) details = absl::StrCat("; ", details);
    freed += job->slot_bytes();
    job->deleted = true;
    // Free the memory now, not when the last waiting pull lets go of the job.
    // Pulls still streaming and saves still writing keep what they view.
    job->DetachViewsLocked(/*keep_copies=*/false);
    job->vars.clear();
    job->vars.shrink_to_fit();
    job->staged.clear();
    job->free_buffers.clear();
    job->free_slots.clear();
    job->snapshot.reset();
    job->detached.clear();
    job->spare.clear();
    job->changed.SignalAll();
  }
  response.set_existed(true);
  response.set_bytes_freed(freed);
  TLOG(INFO) << "ps " << options_.task_index << ": job \"" << request.job_id()
             << "\" deleted, " << freed << " bytes freed" << details;
  return response;
}

absl::StatusOr<v1::HeartbeatResponse> ParameterServer::Heartbeat(
    const v1::HeartbeatRequest& request) {
  TOWERPS_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(request.job_id()));
  TOWERPS_RETURN_IF_ERROR(
      CheckWorkerTask("heartbeat", request.worker_task(), job->config.num_workers()));
  absl::MutexLock lock(&job->mu);
  job->HeardLocked(request.worker_task(), "heartbeat");
  v1::HeartbeatResponse response;
  response.set_global_step(job->global_step);
  response.set_incarnation(Incarnation());
  return response;
}

absl::StatusOr<std::vector<v1::VariableDef>> ParameterServer::Variables(
    const std::string& job_id) {
  TOWERPS_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(job_id));
  absl::MutexLock lock(&job->mu);
  std::vector<v1::VariableDef> out;
  for (const auto& v : job->vars) out.push_back(v.def);
  return out;
}

std::string DescribeUpdates(const v1::JobStatus& status) {
  std::vector<std::string> parts;
  if (status.steps_applied() > 0) {
    parts.push_back(absl::StrCat(status.updates_ahead(), " of its ", status.steps_applied(),
                                 " updates formed ahead, during their push"));
  }
  if (status.pushes_applied() > 0) {
    parts.push_back(absl::StrCat(status.pushes_named_at_once(), " of its ",
                                 status.pushes_applied(),
                                 " pushes named every gradient at once, with the commit"));
  }
  if (status.updates_skipped() > 0) {
    parts.push_back(absl::StrCat(status.updates_skipped(),
                                 " variable updates not applied (not finite; see the log)"));
  }
  if (status.segment_pull_values() > 0) {
    parts.push_back(absl::StrCat("of the ", status.segment_pull_values(),
                                 " variables pulled into workers' shared memory, ",
                                 status.values_in_place(), " were there already"));
  }
  if (status.update_span_s() > 0) {
    parts.push_back(absl::StrFormat(
        "process cpu from its first update to its last %.3f s in %.3f s (%.2f cores)",
        status.update_span_cpu_s(), status.update_span_s(),
        status.update_span_cpu_s() / status.update_span_s()));
  }
  return absl::StrJoin(parts, "; ");
}

}  // namespace towerps::ps
