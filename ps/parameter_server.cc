#include "ps/parameter_server.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/initializer.h"
#include "common/logging.h"
#include "common/process_cpu.h"
#include "common/status.h"
#include "common/storage/checkpoint.h"
#include "google/protobuf/util/message_differencer.h"
#include "ps/job_state.h"
#include "ps/optimizer.h"

namespace towerps::ps {

using internal::AllFinite;
using internal::Job;
using internal::ValuesChangedError;
using internal::ZeroBounds;

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

std::unique_ptr<Commit> ParameterServer::MakeCommit(
    std::shared_ptr<Job> job, std::shared_ptr<Publication> publication,
    std::vector<GradientPart> parts,
    std::vector<char> prepared) const {
  std::unique_ptr<Commit> c(new Commit());
  c->job_ = std::move(job);
  c->publication_ = std::move(publication);
  c->parts_ = std::move(parts);
  c->prepared_ = std::move(prepared);
  c->after_publish_ = options_.after_publish;
  c->on_update_skipped_ = options_.on_update_skipped;
  return c;
}

absl::StatusOr<std::unique_ptr<PushSession>> ParameterServer::BeginPush(
    const v1::PushHeader& header) {
  TOWERPS_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(header.job_id()));
  TOWERPS_RETURN_IF_ERROR(
      CheckWorkerTask("push", header.worker_task(), job->config.num_workers()));
  if (header.num_examples() < 0) {
    return absl::InvalidArgumentError("push: num_examples is negative");
  }
  if (header.sequence() == 0) {
    return absl::InvalidArgumentError("push: sequence must start at 1");
  }
  if (!v1::SliceEncoding_IsValid(header.slice_encoding())) {
    return absl::InvalidArgumentError(absl::StrCat("push: unknown slice_encoding ",
                                                   static_cast<int>(header.slice_encoding()),
                                                   " from worker ", header.worker_task()));
  }
  std::unique_ptr<PushSession> s(new PushSession());
  s->job_ = job;
  s->header_ = header;
  s->covered_.assign(job->sizes.size(), 0);
  s->checked_.assign(job->sizes.size(), 0);
  s->abs_sum_.assign(job->sizes.size(), 0.0);
  std::vector<int> slot_counts;  // by var_index, where formed ahead
  const bool in_segment = header.has_segment() && header.slice_encoding() == v1::SLICE_FLOAT32;
  // From the same host, ahead only where the server has cores of its own
  // (push_session.h, "Updates ahead"), and elsewhere the gradients are
  // better named with the commit (push_session.h, "Named with the commit"): read before the
  // job's lock.
  const bool cores_apart =
      in_segment && (options_.as_if_on_cores_apart ||
                     !common::SharesCpusWith(static_cast<pid_t>(header.segment().pid())));
  s->names_with_commit_ = in_segment && !cores_apart;
  {
    // Updates ahead (push_session.h): this push is the step's only
    // gradient, and nothing but it would change the values.
    absl::MutexLock lock(&job->mu);
    if (job->config.num_workers() == 1 && header.num_examples() > 0 && !job->deleted &&
        (job->config.mode() == v1::ASYNC || header.step() == job->global_step)) {
      s->ahead_.assign(job->sizes.size(), 0);
      slot_counts.assign(job->sizes.size(), 0);
      bool any = false;
      for (size_t v = 0; v < job->vars.size(); ++v) {
        // A rule with slots only from the same host, and only where
        // FormsSlotsAhead: each costs a second set of its slots.
        const int slots = job->vars[v].optimizer->num_slots();
        s->ahead_[v] =
            job->vars[v].optimizer->CanApplyInto() &&
            (in_segment ? cores_apart && (slots == 0 || FormsSlotsAhead(static_cast<int>(v),
                                                                         job->sizes[v]))
                        : slots == 0);
        any = any || s->ahead_[v];
        if (s->ahead_[v]) slot_counts[v] = slots;
      }
      if (any) {
        s->prepared_.assign(job->sizes.size(), 0);
        s->formed_sums_.assign(job->sizes.size(), ZeroBounds());
        s->all_checked_.assign(job->sizes.size(), 1);
        s->formed_bounds_.assign(job->sizes.size(), MagnitudeBounds());
        s->ahead_of_ = job->steps_applied;
        // The slots are formed ahead too, apart from the optimizer's: in
        // the buffers the last commit gave back, if it kept them.
        s->slots_ = std::move(job->free_slots);
        job->free_slots.clear();
      } else {
        s->ahead_.clear();
        slot_counts.clear();
      }
    }
  }
  const bool stage_slots =
      std::any_of(slot_counts.begin(), slot_counts.end(), [](int c) { return c > 0; });
  if (stage_slots && s->slots_.empty()) {  // the first push, or another one holds them
    s->slots_.resize(job->sizes.size());
    for (size_t v = 0; v < slot_counts.size(); ++v) {
      s->slots_[v].assign(slot_counts[v], std::vector<float>(job->sizes[v]));
    }
  }
  // Same host: the variables not formed ahead are read in place
  // (PushSession::CanShare), and a buffer is made only for one that comes
  // as slices after all.
  if (in_segment) s->shared_.assign(job->sizes.size(), nullptr);
  if (in_segment && s->ahead_.empty()) {
    s->grads_.resize(job->sizes.size());
    return s;
  }
  {
    absl::MutexLock lock(&job->mu);
    // A Commit gives back the buffers it averages when it ends, a moment
    // after the weights it publishes last (which this worker's push needed
    // first): wait for them rather than allocate another set.
    if (job->free_buffers.empty()) job->AwaitCommitLocked(options_.on_commit_wait);
    if (!job->free_buffers.empty()) {
      s->grads_ = std::move(job->free_buffers.back());
      job->free_buffers.pop_back();
    }
  }
  if (s->grads_.size() != job->sizes.size()) {
    s->grads_.clear();
    s->grads_.resize(job->sizes.size());
  }
  // A buffer for each variable, except those read in place (same host, not
  // formed ahead: Reserve makes one only if it comes as slices after all).
  for (size_t v = 0; v < s->grads_.size(); ++v) {
    const bool read_in_place = in_segment && (s->ahead_.empty() || !s->ahead_[v]);
    if (!read_in_place && s->grads_[v].size() != static_cast<size_t>(job->sizes[v])) {
      s->grads_[v].assign(static_cast<size_t>(job->sizes[v]), 0.0f);
    }
  }
  return s;
}

