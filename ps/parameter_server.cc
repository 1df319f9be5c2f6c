#include "ps/parameter_server.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/checked_math.h"
#include "common/gradient_codec.h"
#include "common/initializer.h"
#include "common/logging.h"
#include "common/process_cpu.h"
#include "common/status.h"
#include "common/storage/checkpoint.h"
#include "google/protobuf/util/message_differencer.h"
#include "ps/optimizer.h"

namespace towerps::ps {
namespace internal {

struct Variable {
  v1::VariableDef def;
  std::vector<float> value;
  std::unique_ptr<Optimizer> optimizer;
  int64_t updates = 0;
  // Bounds on the magnitudes of `value` and the optimizer's slots, for the
  // overflow guard (Commit::Update): measured when the job is made, then
  // carried by each update (Optimizer::BoundStep).
  MagnitudeBounds bounds;
};

struct WorkerRecord {
  // Liveness: when this server last heard from the worker (register, push,
  // pull, heartbeat) and by which call. InfinitePast: never.
  absl::Time last_heard = absl::InfinitePast();
  const char* heard_by = "";
  bool seen = false;  // Pushed at least once (incarnation, sequence valid).
  uint64_t incarnation = 0;
  uint64_t last_sequence = 0;
  int64_t completed = 0;  // ASYNC: iterations pushed by this worker.
};

// What a save writes from: views of a job's values and slots at one step,
// kept valid (copy on write) until the save lets go of it.
struct SaveView {
  common::ShardView shard;  // its spans view the job's buffers, or `owned`
  std::vector<std::shared_ptr<const std::vector<float>>> owned;
};

class Job {
 public:
  Job(std::string id, v1::TrainingConfig config)
      : id(std::move(id)),
        config(std::move(config)),
        replicas(this->config.replicas_to_aggregate() > 0
                     ? this->config.replicas_to_aggregate()
                     : this->config.num_workers()),
        peer_timeout(absl::Seconds(this->config.peer_timeout_s())) {}

  const std::string id;
  const v1::TrainingConfig config;
  const int replicas;
  // A worker silent this long is lost (config.peer_timeout_s, normalized).
  const absl::Duration peer_timeout;
  // A worker never heard from counts as silent since then.
  const absl::Time registered_at = absl::Now();
  // Set once at creation, never resized afterwards.
  std::vector<int64_t> sizes;
  // VariableDef.update by var_index, read without the lock like `sizes`.
  std::vector<v1::VariableDef::Update> update_kinds;

