// The parameter server's logic: one shard of every job's variables, their
// optimizer slots and the global step of that shard. No gRPC here; see
// ps_service.h for the adapter.
//
// Update rules: an OPTIMIZER variable (VariableDef.update) is trained by the
// job's optimizer. A MOVING_AVERAGE variable (batch norm's moving mean and
// variance) receives a batch statistic in the gradient's place; it is
// averaged over workers exactly like a gradient (below), then applied as
// value = decay * value + (1 - decay) * mean, with no learning rate, weight
// decay or slots. Both kinds are pulled and checkpointed alike.
//
// Thread-safe. Each job has its own mutex; no lock is held while the caller
// reads from or writes to the network.
//
// Push protocol (so that a broken or malformed stream never touches state):
//   BeginPush(header) -> session; session.AddSlice(...) for every slice
//   (validated and copied into a staging buffer; on the same host, a
//   variable in the worker's segment is validated and read in place by the
//   update instead, AddShared); FinishPush(session) checks
//   that every variable was covered exactly once and commits atomically:
//   the update it decides (Commit) may run after the push is answered, but
//   every reader sees whole steps (a pull waits for each variable of its
//   step; saves, deletions and other pushes wait for the update).
// Updates ahead: in a job with one worker, a push of the open step (SYNC) or
// any push (ASYNC) is the step's only gradient, so the new values of its
// variables whose rule has no slots (SGD: Optimizer::num_slots) are
// formed while the gradient still arrives, block by block as each block is
// checked, out of place in the push's staging buffer (the values are only
// read, as a pull writing a segment reads them). From the same host, only
// where the server has cores of its own (the thread reading the push may
// run on no CPU the worker's process may: common::SharesCpusWith; taskset,
// a cgroup's cpuset), and then so is the update of the first and of the
// small variables (FormsSlotsAhead) whose rule has slots (Adam, momentum),
// the slots' new values in buffers of the push's own that the commit
// adopts (Optimizer::AdoptSlots) and gives back for the next push: a
// second copy of those slots (FloatsPerElement). Otherwise the Commit
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
// A push is identified by (worker_task, incarnation, sequence): a retry with a
// sequence already taken is acknowledged as DUPLICATE and never applied twice.
//
// SYNC: gradients for step t are summed weighted by num_examples; when
// `replicas_to_aggregate` distinct workers have pushed, the weighted mean is
// applied once and the step advances. Pushes for a step already applied are
// STALE: dropped and counted.
// ASYNC: each push is applied on arrival. With max_staleness s > 0, a pull
// for iteration i waits until every worker has completed i - s iterations.
//
// Liveness: the server notes when it last heard from each worker of a job
// (register with worker_task, push, pull, heartbeat); a worker never heard
// from counts from the job's registration here. A pull waiting on workers
// silent longer than the job's peer_timeout_s (so that the wait cannot end:
// in SYNC, too few others left to reach replicas_to_aggregate) fails with
// ABORTED naming them and why, and the server logs one line saying the same.
// The server itself keeps serving.
#ifndef TOWERPS_PS_PARAMETER_SERVER_H_
#define TOWERPS_PS_PARAMETER_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/paths.h"
#include "common/serial_executor.h"
#include "ps/apply_log.h"
#include "ps/optimizer.h"
#include "ps/publication.h"
#include "proto/ps.pb.h"
#include "proto/tensor.pb.h"

