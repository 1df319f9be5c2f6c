// One push as a parameter server receives it (ParameterServer::BeginPush,
// FinishPush): its slices validated and staged, or read in place from the
// worker's shared memory, and, where it may, the update formed ahead.
//
// Updates ahead: in a job with one worker, a push of the open step (SYNC) or
// any push (ASYNC) is the step's only gradient, so the new values of its
// variables whose rule has no slots (SGD: Optimizer::num_slots) are
// formed while the gradient still arrives, block by block as each block is
// checked, out of place in the push's staging buffer (the values are only
// read, as a pull writing a segment reads them). From the same host, only
// where the server has cores of its own (the thread reading the push may
// run on no CPU the worker's process may: common::SharesCpusWith; taskset,
// a cgroup's cpuset), and then so is the update of the first and of the
// small variables (FormsSlotsAhead, register_request.h) whose rule has slots (Adam, momentum),
// the slots' new values in buffers of the push's own that the commit
// adopts (Optimizer::AdoptSlots) and gives back for the next push: a
// second copy of those slots (FloatsPerElement there). Otherwise the Commit
// updates them after the push: over gRPC, forming a rule with slots on the
// thread that reads the stream delayed the push more than it saved; on
// cores the worker computes on, forming anything ahead competed with its
// backward, whose GEMMs it held up, where after the push it overlaps the
// worker's one-core work (issue 16, 1 worker sync on 2 shared cores,
// ms/step after the push against ahead: the MLP with Adam 2.02 against
// 2.14, the dense stack with SGD 22.8 against 23.8, its server staging no
// new values; on cores apart, ahead gains: the MLP 3.06 against 3.16).
// From the same host, the
// gradient is read where the worker wrote it, in its segment (AddShared),
// and never copied: the buffer receives only the new values, so forming
// them streams the values and the gradient once each (issue 16: copying
// the gradient in, checking the copy and forming over it took about twice
// the passes over memory, on a server that one core bounds). Where the
// worker names where its pulls land (SharedSegment.value_offsets), the new
// values go there too, each piece while in cache, and the next pull into
// that place writes nothing (Pull's `in_place`; the pull's copy was a third
// of such a server's time). The Commit then swaps them in, so the update
// costs the step no pass over memory after the last gradient; if the push
// fails, the staging buffers are simply dropped. Should the values change
// meanwhile (another incarnation's push applied first), the push fails
// with ABORTED, nothing applied. JobStatus.updates_ahead counts the pushes
// updated so (DescribeUpdates logs it).
// Named with the commit: a same-host push on the worker's cores (of any
// job) has nothing formed ahead, and its gradients are only checked as
// they are named, work the commit may as well do; so its answer says
// PushResponse.names_with_commit, and the worker's next pushes to this
// server name every gradient in their one message, with the commit,
// rather than as backward produces them: each message woke a thread on
// either side, on the cores the worker's backward GEMMs ran on (issue 16,
// the MLP, 1 worker sync on 2 shared cores: 1.81 against 1.92 ms a step).
// JobStatus.pushes_named_at_once counts them.
#ifndef TOWERPS_PS_PUSH_SESSION_H_
#define TOWERPS_PS_PUSH_SESSION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ps/gradient_part.h"
#include "ps/optimizer.h"
#include "proto/ps.pb.h"
#include "proto/tensor.pb.h"

namespace towerps::ps {

namespace internal {
class Job;
struct Variable;
}

// One push being received. Owned by the caller between BeginPush and FinishPush;
// thread-compatible (one thread calls it at a time).
//
// A compressed push (header.slice_encoding, common/gradient_codec.h) is
// decoded slice by slice into the same float staging buffer as an
// uncompressed one: each encoded payload is copied into a scratch buffer (at
// most one slice, so at most one message) and decoded from there by
// FinishSlice. Slices of MOVING_AVERAGE variables are float32 in every push.
class PushSession {
 public:
  ~PushSession();
  // Validates `slice` (variable index, offset, length, in-order coverage) and
  // copies it in (decoding it in a compressed push). InvalidArgument names
  // what was wrong.
  absl::Status AddSlice(const v1::TensorSlice& slice);
  // The same checks for a slice of `bytes` bytes of variable `var` from
  // element `offset`, whose payload the caller then copies to the returned
  // address (room for `bytes`), then calls FinishSlice, before the next call.
  absl::StatusOr<char*> Reserve(uint32_t var, uint64_t offset, uint64_t bytes);
  // After Reserve's payload was copied: decodes an encoded slice into the
  // staging buffer (no-op for a float32 one). InvalidArgument naming the
  // variable, the worker and what was wrong with the payload (see
  // common::DecodeSlice).
  absl::Status FinishSlice();
  // Checks the elements received since the last check for NaN and Inf (while
  // they are still in cache); FinishPush checks the rest. InvalidArgument
  // naming the variable and worker. In a push that updates ahead (see
  // "Updates ahead" above), then forms the new values of the whole blocks
  // checked (ABORTED if the job's values changed since BeginPush).
  absl::Status CheckFinite();
  // Same host: whether variable `var` may be read in place from the
  // worker's segment (AddShared) rather than copied in: a float32 push
  // naming a segment.
  bool CanShare(size_t var) const;
  // Variable `var`, whole, at `values` in a worker's segment that `segment`
  // keeps mapped: covered as a slice of it all would be (InvalidArgument if
  // any of it came already) and checked for NaN and Inf, but not copied.
  // Where its update is formed ahead, its new values are formed from it
  // here, into the push's buffer (as CheckFinite would; ABORTED if the
  // values changed since BeginPush), and checked in turn (InvalidArgument
  // if they are not finite: the worker's memory may have changed since
  // its check, or the update overflows); otherwise the update reads it there
  // later (GradientPart). REQUIRES: CanShare(var); `values` holds
  // num_elements(var) floats, aligned.
  //
  // With `new_values_to` (where the worker's pulls of `var` land, at byte
  // `new_values_at` of the segment SetValuesSegment named; aligned, room
  // for the variable), the new values are written there as well, so that
  // the next pull of them into the same place writes nothing (Pull,
  // `in_place`): on one core, the pull's copy was a third of a server's
  // time (issue 16). Formed here, piece by piece as each is checked, while
  // still in cache; not when a pull is writing into a segment of the job
  // meanwhile; and only a commit of this push, with no pull into a segment
  // since it began writing, vouches for what it wrote. Otherwise by the
  // update (Commit::Run) as it forms them, with those of the step's other
  // parts, where the worker's next pull into that place waits already.
  absl::Status AddShared(size_t var, const float* values, std::shared_ptr<const void> segment,
                         float* new_values_to = nullptr, int64_t new_values_at = -1);
  // Names (by its nonce) the worker's segment that AddShared's
  // new_values_to point into.
  void SetValuesSegment(std::string key) { values_segment_ = std::move(key); }
  // The push named every gradient in place in its first message, with the
  // commit (JobStatus.pushes_named_at_once).
  void NamedAtOnce() { named_at_once_ = true; }
  const v1::PushHeader& header() const { return header_; }
  // The job's variables on this server: how many, and each one's elements.
  size_t num_variables() const { return covered_.size(); }
  int64_t num_elements(size_t var) const;