  absl::Mutex mu;
  std::vector<Variable> vars ABSL_GUARDED_BY(mu);
  int64_t global_step ABSL_GUARDED_BY(mu) = 0;
  std::vector<WorkerRecord> workers ABSL_GUARDED_BY(mu);
  // SYNC: the open step's gradients by worker (weight = examples), summed in
  // worker order once the step is complete, into the first worker's buffer
  // (or, when that part views a worker's segment, GradientPart, into
  // mean_scratch), variable by variable. Summing as pushes arrive would make
  // the result depend on their order (saxpy's FMA rounds fma(w1, g1, w0 g0)
  // and fma(w0, g0, w1 g1) differently): the same job must give the same
  // weights.
  std::map<int, GradientPart> staged ABSL_GUARDED_BY(mu);
  int64_t acc_examples ABSL_GUARDED_BY(mu) = 0;
  std::set<int> pushed ABSL_GUARDED_BY(mu);
  absl::Time step_opened ABSL_GUARDED_BY(mu) = absl::Now();
  // What pulls stream from: views of `vars`' values at global_step, made by
  // the first pull of a step. DetachViewsLocked runs before the values
  // change.
  std::shared_ptr<WeightsSnapshot> snapshot ABSL_GUARDED_BY(mu);
  // The views of saves under way (values and slots), which
  // DetachViewsLocked also serves.
  std::vector<std::weak_ptr<SaveView>> saves ABSL_GUARDED_BY(mu);
  // Old value buffers handed to views (by var_index); once no view holds
  // one, it is reused (spare, by var_index).
  std::vector<std::pair<size_t, std::shared_ptr<std::vector<float>>>> detached
      ABSL_GUARDED_BY(mu);
  std::vector<std::vector<float>> spare ABSL_GUARDED_BY(mu);
  // Staging buffers of finished pushes, reused to avoid fresh pages each step.
  std::vector<std::vector<std::vector<float>>> free_buffers ABSL_GUARDED_BY(mu);
  // The optimizer slots a push formed ahead (PushSession::slots_), by
  // var_index, once a commit adopted them: the old slots, for the next
  // push of the job's one worker. Empty: none kept.
  std::vector<std::vector<std::vector<float>>> free_slots ABSL_GUARDED_BY(mu);
  // Where a Commit forms the mean of a variable whose first part has no
  // buffer of its own (it is read in place from a segment): one variable's
  // size at most. Only the Commit under way (`committing`) touches it.
  std::vector<float> mean_scratch;
  bool deleted ABSL_GUARDED_BY(mu) = false;
  // The lost workers and step last logged, so that each loss is logged once.
  std::string lost_logged ABSL_GUARDED_BY(mu);
  int64_t restored_step ABSL_GUARDED_BY(mu) = -1;
  int64_t steps_applied ABSL_GUARDED_BY(mu) = 0;
  // The clock and this process's CPU time at the job's first and latest
  // step: how many cores the server kept busy while the job trained
  // (logged at delete; the step breakdown benchmark's `cores`).
  absl::Time first_step_at ABSL_GUARDED_BY(mu), last_step_at ABSL_GUARDED_BY(mu);
  double first_step_cpu_s ABSL_GUARDED_BY(mu) = 0, last_step_cpu_s ABSL_GUARDED_BY(mu) = 0;
  // Requests served in the current and the previous 10 s window; a job
  // younger than a window has had no previous one (`created`).
  const absl::Time created = absl::Now();
  absl::Time window_start ABSL_GUARDED_BY(mu) = created;
  int64_t window_requests[2] ABSL_GUARDED_BY(mu) = {0, 0};
  double window_service_s[2] ABSL_GUARDED_BY(mu) = {0, 0};
  int64_t applied ABSL_GUARDED_BY(mu) = 0;
  int64_t stale ABSL_GUARDED_BY(mu) = 0;
  int pulls_waiting ABSL_GUARDED_BY(mu) = 0;  // Pulls blocked in their wait loop.
  // Pulls writing the values of `snapshot` into workers' segments (their
  // leases not yet released), and pushes waiting for them to finish.
  int segment_writers ABSL_GUARDED_BY(mu) = 0;
  int pushes_waiting ABSL_GUARDED_BY(mu) = 0;
  // Pushes reading the values to form their update ahead (PushSession::
  // PrepareAhead), each for one pass with no wait inside: the values stay
  // where they are until they finish.
  int preparing ABSL_GUARDED_BY(mu) = 0;
  int64_t updates_ahead ABSL_GUARDED_BY(mu) = 0;  // commits of values formed ahead
  int64_t updates_skipped ABSL_GUARDED_BY(mu) = 0;  // variable updates not applied
  int64_t pushes_named_at_once ABSL_GUARDED_BY(mu) = 0;  // JobStatus
  // Variables pulls into workers' segments named, and of them those found
  // there already (Job::written): JobStatus, and the log at deletion.
  int64_t segment_pull_values ABSL_GUARDED_BY(mu) = 0;
  int64_t values_in_place ABSL_GUARDED_BY(mu) = 0;
  // Same host: the new values written into workers' segments, by a push
  // of a lone worker as it formed them (PushSession::AddShared) or by an
  // update (Commit::Run), by segment (its nonce): by var_index, `at` the
  // byte offset and `version` the steps_applied whose values lie there
  // (-1: none known). A pull into the segment takes it away (only the
  // first pull after the update takes the values as they lie), and each
  // commit keeps only the segments whose values it vouched for.
  struct Written {
    std::vector<int64_t> at, version;
  };
  std::map<std::string, Written> written ABSL_GUARDED_BY(mu);
  // `writer` is the push writing into a segment as it forms values, or
  // whose values those are (0: none): a pull into a segment takes that
  // role away, since it may write any variable, and a push's commit
  // records its writes only if it still holds it. `writers` hands out the
  // pushes' ids; `writing_through` counts pushes writing into a segment
  // now, which pulls into segments wait for.
  int64_t writer ABSL_GUARDED_BY(mu) = 0;
  int64_t writers ABSL_GUARDED_BY(mu) = 0;
  int writing_through ABSL_GUARDED_BY(mu) = 0;
  // The segments named by pulls waiting in Pull (valid while they wait):
  // their workers read and release nothing there until the pull returns,
  // so an update after the push was answered may write there (Commit::Run).
  std::vector<const v1::SharedSegment*> segment_pulls_waiting ABSL_GUARDED_BY(mu);
  // A Commit is updating the values without the lock: only it touches the
  // variables' values and slots until it clears this; every other writer
  // (pushes, saves, deletion) waits (AwaitWritableLocked), and pulls read
  // each variable once `publishing` says it is final.
  bool committing ABSL_GUARDED_BY(mu) = false;
  std::shared_ptr<Publication> publishing ABSL_GUARDED_BY(mu);
  int64_t duplicate ABSL_GUARDED_BY(mu) = 0;
  absl::CondVar changed;