absl::StatusOr<v1::PushResponse> ParameterServer::FinishPush(std::unique_ptr<PushSession> s,
                                                             std::unique_ptr<Commit>* commit) {
  std::unique_ptr<Commit> update;
  absl::StatusOr<v1::PushResponse> response = DecidePush(std::move(s), &update);
  if (commit != nullptr) {
    *commit = std::move(update);
  } else if (update != nullptr) {
    update->Run();
  }
  return response;
}

absl::StatusOr<v1::PushResponse> ParameterServer::DecidePush(std::unique_ptr<PushSession> s,
                                                             std::unique_ptr<Commit>* update) {
  Job& job = *s->job_;
  const v1::PushHeader& h = s->header_;
  for (size_t v = 0; v < job.sizes.size(); ++v) {
    if (s->covered_[v] != job.sizes[v]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push: incomplete: variable ", v, " got ", s->covered_[v], " of ",
          job.sizes[v], " elements; nothing applied"));
    }
  }
  TOWERPS_RETURN_IF_ERROR(s->CheckFinite());
  v1::PushResponse response;
  response.set_names_with_commit(s->names_with_commit_);
  absl::MutexLock lock(&job.mu);
  // Before anything is read: the wait releases the lock.
  job.AwaitWritableLocked(options_.on_commit_wait);
  if (job.deleted) {
    return absl::AbortedError(absl::StrCat("push: job \"", job.id, "\" was deleted on ps ",
                                           options_.task_index));
  }
  job.HeardLocked(h.worker_task(), "push");
  internal::WorkerRecord& rec = job.workers[h.worker_task()];
  if (rec.seen && rec.incarnation == h.incarnation() && h.sequence() <= rec.last_sequence) {
    ++job.duplicate;
    response.set_outcome(v1::PushResponse::DUPLICATE);
    response.set_global_step(job.global_step);
    return response;
  }
  if (job.config.mode() == v1::SYNC && h.step() > job.global_step) {
    return absl::FailedPreconditionError(absl::StrCat(
        "push: step ", h.step(), " from worker ", h.worker_task(),
        " is ahead of the server's step ", job.global_step));
  }
  // Updates ahead: formed from the values of step ahead_of_, which an
  // applied push must still find (see PushSession::PrepareAhead).
  std::vector<char> prepared = s->PreparedVariables();
  const bool applies = job.config.mode() == v1::ASYNC ||
                       (h.step() == job.global_step && !job.pushed.count(h.worker_task()));
  if (!prepared.empty() && applies && job.steps_applied != s->ahead_of_) {
    return ValuesChangedError(job, h, /*deleted=*/false);
  }
  // Once the update began (BeginCommitLocked; `parts` its parts): what
  // the push wrote into the worker's segment as it formed its values is
  // the job's values, unless a pull into a segment (or another push) wrote
  // there since it began. And the update writes its new values into each
  // part's worker's segment too (Commit::Run), after the pushes were
  // answered, where that worker's next pull into that very place waits
  // already (until it returns, the worker neither reads nor gives back
  // that memory): those are the job's values once each variable is
  // published (a pull waits for that before it names the variable, and no
  // pull can write there before). Records of other segments are dropped:
  // no value of this update lies there.
  auto vouch = [&](std::vector<GradientPart>& parts) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
    for (GradientPart& p : parts) {
      if (p.values_to.empty()) continue;
      Job::Written& rec = job.written[p.values_key];
      if (rec.at.empty()) {
        rec.at.assign(job.sizes.size(), -1);
        rec.version.assign(job.sizes.size(), -1);
      }
      for (size_t v = 0; v < p.values_to.size(); ++v) {
        if (p.values_to[v] == nullptr || (v < prepared.size() && prepared[v])) continue;
        const bool awaited = std::any_of(
            job.segment_pulls_waiting.begin(), job.segment_pulls_waiting.end(),
            [&](const v1::SharedSegment* pull) {
              return pull->nonce() == p.values_key &&
                     v < static_cast<size_t>(pull->offsets_size()) &&
                     pull->offsets(static_cast<int>(v)) == p.values_at[v];
            });
        if (!awaited) {
          p.values_to[v] = nullptr;
          continue;
        }
        rec.at[v] = p.values_at[v];
        rec.version[v] = job.steps_applied;
      }
    }
    auto own = job.written.find(s->values_segment_);
    if (s->writer_id_ != 0 && job.writer == s->writer_id_ && own != job.written.end()) {
      for (size_t v = 0; v < prepared.size(); ++v) {
        if (prepared[v] && s->written_[v]) own->second.version[v] = job.steps_applied;
      }
    }
    for (auto it = job.written.begin(); it != job.written.end();) {
      const std::vector<int64_t>& version = it->second.version;
      if (std::find(version.begin(), version.end(), job.steps_applied) == version.end()) {
        it = job.written.erase(it);
      } else {
        ++it;
      }
    }
  };
  rec.seen = true;
  rec.incarnation = h.incarnation();
  rec.last_sequence = h.sequence();
  if (job.config.mode() == v1::ASYNC) {
    rec.completed = std::max<int64_t>(rec.completed, h.sequence());
    if (h.num_examples() > 0) {
      std::vector<GradientPart> parts;
      parts.push_back(s->TakePart(1.0f));
      std::shared_ptr<Publication> publication =
          job.BeginCommitLocked(prepared, &parts[0]);
      vouch(parts);
      *update = MakeCommit(s->job_, std::move(publication), std::move(parts),
                           std::move(prepared));
    } else {
      job.AdvanceLocked();
    }
    ++job.applied;
    if (s->named_at_once_) ++job.pushes_named_at_once;
    if (options_.apply_log != nullptr) {
      Record(absl::StrCat("apply ", job.id, " ", h.worker_task(), " ", h.step()));
    }
    response.set_outcome(v1::PushResponse::APPLIED);
    response.set_global_step(job.global_step);
    return response;
  }
  // SYNC.
  if (h.step() < job.global_step) {
    ++job.stale;
    response.set_outcome(v1::PushResponse::STALE);
  } else if (job.pushed.count(h.worker_task())) {
    // The same worker again for this step (a new incarnation): counted once.
    ++job.duplicate;
    response.set_outcome(v1::PushResponse::DUPLICATE);
  } else {
    if (h.num_examples() > 0) {
      // Kept by the job until the step completes.
      job.staged[h.worker_task()] = s->TakePart(static_cast<float>(h.num_examples()));
    }
    job.acc_examples += h.num_examples();
    job.pushed.insert(h.worker_task());
    ++job.applied;
    if (s->named_at_once_) ++job.pushes_named_at_once;
    if (options_.apply_log != nullptr) {
      Record(absl::StrCat("apply ", job.id, " ", h.worker_task(), " ", h.step()));
    }
    response.set_outcome(v1::PushResponse::APPLIED);
    if (static_cast<int>(job.pushed.size()) >= job.replicas) {
      // The weighted mean a0 g0 + a1 g1 + ... with a_i = w_i / (w0 + w1 +
      // ...), in worker order, formed by the Commit (see Commit::Run).
      std::vector<GradientPart> parts;
      const float total = static_cast<float>(job.acc_examples);
      for (auto& [worker, staged] : job.staged) {  // ascending worker order
        parts.push_back(std::move(staged));
        parts.back().weight /= total;
      }
      job.staged.clear();
      // Updates ahead come only from a job of one worker: its push is the
      // one part, of weight w0 / w0, exactly 1.
      if (!parts.empty()) {
        std::shared_ptr<Publication> publication =
            job.BeginCommitLocked(prepared, &parts[0]);
        vouch(parts);
        *update = MakeCommit(s->job_, std::move(publication), std::move(parts),
                             std::move(prepared));
      } else {
        job.AdvanceLocked();
      }
      job.acc_examples = 0;
      job.pushed.clear();
    }
  }
  response.set_global_step(job.global_step);
  return response;
}

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
