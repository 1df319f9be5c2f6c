// A job's state on one parameter server: its variables (values, optimizer,
// bounds), the workers it has heard from, the open step's gradients, the
// views that pulls and saves hold, and the bookkeeping of the updates in
// flight (ParameterServer, PushSession and Commit share it). Internal to the
// ps: every field is public to them, and the fields marked
// ABSL_GUARDED_BY(mu) are read and written under `mu`.
#ifndef TOWERPS_PS_JOB_STATE_H_
#define TOWERPS_PS_JOB_STATE_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/process_cpu.h"
#include "common/storage/checkpoint.h"
#include "ps/gradient_part.h"
#include "ps/optimizer.h"
#include "ps/publication.h"
#include "ps/weights_snapshot.h"
#include "proto/ps.pb.h"

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

// Whether every element is finite, at BLAS speed: a finite sum of |x| means
// every element is. A sum that is not also comes from finite elements whose
// sum overflows a float (a few of 1e38): those are looked at one by one, so
// that the answer is exact and does not depend on how a gradient was cut
// into pieces (and "contains NaN or Inf" is true when said).
// With `abs_sum`, the sum of |x| is added to it (+inf where it overflows a
// float, the elements finite): at least every |x[i]|, as each partial sum
// rounds no lower than its terms (the overflow guard's bound).
bool AllFinite(const float* x, int64_t n, double* abs_sum = nullptr);

// Bounds of 0, where sums of |x| start.
MagnitudeBounds ZeroBounds();

// The lower of two bounds on the same elements, field by field.
MagnitudeBounds LowerBounds(const MagnitudeBounds& a, const MagnitudeBounds& b);

// ABORTED: a push whose values were formed ahead from values that have
// changed since (`deleted`: because the job was deleted).
absl::Status ValuesChangedError(const Job& job, const v1::PushHeader& h, bool deleted);

}  // namespace internal
}  // namespace towerps::ps

#endif  // TOWERPS_PS_JOB_STATE_H_