  static constexpr absl::Duration kWindow = absl::Seconds(10);

  // Rolls the request windows forward to `now`.
  void RollLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (now - window_start < kWindow) return;
    const bool skipped = now - window_start >= 2 * kWindow;
    window_requests[1] = skipped ? 0 : window_requests[0];
    window_service_s[1] = skipped ? 0 : window_service_s[0];
    window_requests[0] = 0;
    window_service_s[0] = 0;
    window_start = skipped ? now : window_start + kWindow;
  }

  int64_t slot_bytes() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    int64_t b = 0;
    for (const auto& v : vars) b += v.optimizer->slot_bytes();
    return b;
  }

  // RegisterFootprintBytes counted against the server's budget; returned by
  // DeleteJob. Set before the job is published.
  int64_t reserved = 0;

  // Keeps a push's staging buffers for the next push when they are a whole
  // set (a push that shared some variables has none for them).
  void KeepBuffersLocked(std::vector<std::vector<float>> set) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (set.size() != sizes.size()) return;
    for (size_t v = 0; v < set.size(); ++v) {
      if (static_cast<int64_t>(set[v].size()) != sizes[v]) return;
    }
    free_buffers.push_back(std::move(set));
  }

  // Keeps a push's staged slots for the next push (one set at most: only
  // the job's one worker stages them).
  void KeepSlotsLocked(std::vector<std::vector<std::vector<float>>> set)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (free_slots.empty() && set.size() == sizes.size()) free_slots = std::move(set);
  }

  int64_t bytes() const {
    int64_t b = 0;
    for (int64_t n : sizes) b += n * 4;
    return b;
  }

  void HeardLocked(int worker, const char* by) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (worker < 0 || worker >= static_cast<int>(workers.size())) return;
    workers[worker].last_heard = absl::Now();
    workers[worker].heard_by = by;
  }

  // When `worker` counts as lost if nothing is heard from it before.
  absl::Time LostAtLocked(int worker) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const WorkerRecord& r = workers[worker];
    return (r.last_heard == absl::InfinitePast() ? registered_at : r.last_heard) + peer_timeout;
  }

  // "worker 1, not heard from for 3.1 s (...)": why `worker` is lost.
  std::string LostReasonLocked(int worker, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const WorkerRecord& r = workers[worker];
    const bool never = r.last_heard == absl::InfinitePast();
    const double silent = absl::ToDoubleSeconds(now - (never ? registered_at : r.last_heard));
    return absl::StrFormat(
        "worker %d, not heard from for %.1f s (%s)", worker, silent,
        never ? "never joined: not started, crashed or unreachable"
              : absl::StrCat("last heard by ", r.heard_by, "; crashed, hung or unreachable"));
  }

  std::vector<int> WaitingForLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::vector<int> out;
    for (int w = 0; w < config.num_workers(); ++w) {
      if (!pushed.count(w)) out.push_back(w);
    }
    return out;
  }

  // Waits (releasing `mu`) until no pull is writing the values into a
  // worker's segment: they are about to change, and a pull that writes them
  // takes as long as a copy would, with no wait of its own (ParameterServer::
  // Pull), so waiting costs no more time than copying and no memory. New
  // such pulls wait meanwhile (`pushes_waiting`).
  void AwaitSegmentWritersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (segment_writers == 0) return;
    ++pushes_waiting;
    while (segment_writers > 0) changed.Wait(&mu);
    --pushes_waiting;
    changed.SignalAll();
  }

  // Waits (releasing `mu`) until the values may change: no Commit under way
  // (`on_commit_wait`, may be empty, is told when that wait starts) and no
  // pull writing them into a segment.
  void AwaitWritableLocked(const std::function<void()>& on_commit_wait)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    while (committing || segment_writers > 0 || preparing > 0) {
      AwaitCommitLocked(on_commit_wait);
      AwaitSegmentWritersLocked();
      AwaitPreparingLocked();
    }
  }

  // Waits (releasing `mu`) until no push reads the values to update ahead.
  void AwaitPreparingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    while (preparing > 0) changed.Wait(&mu);
  }

  // Waits (releasing `mu`) until no Commit is under way.
  void AwaitCommitLocked(const std::function<void()>& on_commit_wait)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!committing) return;
    if (on_commit_wait) on_commit_wait();
    while (committing) changed.Wait(&mu);
  }

  // Starts the update of every variable by `parts` (gradients, or for a
  // MOVING_AVERAGE variable statistics, by ascending worker with their
  // weights; see Commit): views still held let go of the values, the step
  // advances (pulls wake), and the returned publication says which
  // variables are final. The caller fills in and runs the Commit.
  // REQUIRES: !committing, no segment writers and no push preparing
  // (AwaitWritableLocked).
  //
  // Variables whose new values were formed ahead (`prepared`, by var_index;
  // PushSession::PrepareAhead) into `formed` (the one part, of weight 1:
  // its buffers, its slots, and bounds on both), are swapped in here,
  // under the lock, once views have let go, so that every snapshot taken
  // from here on views them; the old values and slots go back with the
  // part's buffers, and the Commit only publishes them.
  std::shared_ptr<Publication> BeginCommitLocked(
      const std::vector<char>& prepared = {}, GradientPart* formed = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    DetachViewsLocked(/*keep_copies=*/true);
    committing = true;
    publishing = std::make_shared<Publication>();
    if (!prepared.empty()) ++updates_ahead;
    for (size_t v = 0; v < prepared.size(); ++v) {
      if (!prepared[v]) continue;
      vars[v].value.swap(formed->owned[v]);
      if (vars[v].optimizer->num_slots() > 0) vars[v].optimizer->AdoptSlots(&formed->slots[v]);
      ++vars[v].updates;
      vars[v].bounds = formed->formed_bounds[v];
    }
    AdvanceLocked();
    return publishing;
  }

  // The values and slots are about to change (or go away): views still held
  // (a pull's snapshot, a save's view) take the current buffers, and, with
  // `keep_copies`, the variables continue on copies (reusing value buffers no
  // view holds any more). No copy when no view is held, which is the common
  // case: a worker's pull ends before its push is applied, and the chief
  // saves between steps.
  void DetachViewsLocked(bool keep_copies) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    // use_count is exact here: new references are only taken under `mu`.
    const bool pull_held = snapshot != nullptr && snapshot.use_count() > 1;
    std::vector<std::shared_ptr<SaveView>> held_saves;
    for (const std::weak_ptr<SaveView>& w : saves) {
      if (std::shared_ptr<SaveView> view = w.lock()) held_saves.push_back(std::move(view));
    }
    saves.clear();
    if (pull_held || !held_saves.empty()) {
      RecycleLocked();
      for (size_t i = 0; i < vars.size(); ++i) {
        // The buffer moves (its memory stays where the views look).
        auto old = std::make_shared<std::vector<float>>(std::move(vars[i].value));
        if (keep_copies) {
          std::vector<float> copy = std::move(spare[i]);
          spare[i].clear();
          copy.assign(old->begin(), old->end());
          vars[i].value = std::move(copy);
        }
        if (pull_held) snapshot->owned.push_back(old);
        for (auto& view : held_saves) view->owned.push_back(old);
        detached.emplace_back(i, std::move(old));
      }
    }
    for (auto& view : held_saves) {
      for (Variable& v : vars) {
        for (std::vector<float>& slot : v.optimizer->DetachSlots()) {
          view->owned.push_back(std::make_shared<std::vector<float>>(std::move(slot)));
        }
      }
    }
    snapshot.reset();
  }

  // Value buffers no view holds any more go back to `spare`.
  void RecycleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    spare.resize(vars.size());
    for (auto it = detached.begin(); it != detached.end();) {
      if (it->second.use_count() == 1) {
        if (it->first < spare.size() && spare[it->first].empty()) {
          spare[it->first] = std::move(*it->second);
        }
        it = detached.erase(it);
      } else {
        ++it;
      }
    }
  }

  void UpdateSpanLocked(v1::JobStatus* status) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (steps_applied < 2) return;
    status->set_update_span_s(absl::ToDoubleSeconds(last_step_at - first_step_at));
    status->set_update_span_cpu_s(last_step_cpu_s - first_step_cpu_s);
  }

  void AdvanceLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    ++global_step;
    ++steps_applied;
    last_step_at = absl::Now();
    last_step_cpu_s = common::ProcessCpuTime().total_s();
    if (steps_applied == 1) {
      first_step_at = last_step_at;
      first_step_cpu_s = last_step_cpu_s;
    }
    DetachViewsLocked(/*keep_copies=*/true);
    step_opened = absl::Now();
    changed.SignalAll();
  }
};

}  // namespace internal