namespace towerps::ps {

// TrainingConfig.peer_timeout_s when a job leaves it 0.
constexpr double kDefaultPeerTimeoutS = 60;

// The most workers a job may have (TrainingConfig.num_workers); Register
// refuses more with InvalidArgument.
constexpr int kMaxWorkers = 10000;

struct ParameterServerOptions {
  int task_index = 0;
  // Longest a Pull waits server-side before answering DEADLINE_EXCEEDED (the
  // caller retries). Default: 30 s.
  absl::Duration max_pull_wait = absl::Seconds(30);
  // A waiting pull logs which workers the step waits for this often.
  absl::Duration wait_log_interval = absl::Seconds(5);
  // Largest job a Register may create on this server, everything it will
  // hold counted (RegisterFootprintBytes). Default: 8 GiB.
  int64_t max_job_bytes = int64_t{8} << 30;
  // Most bytes all jobs together may hold on this server, counted as
  // RegisterFootprintBytes: a Register that would pass it is refused with
  // ResourceExhausted naming the largest variable, the bytes already held and
  // the limit; DeleteJob returns a job's bytes. Default here: no total (the
  // binary sets --memory_budget_bytes, by default half the physical memory).
  int64_t memory_budget_bytes = INT64_MAX;
  // Where Save's checkpoint_dir and Register's restore_from may point (the
  // ps's --state_dir): anything else is refused with InvalidArgument naming
  // the field. Unset: anywhere (in-process tests only; the ps binary always
  // sets it).
  std::optional<common::PathRoots> checkpoint_roots;
  // Not owned; null (the default): no record. When set, every registration,
  // accepted push, written shard and deletion appends a line (apply_log.h).
  ApplyLog* apply_log = nullptr;
  // Called (from the updater thread, without any lock) for each variable
  // update of a job that is not applied (JobStatus.updates_skipped), with
  // the job's id; null: none.
  std::function<void(const std::string&)> on_update_skipped;
  // Tests only: called by Save between taking its view of the job and
  // writing it (without the job's lock), to interleave an update.
  std::function<void()> after_save_view;
  // Tests only: called by Register before it builds a new job, without any
  // lock, to hold it there.
  std::function<void()> before_create_job;
  // Tests only: called by a Commit after it published each variable (with
  // the count published), without any lock, to hold an update part way.
  std::function<void(size_t)> after_publish;
  // Tests only: called under the job's lock when a push, save or deletion
  // starts waiting for a Commit to finish (it must not take that lock).
  std::function<void()> on_commit_wait;
  // Tests only: a same-host push is taken as from a worker on cores apart
  // ("Updates ahead": formed ahead where it may be; its gradients wanted as
  // they are named) even where the worker may run on the CPUs of the thread
  // reading it (in a test, the same process).
  bool as_if_on_cores_apart = false;
};

// The values of a job's variables at one global step, for a pull to stream
// without the job's lock; immutable while anyone holds it. No copy is made
// for it: `values` view the variables themselves, and before the server
// changes them while a pull still holds the snapshot, the snapshot takes the
// old buffers and the variables continue on copies (copy on write).
//
// A snapshot taken while its step's update is still under way (Commit
// below) views variables that are not all final yet: each becomes final in
// var_index order, and a reader waits for it (Ready, AwaitReady) before
// reading it.
struct WeightsSnapshot {
  int64_t global_step = 0;
  std::vector<absl::Span<const float>> values;  // by var_index
  // Set once detached: the buffers `values` view (shared with other views of
  // the same step, e.g. a checkpoint being written).
  std::vector<std::shared_ptr<const std::vector<float>>> owned;
  // Null: every variable is final.
  std::shared_ptr<const Publication> publication;

  // Whether variable `v`'s values are final.
  bool Ready(size_t v) const { return publication == nullptr || publication->Ready(v); }
  // Blocks until they are (a commit never stops part way: it is CPU work).
  void AwaitReady(size_t v) const {
    if (publication != nullptr) publication->Await(v);
  }
};

namespace internal {
class Job;
struct Variable;
}

// One worker's gradient (or batch statistic) for an update, variable by
// variable: in the server's own buffer (`owned[v]`: copied in from slices;
// where the update is formed ahead, the new values), or read in place
// from the worker's shared segment (`shared[v]` non-null), which `segment`
// keeps mapped. A worker leaves its pushed gradients unchanged until its
// next forward has pulled every variable of the update (ps_client.h), so
// the update reads them there, after the push was answered, and a server
// holds no copy of a same-host push (issue 16: with several workers a copy
// each was most of a server's memory).
struct GradientPart {
  float weight = 1.0f;  // examples over the step's total (1 in ASYNC)
  std::vector<std::vector<float>> owned;  // by var_index (empty where shared)
  std::vector<const float*> shared;       // by var_index, or empty
  std::shared_ptr<const void> segment;
  // Same host: where the worker's pulls of each variable land in that
  // segment (null, -1: not named), which `values_key` names, for the
  // update to write the new values there as well (Commit::Run).
  std::vector<float*> values_to;  // by var_index, or empty
  std::vector<int64_t> values_at;
  std::string values_key;
  // Where the update was formed ahead, the optimizer slots' new values, by
  // var_index (Optimizer::AdoptSlots order; empty where none).
  std::vector<std::vector<std::vector<float>>> slots;
  // By var_index, for the overflow guard (Commit::Run): the sum of |g| of
  // each owned gradient, as checked when it came (none: unknown);
  // and where the update was formed ahead, bounds on what it formed.
  std::vector<double> abs_sums;
  std::vector<MagnitudeBounds> formed_bounds;

