// ParameterServer's push: a push's session begun (BeginPush: checked
// against the job, its buffers taken from the last commit's where it can)
// and decided (DecidePush: duplicate, stale, staged for the step or applied
// now, through a Commit). The class is in parameter_server.h; its other
// calls are in parameter_server.cc, Pull in parameter_server_pull.cc.

#include "ps/parameter_server.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/process_cpu.h"
#include "common/status.h"
#include "ps/job_state.h"

namespace towerps::ps {

using internal::Job;
using internal::ValuesChangedError;
using internal::ZeroBounds;

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
  // The update of `parts` begun, a Commit for the caller to run; with no
  // gradient among them (pushes of no examples), the step advanced at once.
  auto commit = [&](std::vector<GradientPart> parts) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
    if (parts.empty()) {
      job.AdvanceLocked();
      return;
    }
    std::shared_ptr<Publication> publication = job.BeginCommitLocked(prepared, &parts[0]);
    vouch(parts);
    *update = MakeCommit(s->job_, std::move(publication), std::move(parts), std::move(prepared));
  };
  rec.seen = true;
  rec.incarnation = h.incarnation();
  rec.last_sequence = h.sequence();
  if (job.config.mode() == v1::ASYNC) {
    rec.completed = std::max<int64_t>(rec.completed, h.sequence());
    std::vector<GradientPart> parts;
    if (h.num_examples() > 0) parts.push_back(s->TakePart(1.0f));
    commit(std::move(parts));
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
      commit(std::move(parts));
      job.acc_examples = 0;
      job.pushed.clear();
    }
  }
  response.set_global_step(job.global_step);
  return response;
}

}  // namespace towerps::ps