using internal::Job;

namespace {

// RunLater's threads. An update is one pass over a job's shard, memory-bound,
// and one job's run one at a time; a second thread lets another job's update
// go meanwhile.
constexpr int kUpdaterThreads = 2;

// InvalidArgument unless 0 <= task < num_workers; `what` names the request.
absl::Status CheckWorkerTask(const char* what, int64_t task, int num_workers) {
  if (task >= 0 && task < num_workers) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": worker_task ", task,
                                                 " is out of range (job has ", num_workers,
                                                 " workers)"));
}

absl::Status ValidateRegister(const v1::RegisterRequest& r, int64_t max_bytes) {
  if (r.job_id().empty()) return absl::InvalidArgumentError("register: job_id is empty");
  const auto& c = r.config();
  if (c.num_workers() < 1 || c.num_workers() > kMaxWorkers) {
    // The server keeps a record per worker: an unbounded count is a memory
    // bomb in one request (found by tests/fuzz:ps_fuzzer).
    return absl::InvalidArgumentError(absl::StrCat("register: config.num_workers = ",
                                                   c.num_workers(), " (want 1..", kMaxWorkers,
                                                   ")"));
  }
  if (c.replicas_to_aggregate() < 0 || c.replicas_to_aggregate() > c.num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "register: config.replicas_to_aggregate = ", c.replicas_to_aggregate(),
        " (want 0..num_workers = ", c.num_workers(), ")"));
  }
  if (c.max_staleness() < 0) {
    return absl::InvalidArgumentError("register: config.max_staleness is negative");
  }
  if (!(c.peer_timeout_s() >= 0) || c.peer_timeout_s() > 86400) {
    return absl::InvalidArgumentError(absl::StrCat(
        "register: config.peer_timeout_s = ", c.peer_timeout_s(), " (want 0..86400)"));
  }
  if (r.has_worker_task()) {
    TOWERPS_RETURN_IF_ERROR(CheckWorkerTask("register", r.worker_task(), c.num_workers()));
  }
  if (!v1::Mode_IsValid(c.mode())) {
    return absl::InvalidArgumentError("register: config.mode is unknown");
  }
  TOWERPS_RETURN_IF_ERROR(common::Annotate(ValidateOptimizer(c.optimizer()), "register"));
  std::set<std::string> names;
  for (const auto& v : r.variables()) {
    if (v.name().empty()) return absl::InvalidArgumentError("register: a variable has no name");
    if (!names.insert(v.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("register: variable \"", v.name(), "\" appears twice"));
    }
    if (v.dtype() != v1::DT_FLOAT32) {
      return absl::InvalidArgumentError(absl::StrCat(
          "register: variable \"", v.name(), "\" has unsupported dtype ", v.dtype()));
    }
    // Before anything is created: a bad update rule must never reach CreateJob.
    TOWERPS_RETURN_IF_ERROR(common::Annotate(ValidateVariableUpdate(v), "register"));
    TOWERPS_RETURN_IF_ERROR(common::Annotate(
        common::ValidateInitializer(v.initializer()),
        absl::StrCat("register: variable \"", v.name(), "\"")));
    int64_t n = 1;
    for (int64_t d : v.shape()) {
      if (d <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "register: variable \"", v.name(), "\" has invalid dimension ", d));
      }
      // Shapes such as [2^31, 2^33 - 1] would overflow int64.
      std::optional<int64_t> product = common::CheckedMul(n, d);
      if (!product.has_value() || !common::CheckedMul(*product, sizeof(float)).has_value()) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "register: variable \"", v.name(), "\" of shape [", absl::StrJoin(v.shape(), ", "),
            "] overflows int64 (elements x 4 bytes); this server's limit is ", max_bytes,
            " bytes per job (--max_job_bytes)"));
      }
      n = *product;
    }
  }
  return absl::OkStatus();
}