  bool is_shared(size_t v) const { return v < shared.size() && shared[v] != nullptr; }
  const float* data(size_t v) const { return is_shared(v) ? shared[v] : owned[v].data(); }
};

// The update a push completes, handed to the caller of
// ParameterServer::FinishPush so that it can answer the push first: the
// step has already advanced (the push is answered APPLIED, pulls of the new
// step are served), and Run updates the variables one by one in var_index
// order (the order forward needs them), publishing each as soon as it is
// final, so that a worker's next forward starts on its first layers while
// the server still updates the last. Until Run returns, the job's other
// writers wait for it: pushes, saves and its deletion. Thread-compatible:
// run it once, at once (ParameterServer::RunLater does, on its updater
// thread); the destructor runs it if nobody did.
class Commit {
 public:
  ~Commit();
  Commit(const Commit&) = delete;
  Commit& operator=(const Commit&) = delete;

  void Run();

 private:
  friend class ParameterServer;
  Commit() = default;
  // Variable `v`'s weighted mean of parts_, formed, and the sum of its
  // |elements| in *abs_sum; empty when it is not finite (logged; the
  // variable keeps its values this step).
  absl::Span<const float> FormMean(size_t v, double* abs_sum);
  // Applies `mean` (of `abs_sum`) to variable `v` and writes its new
  // values to copies_: in place where its bounds show that nothing can
  // overflow (the rule: measured afresh where the bounds grew too large);
  // else on the values and slots with a copy of them kept, which they go
  // back to (logged) if anything came out not finite. Returns whether the
  // update was applied.
  bool Update(size_t v, internal::Variable& var, absl::Span<const float> mean, double abs_sum);
  std::shared_ptr<internal::Job> job_;
  std::shared_ptr<Publication> publication_;
  // The gradients to average, by ascending worker, with their weights
  // (examples over the step's total): the mean is formed variable by
  // variable, just before that variable is updated, in the first one's
  // buffer where it has one, else in the job's scratch buffer (one
  // variable's size).
  std::vector<GradientPart> parts_;
  // By var_index: 1 where the new values were formed ahead in parts_[0]
  // (then parts_ has that one part, of weight 1) and already swapped in by
  // Job::BeginCommitLocked, so that parts_[0] holds the old ones: Run only
  // publishes them.
  std::vector<char> prepared_;
  std::vector<float*> copies_;  // Run's: where one variable's new values go as well
  std::function<void(size_t)> after_publish_;
  std::function<void(const std::string&)> on_update_skipped_;
  bool done_ = false;
};

// Floats a job holds on a server per element of variable `def`, given the
// job's normalized `config`: the value, the pull snapshot (a copy of the
// values, made only while a pull sending them over gRPC or a checkpoint
// holds them as they change; pulls into shared memory make a push wait
// instead), the optimizer's
// slots (ADAM 2, MOMENTUM 1, SGD none; a MOVING_AVERAGE variable none),
// twice in a job of one worker where FormsSlotsAhead(index, its elements)
// (its same-host pushes may form those slots' new values ahead, apart:
// "Updates ahead" above; `index`: the variable's in the job, -1 for
// none), and one push staging buffer per
// worker (SYNC stages each worker's gradient until its step is complete and
// sums them into the first one; ASYNC has at most one push per worker in
// flight). An upper bound: a same-host push
// read in place (GradientPart) stages nothing, and its update needs at most
// one variable's scratch.
int64_t FloatsPerElement(const v1::VariableDef& def, const v1::TrainingConfig& config,
                         int index = -1);

// Whether a job of one worker's same-host pushes form the new values of
// the optimizer slots of its variable `index`, of `elements`, ahead
// ("Updates ahead"; where the server has cores of its own), at the cost of
// a second set of them (counted whether or not it does). After the push,
// the Commit updates the variables in order, each published once final,
// so the next forward waits for the first one's update (the first layer's
// kernel, or this server's part of it) and the rest overlaps that
// forward: the first variable's is formed ahead, overlapping the worker's
// backward instead (a worker announces a larger first layer early:
// Model::StepEvents), and so is that of every small one (at most
// kSlotsAheadMaxElements), whose update costs the next pull less formed
// ahead than handed to the Commit's thread. The large ones' would double
// their slots for nothing measurable (a dense stack with Adam: +120 MB a
// server, ms/step within noise; issue 16).
inline constexpr int64_t kSlotsAheadMaxElements = 64 * 1024;
bool FormsSlotsAhead(int index, int64_t elements);

// Bytes the job of `request` will hold on this server (FloatsPerElement times
// 4 bytes times the elements, summed over its variables), saturating at
// INT64_MAX. REQUIRES: shapes positive; `config` normalized.
int64_t RegisterFootprintBytes(const v1::RegisterRequest& request,
                               const v1::TrainingConfig& config);

// One push being received. Owned by the caller between BeginPush and FinishPush.
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

class ParameterServer {
 public:
  explicit ParameterServer(ParameterServerOptions options);
  ~ParameterServer();
  ParameterServer(const ParameterServer&) = delete;
  ParameterServer& operator=(const ParameterServer&) = delete;

