// The parameter servers of one job as this worker sees them: a channel, the
// byte-buffer Push and Pull methods (common/tensor_wire.h) and two
// SerialExecutors (one for pushes, one for pulls) per server, the parts of
// the placement each server holds, and their liveness (ps_client.h,
// "Liveness"): who answered, who is unreachable since when, who restarted,
// kept up by a heartbeat thread. The ParameterClient and its streams share
// one; it outlives them.
//
// Internal to worker/train (ps_client and its streams). Thread-safe.
#ifndef TOWERPS_WORKER_TRAIN_PS_PEERS_H_
#define TOWERPS_WORKER_TRAIN_PS_PEERS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/retry.h"
#include "common/serial_executor.h"
#include "common/shared_segment.h"
#include "grpcpp/channel.h"
#include "grpcpp/impl/rpc_method.h"
#include "proto/ps.grpc.pb.h"
#include "proto/tensor.pb.h"
#include "worker/train/placement.h"
#include "worker/train/ps_client.h"
#include "worker/train/shm_call_client.h"

namespace towerps::worker::internal {

class PsPeers {
 public:
  // `options.incarnation` must be set (non-zero).
  PsPeers(ParameterClientOptions options, std::vector<v1::VariableDef> vars,
          Placement placement);
  // Stops the heartbeats, then runs what the executors still hold.
  ~PsPeers();
  PsPeers(const PsPeers&) = delete;
  PsPeers& operator=(const PsPeers&) = delete;

  int size() const { return static_cast<int>(servers_.size()); }
  const ParameterClientOptions& options() const { return options_; }
  const std::vector<v1::VariableDef>& vars() const { return vars_; }
  const Placement& placement() const { return placement_; }
  // The parts ps task `s` holds, by its var_index.
  const std::vector<VariablePart>& parts_on(int s) const { return servers_[s]->parts; }
  // Every loop asks again on the transport's codes: UNAVAILABLE and
  // DEADLINE_EXCEEDED (a server-side wait that ran out, or a slow server).
  // ABORTED is a server's verdict (e.g. a lost worker): not retried here; the
  // chief's job manager restarts the attempt. The domain limits (a lost
  // server, max_push_attempts, wait_timeout) come on top.
  const common::RetryPolicy& retry() const { return retry_; }

  grpc::Channel& channel(int s) { return *servers_[s]->channel; }
  v1::ParameterService::Stub& stub(int s) { return *servers_[s]->stub; }
  const grpc::internal::RpcMethod& push_method(int s) const { return *servers_[s]->push; }
  const grpc::internal::RpcMethod& pull_method(int s) const { return *servers_[s]->pull; }
  // Where the streams to ps task `s` run: one push and one pull at a time
  // each, in the order they were started.
  common::SerialExecutor& push_executor(int s) { return servers_[s]->push_executor; }
  common::SerialExecutor& pull_executor(int s) { return servers_[s]->pull_executor; }

  // "ps 1 at host:port".
  std::string ServerName(int s) const;
  // "Pull on ps 1 at host:port".
  std::string Call(const char* method, int s) const;
  // How often a waiting loop logs: peer_timeout / 2 within [1 s, 5 s].
  absl::Duration LogInterval() const;

  // --- Same host (common/shared_segment.h). ---
  // Where server `s` may write its pulls: the segment (with the offset of
  // each of its parts, by its var_index) for the caller's next call, which
  // gets `pull_id` (increasing). With `landing`, the parts' offsets are in
  // the landing region rather than where the values live (SegmentValues):
  // for a retried pull, whose server must not write parts that are complete
  // (someone may be reading them there); and for every pull once values'
  // memory was given back (ReleaseSegmentMemory: the tensors moved out, and
  // a server may hold values it wrote there before as in place). False
  // when shared memory is off
  // (options.shared_memory), unavailable, or refused by that server. Only
  // the server's pull executor calls it and reads the segment.
  bool SegmentFor(int s, bool landing, v1::SharedSegment* request);
  // The same for a push to server `s` (where each part's gradient goes):
  // only once that server has written a pull in place (so it can open the
  // segment). Only the server's push executor calls it and writes there.
  bool PushSegmentFor(int s, v1::SharedSegment* request);
  // The segment (one for every server). REQUIRES: SegmentFor or
  // PushSegmentFor returned true.
  const common::SharedSegment& segment() const { return *segment_; }
  common::SharedSegment& mutable_segment() { return *segment_; }
  // Where variable `var`'s pulled values / pushed gradient lie in the
  // segment, whole (a variable split across servers too); null without one.
  // The worker's tensors may live there: the copies to and from the segment
  // are skipped for a tensor that does.
  float* SegmentValues(int var);
  float* SegmentGradients(int var);
  // Gives the pages of variable `var`'s pulled values back to the system
  // (their contents are lost; they come back as zeros if written). The
  // pushed gradient's stay until the segment goes: a server may still read
  // the last push there.
  void ReleaseSegmentMemory(int var);
  // Server `s`'s same-host channel for pushes / pulls (shm_call_client.h),
  // used by its push / pull executor only; null without a segment or with
  // options.same_host_calls false.
  ShmCallClient* push_channel(int s) { return servers_[s]->push_channel.get(); }
  ShmCallClient* pull_channel(int s) { return servers_[s]->pull_channel.get(); }
  // Where part `k` of server `s` lies in the segment: the gradient pushed.
  int64_t push_offset(int s, size_t k) const { return servers_[s]->push_offsets[k]; }
  // The server wrote `bytes` in place (the first time is logged) / said why
  // it could not (then no later pull offers it the segment; logged once).
  void NoteInPlace(int s, int64_t bytes);
  void NoteSegmentRefused(int s, absl::string_view why);
  // A push's `bytes` of gradient that server `s` read from the segment,
  // and whether its answer asked for the next pushes' gradients named at
  // once, with the commit (PushResponse.names_with_commit: it shares this
  // worker's cores).
  void NotePushedInPlace(int s, int64_t bytes, bool names_with_commit) {
    bytes_pushed_in_place_.fetch_add(bytes, std::memory_order_relaxed);
    servers_[s]->names_with_commit.store(names_with_commit, std::memory_order_relaxed);
  }
  // Whether a push to server `s` names its gradients with the commit: its
  // last in-place push's answer said so, and it has not refused the segment
  // since.
  bool names_with_commit(int s) const {
    return servers_[s]->names_with_commit.load(std::memory_order_relaxed);
  }
  // Bytes of pulled values the servers wrote in place, and of gradients
  // they read from there, since the start.
  int64_t bytes_in_place() const { return bytes_in_place_.load(std::memory_order_relaxed); }
  int64_t bytes_pushed_in_place() const {
    return bytes_pushed_in_place_.load(std::memory_order_relaxed);
  }

