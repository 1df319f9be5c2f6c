#include "ps/push_session.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/gradient_codec.h"
#include "common/status.h"
#include "ps/job_state.h"

namespace towerps::ps {

using internal::AllFinite;
using internal::Job;
using internal::LowerBounds;
using internal::ValuesChangedError;

namespace {

// For forming a push's values ahead without the job's lock: once the last
// update ended, keeps the job's values (and its variables) in place until
// ReleaseValues; ABORTED if they changed since the push began (from
// `ahead_of`), nothing held then.
absl::Status HoldValuesLocked(Job& job, int64_t ahead_of, const v1::PushHeader& h)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  // The last step's update may still run (Commit): its values are needed.
  job.AwaitCommitLocked(nullptr);
  if (job.deleted || job.steps_applied != ahead_of) {
    return ValuesChangedError(job, h, job.deleted);
  }
  ++job.preparing;
  return absl::OkStatus();
}

// `writing`: the holder was writing new values into a worker's segment
// (Job::writing_through).
void ReleaseValues(Job& job, bool writing = false) ABSL_LOCKS_EXCLUDED(job.mu) {
  absl::MutexLock lock(&job.mu);
  --job.preparing;
  if (writing) --job.writing_through;
  job.changed.SignalAll();
}

}  // namespace

PushSession::~PushSession() {
  if (job_ && !grads_.empty()) {
    absl::MutexLock lock(&job_->mu);
    job_->KeepBuffersLocked(std::move(grads_));
  }
  if (job_ && !slots_.empty()) {
    absl::MutexLock lock(&job_->mu);
    job_->KeepSlotsLocked(std::move(slots_));
  }
}

absl::Status PushSession::NotFiniteError(size_t v) const {
  // A MOVING_AVERAGE variable's push is a batch statistic: a NaN would stay
  // in the average forever, so it is refused like a gradient.
  const bool statistic = job_->update_kinds[v] == v1::VariableDef::MOVING_AVERAGE;
  return absl::InvalidArgumentError(absl::StrCat(
      "push: ", statistic ? "batch statistic" : "gradient", " of variable ", v,
      " from worker ", header_.worker_task(), " contains NaN or Inf; nothing applied"));
}

GradientPart PushSession::TakePart(float weight) {
  GradientPart part;
  part.weight = weight;
  part.owned = std::move(grads_);
  part.shared = std::move(shared_);
  part.segment = std::move(segment_);
  part.values_to = std::move(values_to_);
  part.values_at = std::move(values_at_);
  part.slots = std::move(slots_);
  part.abs_sums = std::move(abs_sum_);
  part.formed_bounds = std::move(formed_bounds_);
  if (!part.values_to.empty()) part.values_key = values_segment_;
  grads_.clear();
  shared_.clear();
  slots_.clear();
  return part;
}

int64_t PushSession::num_elements(size_t var) const { return job_->sizes[var]; }

bool PushSession::CanShare(size_t var) const { return var < shared_.size(); }

std::vector<float*> PushSession::SlotsOut(size_t v) {
  std::vector<float*> out;
  if (v < slots_.size()) {
    for (std::vector<float>& slot : slots_[v]) out.push_back(slot.data());
  }
  return out;
}

absl::Status PushSession::FormAheadFrom(size_t v, const float* grad, float* to, int64_t at) {
  Job& job = *job_;
  const internal::Variable* var = nullptr;
  {
    absl::MutexLock lock(&job.mu);
    TOWERPS_RETURN_IF_ERROR(HoldValuesLocked(job, ahead_of_, header_));
    var = &job.vars[v];
    // Into the worker's segment too, unless a pull writes into one (then
    // both would write there at once).
    if (to != nullptr && job.segment_writers == 0) {
      if (writer_id_ == 0 || job.writer != writer_id_) {
        // This push's earlier writes, if any, are no longer vouched for.
        writer_id_ = ++job.writers;
        job.writer = writer_id_;
        written_.assign(job.sizes.size(), 0);
      }
      Job::Written& rec = job.written[values_segment_];
      if (rec.at.empty()) {
        rec.at.assign(job.sizes.size(), -1);
        rec.version.assign(job.sizes.size(), -1);
      }
      rec.at[v] = at;
      rec.version[v] = -1;  // until this push commits
      ++job.writing_through;
    } else {
      to = nullptr;
    }
  }
  // Each piece is checked, then read again from cache to form its values:
  // the gradient streams from the worker's memory once. What is formed
  // (values and slots) is checked too, in cache: the worker's memory may
  // change between the gradient's check and its read (a worker that broke
  // its word, which must not put a NaN into the values, nor a gradient
  // larger than the one checked), so no bound is taken from the gradient's
  // check; an update that overflows is refused alike.
  constexpr int64_t kPiece = 4 * Optimizer::kApplyBlock;
  const int64_t n = job.sizes[v];
  const std::vector<float*> slots_out = SlotsOut(v);
  absl::Status status = absl::OkStatus();
  for (int64_t first = 0; first < n; first += kPiece) {
    const int64_t k = std::min(kPiece, n - first);
    if (!AllFinite(grad + first, k)) {
      status = NotFiniteError(v);
      break;
    }
    float* formed = grads_[v].data() + first;
    var->optimizer->ApplyInto(first, absl::MakeConstSpan(var->value).subspan(first, k),
                              absl::MakeConstSpan(grad + first, k), absl::MakeSpan(formed, k),
                              var->updates + 1, slots_out);
    if (!FormedFinite(v, formed, first, k, slots_out)) {
      status = NotFiniteFormedError(v, ", or the gradient changed while the server read it");
      break;
    }
    if (to != nullptr) std::memcpy(to + first, formed, static_cast<size_t>(k) * sizeof(float));
  }
  ReleaseValues(job, /*writing=*/to != nullptr);
  if (status.ok()) formed_bounds_[v] = formed_sums_[v];
  if (status.ok()) covered_[v] = checked_[v] = prepared_[v] = n;
  if (status.ok() && to != nullptr) written_[v] = 1;
  return status;
}