  // Creates the job's variables (initialized from their Initializer) or, if it
  // exists, checks that the request matches it (FailedPrecondition if not).
  // InvalidArgument for a malformed request (naming the variable and field
  // for a bad dtype, shape, update or moving_average_decay; nothing is
  // created then); ResourceExhausted if too large. On restore_from,
  // FailedPrecondition if the shard's variables (names, shapes, update rule,
  // optimizer slots) do not match; InvalidArgument naming restore_from when it
  // is outside options.checkpoint_roots. Every worker registers the job:
  // one creates it, and the others wait for it and are checked against it
  // (a job is never built twice, which held twice its bytes for a moment).
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request);
  // Registers waiting for another one to create their job.
  int registers_waiting();

  // NotFound for an unknown job; InvalidArgument for a bad header (an
  // unknown slice_encoding included).
  absl::StatusOr<std::unique_ptr<PushSession>> BeginPush(const v1::PushHeader& header);
  // Commits a complete push. InvalidArgument if a variable is incomplete or
  // the gradient is not finite (nothing is applied then);
  // FailedPrecondition for a SYNC push ahead of the server's step.
  // With `commit`, a push that changes the values (an ASYNC push, the push
  // that completes a SYNC step) leaves *commit set to the update, which the
  // caller hands to RunLater before it answers; otherwise *commit is null. Without it, the
  // update is done before FinishPush returns.
  absl::StatusOr<v1::PushResponse> FinishPush(std::unique_ptr<PushSession> session,
                                              std::unique_ptr<Commit>* commit = nullptr);

  // Runs `commit` (from FinishPush) on one of the server's updater threads,
  // so that the caller answers the push and ends its call at once. The push's
  // own service time `served` plus the update's counts as one request of the
  // job (RecordRequest). The server's destructor waits for what it started.
  void RunLater(std::unique_ptr<Commit> commit, absl::Duration served);

  // Blocks until the job's step reaches request.min_step (and, in ASYNC with
  // max_staleness, the slowest worker is close enough), or `deadline` (capped
  // at max_pull_wait and request.max_wait_ms) passes: DEADLINE_EXCEEDED
  // naming the awaited workers. ABORTED when an awaited worker is lost (see
  // "Liveness" above), naming it and how long it has been silent.
  //
  // With `segment_lease` (a pull that writes the values into a worker's
  // shared memory segment): *segment_lease is set to a lease that, until it
  // is released, makes a push that would change the values wait for it
  // (Status: pushes_waiting) instead of copying them away from under the
  // writes; and while a push waits so, such a pull is not ready, so the
  // push is never starved. The holder must only write (no wait on the
  // worker, the network or the job) and must drop its snapshot before the
  // lease, or the push still copies.
  //
  // With `in_place` as well (and a request naming a segment), *in_place is
  // set, by var_index, to 1 where that segment already holds the
  // snapshot's values at the offset the request names, written by a push
  // as it formed them (PushSession::AddShared) or by the update (Commit::
  // Run), so that the pull need not write them, and 0 elsewhere; only the
  // first such pull after they were written (the worker may change that
  // memory once it returned). Such a pull also waits while a push writes
  // new values into a segment of the job.
  //
  // With `cancelled`, a wait also ends, with CANCELLED, within
  // kCancelledPoll once it returns true (the caller went away, or a
  // same-host channel stops: the thread is free for its next call, not
  // held to the deadline).
  absl::StatusOr<std::shared_ptr<const WeightsSnapshot>> Pull(
      const v1::PullRequest& request, absl::Time deadline,
      std::shared_ptr<void>* segment_lease = nullptr, std::vector<char>* in_place = nullptr,
      const std::function<bool()>& cancelled = nullptr);
  static constexpr absl::Duration kCancelledPoll = absl::Milliseconds(100);