  // --- Liveness (ps_client.h). ---
  void NoteReachable(int s) ABSL_LOCKS_EXCLUDED(mu_);
  void NoteUnreachable(int s, const absl::Status& st) ABSL_LOCKS_EXCLUDED(mu_);
  // Registered the job with the server's incarnation; starts the heartbeats
  // to it.
  void NoteRegistered(int s, int64_t incarnation) ABSL_LOCKS_EXCLUDED(mu_);
  // NOT_FOUND (or a new incarnation) from a server that held the job.
  void NoteGone(int s, const absl::Status& st) ABSL_LOCKS_EXCLUDED(mu_);
  // UNAVAILABLE / NOT_FOUND naming the first server lost, else OK.
  absl::Status LostServer() ABSL_LOCKS_EXCLUDED(mu_);
  // What a fan-out over every server returns: a lost server is the cause
  // whatever the calls returned (a wait elsewhere ends because of it);
  // otherwise the first error by server, naming it; else OK.
  absl::Status Combine(const std::vector<absl::Status>& results);
  // Starts the heartbeat thread (idempotent; not thread-safe against itself).
  void StartHeartbeats();

 private:
  struct Server {
    explicit Server(int s)
        : push_executor(absl::StrCat("push ps", s)), pull_executor(absl::StrCat("pull ps", s)) {}
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::ParameterService::Stub> stub;
    std::unique_ptr<grpc::internal::RpcMethod> push, pull;
    std::vector<VariablePart> parts;
    common::SerialExecutor push_executor, pull_executor;
    // Same host (when segment_ is set): where each of its parts lies in it.
    std::vector<int64_t> segment_offsets;  // pulled values, by the server's var_index
    std::vector<int64_t> push_offsets;     // pushed gradients, likewise
    std::vector<int64_t> landing_offsets;  // retried pulls, likewise
    std::atomic<bool> segment_refused{false};
    std::atomic<bool> segment_used{false};  // logged once
    std::atomic<bool> names_with_commit{false};
    std::atomic<uint64_t> pull_ids{0};
    std::unique_ptr<ShmCallClient> push_channel, pull_channel;
  };
  struct Health {
    bool registered = false;   // The job is registered there.
    int64_t incarnation = 0;   // The server's, when it registered the job.
    absl::Time unreachable_since = absl::InfiniteFuture();  // Future: reachable.
    std::string last_error;    // The last transport error.
    std::string gone;          // Set: it restarted and lost the job (why).
  };

  // The segment's pid, descriptor, nonce and size into `request`.
  void DescribeSegment(v1::SharedSegment* request) const;
  // Every peer_timeout / 6: one Heartbeat to each server that holds the job.
  void HeartbeatLoop();

  // Constant after construction.
  const ParameterClientOptions options_;
  const std::vector<v1::VariableDef> vars_;
  const Placement placement_;
  const common::RetryPolicy retry_ = common::RetryPolicy::Transport();
  std::vector<std::unique_ptr<Server>> servers_;
  // Same host: null when not in use. Each variable's values and gradient,
  // by variable.
  std::unique_ptr<common::SharedSegment> segment_;
  std::vector<int64_t> value_at_, grad_at_;
  std::vector<int64_t> region_bytes_;  // each variable's room in a region, whole pages
  static constexpr int64_t kPageBytes = 4096;
  std::atomic<int64_t> bytes_in_place_{0};
  std::atomic<bool> values_released_{false};  // ReleaseSegmentMemory was called
  std::atomic<int64_t> bytes_pushed_in_place_{0};

  absl::Mutex mu_;
  std::vector<Health> health_ ABSL_GUARDED_BY(mu_);
  absl::Notification stop_;
  std::thread heartbeats_;
};

}  // namespace towerps::worker::internal

#endif  // TOWERPS_WORKER_TRAIN_PS_PEERS_H_