v1::TrainingConfig Normalized(v1::TrainingConfig c) {
  if (c.mode() == v1::MODE_UNSPECIFIED) c.set_mode(v1::SYNC);
  if (c.peer_timeout_s() == 0) c.set_peer_timeout_s(kDefaultPeerTimeoutS);
  *c.mutable_optimizer() = OptimizerWithDefaults(c.optimizer());
  return c;
}

// Whether every element is finite, at BLAS speed: a finite sum of |x| means
// every element is. A sum that is not also comes from finite elements whose
// sum overflows a float (a few of 1e38): those are looked at one by one, so
// that the answer is exact and does not depend on how a gradient was cut
// into pieces (and "contains NaN or Inf" is true when said).
// With `abs_sum`, the sum of |x| is added to it (+inf where it overflows a
// float, the elements finite): at least every |x[i]|, as each partial sum
// rounds no lower than its terms (the overflow guard's bound).
bool AllFinite(const float* x, int64_t n, double* abs_sum = nullptr) {
  constexpr int64_t kMaxCall = int64_t{1} << 30;  // sasum counts in int
  for (int64_t first = 0; first < n; first += kMaxCall) {
    const int64_t k = std::min(kMaxCall, n - first);
    const float sum = cblas_sasum(static_cast<int>(k), x + first, 1);
    if (abs_sum != nullptr) *abs_sum += sum;
    if (std::isfinite(sum)) continue;
    for (int64_t i = first; i < first + k; ++i) {
      if (!std::isfinite(x[i])) return false;
    }
  }
  return true;
}