  // Notes that the worker is alive; returns the job's step and this server's
  // incarnation. NotFound for a job not held here; InvalidArgument for a
  // worker_task out of range.
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);

  // Status of one job, or of all when job_id is empty.
  v1::StatusResponse Status(const v1::StatusRequest& request);

  // Frees the job's variables and optimizer slots. Pulls waiting on it fail
  // with ABORTED; later calls for it get NotFound. OK (existed=false) for an
  // unknown job.
  v1::DeleteJobResponse DeleteJob(const v1::DeleteJobRequest& request);

  // Writes this server's shard of the job (values, optimizer slots, global
  // step, async progress) under request.checkpoint_dir, atomically. The file
  // is written without the job's lock, from the job's own memory at the
  // step the save began: if an update comes while it writes, the save keeps
  // the old buffers and the job continues on copies (copy on write), so a
  // save costs no memory unless it overlaps an update. NotFound
  // for an unknown job; errors from the file system name the path.
  // InvalidArgument naming checkpoint_dir when it is outside
  // options.checkpoint_roots (nothing is written or created then).
  absl::StatusOr<v1::SaveResponse> Save(const v1::SaveRequest& request);

  // For shutdown: every waiting Pull (and each later one that would wait)
  // returns UNAVAILABLE "pull: ps N is shutting down" at once, so that the
  // server's Shutdown is not held up to max_pull_wait by long polls. Pulls
  // that are ready are still served. Idempotent.
  void StopWaiting();

  // Counts one served push or pull of `job_id` taking `service_time` (the
  // adapter's time streaming and applying, without waits) for the
  // requests/s and latency figures of Status().
  void RecordRequest(const std::string& job_id, absl::Duration service_time);

  // The job's variable definitions, in var_index order (NotFound if unknown).
  absl::StatusOr<std::vector<v1::VariableDef>> Variables(const std::string& job_id);

  // Bytes counted against options.memory_budget_bytes by the jobs held now.
  int64_t reserved_bytes();

 private:
  // `dir` in its normal form when it is under options_.checkpoint_roots (or
  // as given when they are unset); InvalidArgument naming `field` otherwise.
  absl::StatusOr<std::string> ConfinedDir(absl::string_view field, const std::string& dir) const;
  absl::StatusOr<std::shared_ptr<internal::Job>> FindJob(const std::string& id);
  // What StatusResponse, RegisterResponse and HeartbeatResponse report.
  int64_t Incarnation() const { return static_cast<int64_t>(incarnation_ >> 1); }
  // Appends `event` to options_.apply_log when there is one.
  void Record(absl::string_view event) const {
    if (options_.apply_log != nullptr) options_.apply_log->Append(Incarnation(), event);
  }

  // FinishPush's decision, under the job's lock; *update: as FinishPush's
  // *commit.
  absl::StatusOr<v1::PushResponse> DecidePush(std::unique_ptr<PushSession> session,
                                              std::unique_ptr<Commit>* update);
  std::unique_ptr<Commit> MakeCommit(
      std::shared_ptr<internal::Job> job, std::shared_ptr<Publication> publication,
      std::vector<GradientPart> parts, std::vector<char> prepared = {}) const;

  absl::StatusOr<std::shared_ptr<internal::Job>> CreateJob(
      const v1::RegisterRequest& request, const v1::TrainingConfig& config);

  const ParameterServerOptions options_;
  const absl::Time started_ = absl::Now();
  const uint64_t incarnation_;
  std::atomic<bool> stopping_{false};  // StopWaiting() was called.
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<internal::Job>> jobs_ ABSL_GUARDED_BY(mu_);
  // Sum of RegisterFootprintBytes of the jobs in jobs_ and of those being
  // created (reserved before CreateJob, returned if it fails).
  int64_t reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Jobs being created (outside mu_), which other Registers of them await.
  std::set<std::string> creating_ ABSL_GUARDED_BY(mu_);
  int registers_waiting_ ABSL_GUARDED_BY(mu_) = 0;
  absl::CondVar created_;
  // RunLater's threads; a job's updates always go to the same one (by its
  // id), and different jobs' updates mostly to different ones. Last: they
  // stop first (the destructor also waits for them before anything else).
  std::vector<std::unique_ptr<common::SerialExecutor>> updaters_;
};

// How a job's updates went, for the logs: how many were formed ahead
// (JobStatus.updates_ahead, steps_applied: "N of its M updates formed
// ahead, during their push"; none applied, nothing), how many pushes named
// their gradients at once (pushes_named_at_once, pushes_applied: "N of its
// M pushes named every gradient at once, with the commit"; none applied,
// nothing), and what its pulls
// into workers' shared memory found there already (segment_pull_values,
// values_in_place: "of the N variables pulled into workers' shared
// memory, M were there already"; none pulled there, nothing), and how busy
// the server process was from the job's first update to its latest
// (update_span_s, update_span_cpu_s: "process cpu from its first update to
// its last C s in S s (C/S cores)"; under 2 updates, nothing); "; "
// between them.
std::string DescribeUpdates(const v1::JobStatus& status);

}  // namespace towerps::ps

#endif  // TOWERPS_PS_PARAMETER_SERVER_H_