absl::Status PushSession::AddShared(size_t v, const float* values,
                                    std::shared_ptr<const void> segment, float* new_values_to,
                                    int64_t new_values_at) {
  if (!CanShare(v) || pending_var_ >= 0) {  // our caller's bug, not the sender's
    return absl::InternalError(absl::StrCat("push: variable ", v, " cannot be shared"));
  }
  if (covered_[v] != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push: variable ", v, " named again (", covered_[v], " of its ", job_->sizes[v],
        " elements came already; each comes once)"));
  }
  // Formed ahead: read here, during the push, into the push's buffer.
  if (!ahead_.empty() && ahead_[v]) {
    return FormAheadFrom(v, values, values_segment_.empty() ? nullptr : new_values_to,
                         new_values_at);
  }
  if (!AllFinite(values, job_->sizes[v])) return NotFiniteError(v);
  shared_[v] = values;
  segment_ = std::move(segment);
  if (new_values_to != nullptr && !values_segment_.empty()) {
    values_to_.resize(job_->sizes.size(), nullptr);
    values_at_.resize(job_->sizes.size(), -1);
    values_to_[v] = new_values_to;
    values_at_[v] = new_values_at;
  }
  covered_[v] = checked_[v] = job_->sizes[v];
  return absl::OkStatus();
}

absl::Status PushSession::AddSlice(const v1::TensorSlice& slice) {
  TOWERPS_ASSIGN_OR_RETURN(char* dst,
                           Reserve(slice.var_index(), slice.offset(), slice.data().size()));
  if (!slice.data().empty()) std::memcpy(dst, slice.data().data(), slice.data().size());
  return FinishSlice();
}

absl::Status PushSession::FinishSlice() {
  if (pending_var_ < 0) return absl::OkStatus();
  const size_t v = static_cast<size_t>(pending_var_);
  pending_var_ = -1;
  float* first = grads_[v].data() + covered_[v];
  auto n = common::DecodeSlice(header_.slice_encoding(), scratch_,
                               absl::MakeSpan(first, job_->sizes[v] - covered_[v]));
  if (!n.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push: slice of variable ", v, " from worker ", header_.worker_task(), " at element ",
        covered_[v], ": ", n.status().message(), "; nothing applied"));
  }
  covered_[v] += *n;
  return absl::OkStatus();
}

absl::Status PushSession::CheckFinite() {
  for (size_t v = 0; v < covered_.size(); ++v) {
    // Only what came as slices since the last check: a variable read in
    // place (or formed ahead) was checked as it came, and has no buffer.
    if (covered_[v] == checked_[v]) continue;
    if (!AllFinite(grads_[v].data() + checked_[v], covered_[v] - checked_[v], &abs_sum_[v])) {
      return NotFiniteError(v);
    }
    checked_[v] = covered_[v];
  }
  return ahead_of_ >= 0 ? PrepareAhead() : absl::OkStatus();
}