// Bounds of 0, where sums of |x| start.
MagnitudeBounds ZeroBounds() {
  MagnitudeBounds b;
  b.value = b.slots[0] = b.slots[1] = 0.0;
  return b;
}

// The lower of two bounds on the same elements, field by field.
MagnitudeBounds LowerBounds(const MagnitudeBounds& a, const MagnitudeBounds& b) {
  MagnitudeBounds low;
  low.value = std::min(a.value, b.value);
  for (int i = 0; i < 2; ++i) low.slots[i] = std::min(a.slots[i], b.slots[i]);
  return low;
}

int64_t ElementsOf(const v1::VariableDef& def) {
  int64_t n = 1;
  for (int64_t d : def.shape()) n = common::SaturatingMul(n, d);
  return n;
}

// Optimizer slots per element of `def` (ADAM 2, MOMENTUM 1; none for SGD
// and a MOVING_AVERAGE variable).
int64_t SlotsPerElement(const v1::VariableDef& def, const v1::TrainingConfig& config) {
  int64_t slots = 0;
  if (def.update() != v1::VariableDef::MOVING_AVERAGE) {
    switch (config.optimizer().type()) {
      case v1::OptimizerSpec::ADAM:
        slots = 2;
        break;
      case v1::OptimizerSpec::MOMENTUM:
        slots = 1;
        break;
      default:
        slots = 0;
    }
  }
  return slots;
}

