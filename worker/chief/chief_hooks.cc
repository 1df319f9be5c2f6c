#include "worker/chief/chief_hooks.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"

namespace towerps::worker {

ChiefHooks::ChiefHooks(JobStore& store, Checkpointer& checkpointer,
                       const common::PathRoots* roots)
    : store_(store), checkpointer_(checkpointer), roots_(roots) {}

namespace {

// The event writer for `spec`, its tensorboard_dir checked against `roots`
// again where it is written (it was at submit; a link may have changed).
absl::StatusOr<std::unique_ptr<common::EventWriter>> OpenEvents(const v1::JobSpec& spec,
                                                                const common::PathRoots* roots) {
  std::string dir = spec.tensorboard_dir();
  if (roots != nullptr) {
    TOWERPS_ASSIGN_OR_RETURN(dir, roots->Resolve("tensorboard_dir", dir));
  }
  return common::EventWriter::Create(dir);
}

}  // namespace

void ChiefHooks::BeginJob(const v1::JobSpec& spec) {
  std::shared_ptr<common::EventWriter> tb;
  if (auto w = OpenEvents(spec, roots_); w.ok()) {
    tb = std::move(*w);
  } else {
    store_.AddEvent(spec.job_id(), v1::JobEvent::LOG,
                    absl::StrCat("no TensorBoard events: ", w.status().message()));
  }
  absl::MutexLock lock(&mu_);
  tb_ = std::move(tb);
  job_active_ = true;
}

void ChiefHooks::EndJob() {
  std::shared_ptr<common::EventWriter> tb;
  {
    absl::MutexLock lock(&mu_);
    tb = std::move(tb_);
    tb_.reset();
    job_active_ = false;
  }
  if (tb) tb->Flush().IgnoreError();
}

JobHooks ChiefHooks::For(const v1::StartJobRequest& request) {
  std::shared_ptr<common::EventWriter> tb;
  {
    absl::MutexLock lock(&mu_);
    tb = tb_;
  }
  const v1::JobSpec spec = request.job();
  const std::string id = spec.job_id();
  auto schedule = std::make_shared<Checkpointer::Schedule>();
  JobHooks hooks;
  hooks.log_every_steps = spec.log_every_steps();
  hooks.log = [this, id](const std::string& line) {
    TLOG(INFO) << line;
    store_.AddEvent(id, v1::JobEvent::LOG, line);
  };
  hooks.on_metrics = [this, id, tb](const v1::Metrics& m, bool epoch_end) {
    OnMetrics(id, m, epoch_end, tb.get());
  };
  hooks.after_pull = [this, id, spec, schedule](int64_t step) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_requested_) return StopHere(id, spec, step);
    }
    return checkpointer_.MaybeSave(id, spec, step, *schedule);
  };
  hooks.on_epoch = [tb](int64_t step, const std::vector<v1::VariableDef>& defs,
                        const std::vector<common::Tensor*>& weights) {
    if (tb == nullptr) return;
    for (size_t i = 0; i < defs.size() && i < weights.size(); ++i) {
      tb->AddHistogram(defs[i].name(), step, weights[i]->span()).IgnoreError();
    }
    tb->Flush().IgnoreError();
  };
  return hooks;
}

ChiefHooks::StopResult ChiefHooks::StopAtNextStep(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  stop_requested_ = true;
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopped_ || !job_active_; };
  mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
  return stopped_ ? stop_result_ : StopResult{};
}

absl::Status ChiefHooks::StopHere(const std::string& job_id, const v1::JobSpec& spec,
                                  int64_t step) {
  absl::Status saved = absl::OkStatus();
  if (!spec.checkpoint().disabled() && step > 0) {
    mu_.Unlock();  // No lock across the servers' RPCs.
    saved = checkpointer_.Save(job_id, spec, step);
    mu_.Lock();
  }
  stopped_ = true;
  stop_result_ = {.reached = true, .step = step, .checkpoint = saved};
  return absl::CancelledError(absl::StrCat("the chief is shutting down: stopped at step ", step));
}

void ChiefHooks::OnMetrics(const std::string& id, const v1::Metrics& m, bool epoch_end,
                           common::EventWriter* tb) {
  v1::Metrics merged;
  // Progress: written by the store's writer thread, not on this (the
  // training loop's) thread.
  absl::Status s = store_.UpdateSoon(id, [&](v1::JobRecord& record) {
    v1::Metrics* r = record.mutable_metrics();
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
    merged = *r;
  });
  if (!s.ok()) TLOG(WARNING) << "chief: " << s;
  // The metrics are the message; towerctl formats them.
  store_.AddEvent(id, epoch_end ? v1::JobEvent::EPOCH : v1::JobEvent::PROGRESS, "", &merged);
  if (tb == nullptr) return;
  if (epoch_end) {
    tb->AddScalar("test/loss", m.step(), m.test_loss()).IgnoreError();
    if (m.has_accuracy()) tb->AddScalar("test/accuracy", m.step(), m.test_accuracy()).IgnoreError();
    tb->AddScalar("epoch/learning_rate", m.step(), m.learning_rate()).IgnoreError();
  } else {
    tb->AddScalar("train/loss", m.step(), m.loss()).IgnoreError();
    if (m.has_accuracy()) tb->AddScalar("train/accuracy", m.step(), m.accuracy()).IgnoreError();
    tb->AddScalar("train/learning_rate", m.step(), m.learning_rate()).IgnoreError();
    // The job's (every worker's); the chief's own beside it.
    tb->AddScalar("train/examples_per_s", m.step(), m.job_examples_per_s()).IgnoreError();
    tb->AddScalar("train/chief_examples_per_s", m.step(), m.examples_per_s()).IgnoreError();
  }
  tb->Flush().IgnoreError();
}

}  // namespace towerps::worker