absl::Status PushSession::PrepareAhead() {
  constexpr int64_t kBlock = Optimizer::kApplyBlock;
  // The range of each variable to form: whole blocks checked, or up to its
  // end once all of it is.
  std::vector<std::pair<int64_t, int64_t>> todo(ahead_.size(), {0, 0});
  bool any = false;
  for (size_t v = 0; v < ahead_.size(); ++v) {
    if (!ahead_[v]) continue;
    const int64_t end =
        checked_[v] == job_->sizes[v] ? checked_[v] : checked_[v] / kBlock * kBlock;
    if (end > prepared_[v]) {
      todo[v] = {prepared_[v], end};
      any = true;
    }
  }
  if (!any) return absl::OkStatus();
  Job& job = *job_;
  std::vector<const internal::Variable*> vars(ahead_.size(), nullptr);
  {
    absl::MutexLock lock(&job.mu);
    TOWERPS_RETURN_IF_ERROR(HoldValuesLocked(job, ahead_of_, header_));
    for (size_t v = 0; v < ahead_.size(); ++v) {
      if (todo[v].second > todo[v].first) vars[v] = &job.vars[v];
    }
  }
  // The overflow guard: abs_sum_ covers every element checked so far, so
  // where the rule's bound from it is safe, nothing formed can overflow;
  // else each piece formed is checked, in cache, and the push refused if
  // anything came out not finite.
  constexpr int64_t kPiece = 4 * kBlock;
  absl::Status status = absl::OkStatus();
  for (size_t v = 0; v < vars.size() && status.ok(); ++v) {
    if (vars[v] == nullptr) continue;
    const internal::Variable& var = *vars[v];
    const int64_t step = var.updates + 1;
    MagnitudeBounds after;
    const bool safe = var.optimizer->BoundStep(var.bounds, abs_sum_[v], step, &after) <
                      kSafeMagnitude;
    all_checked_[v] = all_checked_[v] && !safe;
    const std::vector<float*> slots_out = SlotsOut(v);
    const auto [from, end] = todo[v];
    for (int64_t first = from; first < end; first += safe ? end - from : kPiece) {
      const int64_t k = safe ? end - first : std::min(kPiece, end - first);
      const absl::Span<float> grad = absl::MakeSpan(grads_[v]).subspan(first, k);
      var.optimizer->ApplyInto(first, absl::MakeConstSpan(var.value).subspan(first, k), grad,
                               grad, step, slots_out);
      if (!safe && !FormedFinite(v, grad.data(), first, k, slots_out)) {
        status = NotFiniteFormedError(v, "");
        break;
      }
    }
    if (!status.ok()) break;
    prepared_[v] = end;
    if (end == job.sizes[v]) {
      // All of it formed: bounds from the whole gradient's sum, or, where
      // every piece was checked, the sums of what was formed, if lower.
      formed_bounds_[v] = after;
      if (all_checked_[v]) formed_bounds_[v] = LowerBounds(after, formed_sums_[v]);
    }
  }
  ReleaseValues(job);
  return status;
}

bool PushSession::FormedFinite(size_t v, const float* formed, int64_t first, int64_t k,
                               const std::vector<float*>& slots_out) {
  MagnitudeBounds& sums = formed_sums_[v];
  bool finite = AllFinite(formed, k, &sums.value);
  for (size_t i = 0; i < slots_out.size() && i < 2; ++i) {
    finite = finite && AllFinite(slots_out[i] + first, k, &sums.slots[i]);
  }
  return finite;
}

absl::Status PushSession::NotFiniteFormedError(size_t v, const char* or_else) const {
  return absl::InvalidArgumentError(absl::StrCat(
      "push: the new values of variable ", v, " formed from the gradient of worker ",
      header_.worker_task(), " are not finite (or its optimizer slots are not: the update ",
      "overflows", or_else, "); nothing applied"));
}



std::vector<char> PushSession::PreparedVariables() const {
  std::vector<char> out(ahead_.size(), 0);
  bool any = false;
  for (size_t v = 0; v < ahead_.size(); ++v) {
    out[v] = ahead_[v] && prepared_[v] == job_->sizes[v];
    any = any || out[v];
  }
  if (!any) out.clear();
  return out;
}

absl::StatusOr<char*> PushSession::Reserve(uint32_t v, uint64_t offset, uint64_t bytes) {
  if (pending_var_ >= 0) {  // our caller's bug, not the sender's
    return absl::InternalError("push: Reserve before the last slice was finished");
  }
  if (v >= grads_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push: var_index ", v, " is out of range (job \"",
        job_->id, "\" has ", grads_.size(), " variables on this server)"));
  }
  if (header_.slice_encoding() != v1::SLICE_FLOAT32 &&
      job_->update_kinds[v] != v1::VariableDef::MOVING_AVERAGE) {
    // Encoded: the payload goes to the scratch buffer (bounded by the
    // message, which the reader has checked holds it) and FinishSlice
    // decodes it from there, checking its length against what is left.
    if (offset != static_cast<uint64_t>(covered_[v])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push: slice of variable ", v, " starts at element ", offset,
          ", expected ", covered_[v], " (slices must arrive in order, once)"));
    }
    scratch_.resize(bytes);
    pending_var_ = v;
    return scratch_.data();
  }
  if (bytes % sizeof(float) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push: slice of variable ", v, " has ", bytes, " bytes, not a multiple of 4"));
  }
  if (offset != static_cast<uint64_t>(covered_[v])) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push: slice of variable ", v, " starts at element ", offset,
        ", expected ", covered_[v], " (slices must arrive in order, once)"));
  }
  const uint64_t n = bytes / sizeof(float);
  if (n > static_cast<uint64_t>(job_->sizes[v] - covered_[v])) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push: slice of variable ", v, " runs past its end (", covered_[v], " + ", n,
        " > ", job_->sizes[v], " elements)"));
  }
  // A push that may share took no buffers: this variable comes as slices.
  if (grads_[v].empty()) grads_[v].resize(static_cast<size_t>(job_->sizes[v]));
  char* dst = reinterpret_cast<char*>(grads_[v].data() + covered_[v]);
  covered_[v] += static_cast<int64_t>(n);
  return dst;
}

}  // namespace towerps::ps
