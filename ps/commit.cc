#include "ps/commit.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/logging.h"
#include "ps/job_state.h"

namespace towerps::ps {

using internal::AllFinite;
using internal::Job;

Commit::~Commit() { Run(); }

void Commit::Run() {
  if (done_) return;
  done_ = true;
  Job& job = *job_;
  std::vector<internal::Variable*> vars;
  {
    absl::MutexLock lock(&job.mu);
    for (internal::Variable& v : job.vars) vars.push_back(&v);
  }
  // Until `committing` is cleared below, only this touches the values and
  // slots (Job::committing), so the lock is not held while they change.
  int64_t skipped = 0;  // variables not updated (not finite)
  for (size_t v = 0; v < vars.size(); ++v) {
    if (!prepared_.empty() && prepared_[v]) {
      // Formed ahead and already swapped in (Job::BeginCommitLocked).
      publication_->Publish(v + 1);
      if (after_publish_) after_publish_(v + 1);
      continue;
    }
    internal::Variable& var = *vars[v];
    double abs_sum = 0.0;
    const absl::Span<const float> mean = FormMean(v, &abs_sum);
    // Where the parts' workers' pulls land: the new values go there too
    // (ParameterServer::DecidePush vouched for them already).
    copies_.clear();
    for (const GradientPart& p : parts_) {
      if (v < p.values_to.size() && p.values_to[v] != nullptr) copies_.push_back(p.values_to[v]);
    }
    if (mean.empty() || !Update(v, var, mean, abs_sum)) {
      for (float* to : copies_) std::memcpy(to, var.value.data(), var.value.size() * sizeof(float));
      if (!var.value.empty()) {  // (a variable of no elements has nothing to update)
        ++skipped;
        if (on_update_skipped_) on_update_skipped_(job.id);
      }
    }
    publication_->Publish(v + 1);
    if (after_publish_) after_publish_(v + 1);
  }
  absl::MutexLock lock(&job.mu);
  for (GradientPart& part : parts_) {
    job.KeepBuffersLocked(std::move(part.owned));
    job.KeepSlotsLocked(std::move(part.slots));
  }
  parts_.clear();  // and the segments they read
  job.updates_skipped += skipped;
  job.committing = false;
  job.publishing.reset();
  job.changed.SignalAll();
}

bool Commit::Update(size_t v, internal::Variable& var, absl::Span<const float> mean,
                    double abs_sum) {
  const int64_t step = var.updates + 1;
  MagnitudeBounds after;
  bool safe = var.optimizer->BoundStep(var.bounds, abs_sum, step, &after) < kSafeMagnitude;
  if (!safe) {
    // The bounds grew past use (they only add up): measured afresh.
    var.bounds = MeasureBounds(var.value, *var.optimizer);
    safe = var.optimizer->BoundStep(var.bounds, abs_sum, step, &after) < kSafeMagnitude;
  }
  if (safe) {
    if (copies_.empty()) {
      var.optimizer->Apply(absl::MakeSpan(var.value), mean, step);
    } else {
      var.optimizer->ApplyAndCopy(absl::MakeSpan(var.value), mean, step, copies_);
    }
    var.updates = step;
    var.bounds = after;
    return true;
  }
  // Near float's limits: applied with the values and slots kept, and
  // undone unless everything it leaves is finite (rare: only values or
  // gradients within a few powers of ten of FLT_MAX come here).
  const std::vector<float> old_value = var.value;
  std::vector<std::vector<float>> old_slots;
  for (const auto& [name, slot] : var.optimizer->Slots()) {
    old_slots.emplace_back(slot.begin(), slot.end());
  }
  var.optimizer->Apply(absl::MakeSpan(var.value), mean, step);
  bool finite = AllFinite(var.value.data(), static_cast<int64_t>(var.value.size()));
  const auto slots = var.optimizer->Slots();
  for (const auto& [name, slot] : slots) {
    finite = finite && AllFinite(slot.data(), static_cast<int64_t>(slot.size()));
  }
  if (finite) {
    var.updates = step;
    for (float* to : copies_) std::memcpy(to, var.value.data(), var.value.size() * sizeof(float));
  } else {
    std::copy(old_value.begin(), old_value.end(), var.value.begin());
    for (size_t i = 0; i < slots.size(); ++i) {
      std::copy(old_slots[i].begin(), old_slots[i].end(), slots[i].second.begin());
    }
    TLOG(ERROR) << "job \"" << job_->id << "\": the update of variable " << v
                << " would leave values or optimizer slots that are not finite (the update "
                   "overflows a float): not applied this step";
  }
  var.bounds = MeasureBounds(var.value, *var.optimizer);
  return finite;
}

absl::Span<const float> Commit::FormMean(size_t v, double* abs_sum) {
  Job& job = *job_;
  const int64_t n = job.sizes[v];
  // The weighted mean, in the first part's buffer where it has one (else
  // in the job's scratch), with one pass per further part and none for a
  // lone one (a0 = w0 / w0 is exactly 1): saxpby makes a1 g1 + a0 g0,
  // saxpy adds the rest, in worker order (summing as pushes arrive would
  // make the result depend on their order: saxpy's FMA rounds fma(w1, g1,
  // w0 g0) and fma(w0, g0, w1 g1) differently, and the same job must give
  // the same weights). Block by block, so that each block is formed (and
  // checked) while in cache: the BLAS calls work element by element, and
  // blocks of kApplyBlock cut no kernel's stride, so that the rounding is
  // that of whole-variable calls.
  const GradientPart& first = parts_[0];
  bool any_shared = false;
  for (const GradientPart& p : parts_) any_shared = any_shared || p.is_shared(v);
  float* mean;
  if (first.is_shared(v)) {
    if (static_cast<int64_t>(job.mean_scratch.size()) < n) job.mean_scratch.resize(n);
    mean = job.mean_scratch.data();
  } else {
    mean = parts_[0].owned[v].data();
  }
  // A part read in place was checked when it came, but the worker's memory
  // could have changed since (a worker breaking the protocol) and a sum can
  // overflow: what is formed is checked before it is applied.
  const bool check = any_shared || parts_.size() > 1;
  bool finite = true;
  // The sum of |mean|, for the overflow guard (a bound on each |element|):
  // formed with the check, or, for a lone gradient that came as slices,
  // summed as they were checked (else its largest |element|).
  *abs_sum = 0.0;
  constexpr int64_t kBlock = Optimizer::kApplyBlock;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int m = static_cast<int>(std::min(kBlock, n - b));
    float* y = mean + b;
    if (first.is_shared(v)) std::memcpy(y, first.data(v) + b, m * sizeof(float));
    float pending = first.weight;  // the factor y still needs (a0)
    for (size_t k = 1; k < parts_.size(); ++k) {
      const float a = parts_[k].weight;
      const float* g = parts_[k].data(v) + b;
      if (pending != 1.0f) {
        cblas_saxpby(m, a, g, 1, pending, y, 1);
      } else {
        cblas_saxpy(m, a, g, 1, y, 1);
      }
      pending = 1.0f;
    }
    if (pending != 1.0f) cblas_sscal(m, pending, y, 1);
    if (check) finite = finite && AllFinite(y, m, abs_sum);
  }
  if (!check) {
    *abs_sum = v < first.abs_sums.size() ? first.abs_sums[v] : MaxAbs(mean, n);
  }
  if (!finite) {
    TLOG(ERROR) << "job \"" << job.id << "\": the mean of variable " << v
                << "'s gradients is not finite (a sum overflowed, or a worker changed "
                   "its shared gradient after the push was checked): not applied this step";
    return {};
  }
  return absl::MakeConstSpan(mean, static_cast<size_t>(n));
}

}  // namespace towerps::ps