// Why a register is refused for its size: the job's bytes, its largest
// variable and what each of its elements costs.
std::string FootprintDetail(const v1::RegisterRequest& r, const v1::TrainingConfig& config,
                            int64_t need) {
  int largest = 0;
  int64_t largest_bytes = -1;
  for (int i = 0; i < r.variables_size(); ++i) {
    const int64_t b = common::SaturatingMul(
        common::SaturatingMul(ElementsOf(r.variables(i)),
                              FloatsPerElement(r.variables(i), config, i)),
        sizeof(float));
    if (b > largest_bytes) {
      largest = i;
      largest_bytes = b;
    }
  }
  std::string detail = absl::StrCat("job \"", r.job_id(), "\" needs ", need, " bytes");
  if (r.variables_size() == 0) return detail;
  const v1::VariableDef& v = r.variables(largest);
  const int64_t floats = FloatsPerElement(v, config, largest);
  const int64_t slots = floats - 2 - config.num_workers();
  return absl::StrCat(detail, "; variable \"", v.name(), "\" of shape [",
                      absl::StrJoin(v.shape(), ", "), "] alone needs ", largest_bytes, " (",
                      floats, " floats per element: value, pull snapshot, ", slots,
                      " optimizer slots", slots > SlotsPerElement(v, config)
                          ? " (with those its worker's pushes form ahead)" : "",
                      ", ", config.num_workers(), " push buffers)");
}

}  // namespace

bool FormsSlotsAhead(int index, int64_t elements) {
  return index == 0 || elements <= kSlotsAheadMaxElements;
}

int64_t FloatsPerElement(const v1::VariableDef& def, const v1::TrainingConfig& config,
                         int index) {
  const int64_t slots = SlotsPerElement(def, config);
  // One worker: its pushes stage these slots' new values (updates ahead).
  const bool staged =
      index >= 0 && config.num_workers() == 1 && FormsSlotsAhead(index, ElementsOf(def));
  return 2 + (staged ? 2 * slots : slots) + std::max(0, config.num_workers());
}

int64_t RegisterFootprintBytes(const v1::RegisterRequest& request,
                               const v1::TrainingConfig& config) {
  int64_t total = 0;
  for (int i = 0; i < request.variables_size(); ++i) {
    const v1::VariableDef& v = request.variables(i);
    const int64_t floats =
        common::SaturatingMul(ElementsOf(v), FloatsPerElement(v, config, i));
    total = common::SaturatingAdd(total, common::SaturatingMul(floats, sizeof(float)));
  }
  return total;
}

namespace {

// A push whose values were formed ahead from values that have changed since.
absl::Status ValuesChangedError(const Job& job, const v1::PushHeader& h, bool deleted) {
  return absl::AbortedError(absl::StrCat(
      "push: the values of job \"", job.id, "\" changed while the push of worker ",
      h.worker_task(), " (sequence ", h.sequence(), ") arrived",
      deleted ? " (the job was deleted)" : " (another push was applied first)",
      "; nothing applied"));
}

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
  const v1::TrainingConfig config = Normalized(request.config());
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
  // (parameter_server.h, "Updates ahead"), and elsewhere the gradients are
  // better named with the commit ("Named with the commit"): read before the
  // job's lock.
  const bool cores_apart =
      in_segment && (options_.as_if_on_cores_apart ||
                     !common::SharesCpusWith(static_cast<pid_t>(header.segment().pid())));
  s->names_with_commit_ = in_segment && !cores_apart;
  {
    // Updates ahead (parameter_server.h): this push is the step's only
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