 private:
  friend class ParameterServer;
  PushSession() = default;
  std::shared_ptr<internal::Job> job_;
  v1::PushHeader header_;
  // By variable: the staging buffer (empty until a slice of it comes when
  // the push may share), or, where non-null in shared_, nothing: that
  // variable is read in place (AddShared) from the segment segment_ maps.
  std::vector<std::vector<float>> grads_;
  std::vector<const float*> shared_;
  std::shared_ptr<const void> segment_;
  std::vector<int64_t> covered_;
  std::vector<int64_t> checked_;  // elements CheckFinite has passed, by variable
  // Updates ahead, by variable: whether grads_ receives its new values, and
  // up to which element they are formed; ahead_of_ is the job's
  // steps_applied they are formed from.
  std::vector<char> ahead_;
  std::vector<int64_t> prepared_;
  int64_t ahead_of_ = -1;
  // The overflow guard, by variable: the sum of |g| over what CheckFinite
  // passed (GradientPart::abs_sums); for updates ahead, the sums of |x|
  // over the new values and slots formed and checked, whether every piece
  // was checked so, and the bounds on what was formed (once all of it is).
  std::vector<double> abs_sum_;
  std::vector<MagnitudeBounds> formed_sums_;
  std::vector<char> all_checked_;
  std::vector<MagnitudeBounds> formed_bounds_;
  // Read in place from a worker that shares this server's cores: the push's
  // answer asks for its gradients named with the commit (PushResponse.
  // names_with_commit); and whether this one came so.
  bool names_with_commit_ = false;
  bool named_at_once_ = false;
  // Where the rule has slots (Adam, momentum), their new values, formed
  // with the values, by var_index (Optimizer::ApplyInto's slots_out): the
  // commit adopts them; empty when no variable formed ahead has slots.
  std::vector<std::vector<std::vector<float>>> slots_;
  // Pointers to slots_[v]'s buffers (none where it has no slots).
  std::vector<float*> SlotsOut(size_t v);
  // What the push holds, as an update's part of `weight`; the session keeps
  // nothing of it.
  GradientPart TakePart(float weight);
  // InvalidArgument: variable `v`'s gradient (or statistic) is not finite.
  absl::Status NotFiniteError(size_t v) const;
  // Forms the new values of the checked blocks not formed yet.
  absl::Status PrepareAhead();
  // Whether the k new values formed at `formed` (elements [first, first +
  // k) of variable `v`) and the slots formed with them (at `slots_out`,
  // SlotsOut(v)) are finite; their sums of |x| go to formed_sums_[v].
  bool FormedFinite(size_t v, const float* formed, int64_t first, int64_t k,
                    const std::vector<float*>& slots_out);
  // InvalidArgument: what variable `v`'s update formed is not finite
  // (`or_else`: another cause to name besides an overflow).
  absl::Status NotFiniteFormedError(size_t v, const char* or_else) const;
  // Checks and forms variable `v`'s new values, all of them, from its
  // gradient at `grad` (AddShared), also into `to` (may be null) at byte
  // `at` of values_segment_.
  absl::Status FormAheadFrom(size_t v, const float* grad, float* to, int64_t at);
  // ahead_ where every element is formed (all of them once FinishPush ran
  // CheckFinite); empty when nothing is.
  std::vector<char> PreparedVariables() const;
  // An encoded slice reserved and not yet decoded: its variable (-1: none)
  // and its payload.
  int64_t pending_var_ = -1;
  std::string scratch_;
  // Values written into the worker's segment as they were formed
  // (AddShared): its key, the job's id of this push as their writer (0:
  // none yet), and, by variable, whether all of them went there while
  // this push was the job's writer.
  std::string values_segment_;
  int64_t writer_id_ = 0;
  std::vector<char> written_;
  // For the update (GradientPart::values_to), by variable.
  std::vector<float*> values_to_;
  std::vector<int64_t> values_at_;
};

}  // namespace towerps::ps

#endif  // TOWERPS_PS_PUSH_SESSION_H_
