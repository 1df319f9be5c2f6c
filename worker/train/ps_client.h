// The worker's view of the parameter servers: one object that registers a
// job's variables on their ps tasks (by the placement plan), pushes gradients
// and pulls weights, fanning out to every ps in parallel.
//
// Thread-compatible: one training loop drives one client, with at most one
// pull and one push under way at a time (they may overlap each other and the
// loop's compute: StartPull/StartPush return streams that the servers'
// answers fill and drain in the background). Buffers passed to Pull/Push are
// used only during the call; those given to a stream, until it finished or
// is destroyed.
//
// Liveness: from Register on, a background thread heartbeats every server
// that holds the job (every peer_timeout / 6), so that the servers know this
// worker is alive while it computes. A server unreachable (UNAVAILABLE, or a
// heartbeat timing out) for longer than peer_timeout, at start or mid-job,
// fails the next or current call with UNAVAILABLE naming the ps task, its
// address and the last transport error; a server that answers NOT_FOUND for
// the job, or a new incarnation, after it registered it (it restarted) fails
// it with NOT_FOUND "ps N at ADDR restarted and no longer holds job ...".
#ifndef TOWERPS_WORKER_TRAIN_PS_CLIENT_H_
#define TOWERPS_WORKER_TRAIN_PS_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "common/rpc_security.h"
#include "common/tensor.h"
#include "proto/job.pb.h"
#include "proto/ps.pb.h"
#include "proto/tensor.pb.h"
#include "worker/train/placement.h"

namespace towerps::worker {

struct ParameterClientOptions {
  std::vector<std::string> ps_addresses;  // REQUIRED: one per ps task.
  std::string job_id;                     // REQUIRED.
  int worker_task = 0;
  // Identifies this run of the worker; a restart must choose a new one.
  // Default 0: chosen at random.
  uint64_t incarnation = 0;
  int64_t chunk_bytes = 1 << 20;          // Payload per streamed message.
  // Offer servers on this host a shared memory segment to write pulls into
  // (common/shared_segment.h); a server that cannot use it streams them.
  bool shared_memory = true;
  // With shared memory: Push and Pull calls to a server that serves them
  // through channels in the segment go there (common/shm_channel.h), not
  // through gRPC; false: always gRPC calls.
  bool same_host_calls = true;
  absl::Duration rpc_timeout = absl::Seconds(60);   // Per attempt.
  // How long a Pull waits for its step (while logging) before giving up,
  // while every peer is alive. Default: 10 minutes.
  absl::Duration wait_timeout = absl::Minutes(10);
  // A server unreachable this long is lost: Register (waiting for servers
  // to come up), Pull and Push then fail. Default: 60 s.
  absl::Duration peer_timeout = absl::Seconds(60);
  int max_push_attempts = 5;
  // When a server creates the job, it restores its shard from this
  // checkpoint directory instead of initializing. Default: empty (initialize).
  std::string restore_from;
  // Cancelled by another thread to abandon waits, retries and calls in
  // flight: Register, Pull and Push then return CANCELLED at once. Not owned;
  // may be null.
  const common::CancellationToken* cancel = nullptr;
  // TLS and token of the channels. Default: plaintext, no token.
  std::shared_ptr<const common::RpcSecurity> security = common::RpcSecurity::Insecure();
  // Gradient compression of pushes (JobSpec.compression; see
  // gradient_compressor.h). Default: none, float32 as it always was.
  v1::GradientCompression compression;
};

struct PushResult {
  int applied = 0;    // servers that applied or counted the gradient
  int stale = 0;      // servers that dropped it as stale
  int duplicate = 0;  // servers that had it already
  int64_t global_step = 0;  // smallest step reported by the servers
};

// One pull under way (ParameterClient::StartPull): the servers' values
// arrive into the caller's weight buffers in the background, each server's
// in variable order, and the caller waits for each variable only when it
// needs it. Errors are those of ParameterClient::Pull.
//
// Thread-safe: Wait may be called from several threads at once. Destroying
// the stream before Finish returned cancels the calls still under way and
// waits for them to stop (the buffers' contents are then unspecified).
class PullStream {
 public:
  virtual ~PullStream() = default;
  // Blocks until every server has begun to answer; returns the smallest
  // global step they report (what Pull returns).
  virtual absl::StatusOr<int64_t> Step() = 0;
  // Blocks until weights [first, first + count) hold their pulled values;
  // they are not written again by this stream. An error of any server fails
  // it unless those variables were complete already.
  virtual absl::Status Wait(int first, int count) = 0;
  // Blocks until every variable arrived; returns the step (as Step()).
  virtual absl::StatusOr<int64_t> Finish() = 0;
  // After Finish: the longest any server held the pull for its step (the
  // sync barrier, the staleness bound, the push it comes after), retries
  // included.
  virtual absl::Duration server_wait() const = 0;
};

// One push under way (ParameterClient::StartPush): gradients go out as the
// caller announces them final, while it computes the rest. A server's call
// opens with the first of its variables and is retried whole (same sequence
// number, so it is applied at most once) on transport failures. Errors are
// those of ParameterClient::Push.
//
// Thread-safe: Send may be called from several threads at once. Destroying
// the stream before Finish returned cancels the calls under way (no server
// applies a push it did not receive whole) and waits for them to stop.
class PushStream {
 public:
  virtual ~PushStream() = default;
  // Gradients [first, first + count) are final: sent to their servers as
  // soon as the transport can (named, from the same host), except to a
  // same-host server that shares this worker's cores, which takes them all
  // at once, with the last (PushResponse.names_with_commit). They must stay unchanged until Finish
  // returned or the stream is destroyed. A variable announced twice is sent
  // once. With compression they are encoded here, once (every attempt sends
  // the same bytes): InvalidArgument for a NaN or Inf in them, and the push
  // is abandoned (nothing is applied).
  virtual absl::Status Send(int first, int count) = 0;
  // Blocks until every server answered. FailedPrecondition naming a
  // variable that was never sent (the push is abandoned then).
  virtual absl::StatusOr<PushResult> Finish() = 0;
};

class ParameterClient {
 public:
  virtual ~ParameterClient() = default;

  // Registers each server's variables; idempotent. Returns the smallest global
  // step across servers (0 for a new job). Waits (logging which server and
  // why every few seconds) for servers that are not up yet, at most
  // peer_timeout each; other errors fail at once. Starts the heartbeats.
  virtual absl::StatusOr<int64_t> Register(const v1::TrainingConfig& config) = 0;

  // Fills `weights` (in VariableDef order, shapes already set) from every
  // server once each has reached `min_step`; returns the smallest step seen.
  // `iteration` is this worker's next iteration (ASYNC staleness bound).
  // DeadlineExceeded after wait_timeout, naming the servers and workers awaited;
  // Aborted when a server gives up on a lost worker; Unavailable / NotFound
  // for a lost or restarted server (see Liveness above).
  absl::StatusOr<int64_t> Pull(int64_t min_step, int64_t iteration,
                               const std::vector<common::Tensor*>& weights);
  // Pull, returning at once: the values arrive while the caller goes on.
  // InvalidArgument for buffers that do not match the variables.
  virtual absl::StatusOr<std::unique_ptr<PullStream>> StartPull(
      int64_t min_step, int64_t iteration, const std::vector<common::Tensor*>& weights) = 0;
  // StartPull that each server also answers only once it has taken this
  // client's latest push (StartPush), so that the values include its
  // gradient. Started while that push still finishes (ASYNC), the wait for
  // the answer overlaps the push's last round trip. A push that fails leaves
  // the pull waiting (retried to wait_timeout): abandon it then.
  // FailedPrecondition if no push was started.
  virtual absl::StatusOr<std::unique_ptr<PullStream>> StartPullAfterPush(
      int64_t min_step, int64_t iteration, const std::vector<common::Tensor*>& weights) = 0;

  // Pushes one mean gradient per variable (VariableDef order) computed on
  // weights of `step` from `num_examples` examples. Retries transport
  // failures with the same sequence number, so it is applied at most once.
  // With compression, the gradient is encoded once and every attempt sends
  // the same bytes; InvalidArgument for a NaN or Inf in it (nothing sent).
  absl::StatusOr<PushResult> Push(int64_t step, int64_t num_examples,
                                  const std::vector<const common::Tensor*>& grads);
  // Push, with the gradients announced one by one (PushStream::Send) as the
  // caller finishes them. InvalidArgument for buffers that do not match.
  virtual absl::StatusOr<std::unique_ptr<PushStream>> StartPush(
      int64_t step, int64_t num_examples, const std::vector<const common::Tensor*>& grads) = 0;

  // Of the last successful Pull: the longest any server made it wait for its
  // step (the sync barrier, the staleness bound), retries included.
  absl::Duration last_pull_wait() const { return last_pull_wait_; }

  virtual v1::StatusResponse Status(int ps_task) = 0;
  virtual const Placement& placement() const = 0;
  // Bytes of pulled values that servers on this host wrote straight into
  // this client's shared memory (ParameterClientOptions.shared_memory),
  // since it was made.
  virtual int64_t bytes_pulled_in_place() const { return 0; }
  // Bytes of gradients such servers read from there (once each server has
  // written a pull in place), since it was made.
  virtual int64_t bytes_pushed_in_place() const { return 0; }
  // Same host: where variable `var`'s pulled values and pushed gradient lie
  // in this client's shared memory (its elements, whole, valid as long as
  // the client), or null without it. The caller's weight and gradient
  // tensors may live there (Model::PlaceHostTensors): pulls written in
  // place and pushes read from there then copy nothing on this side. Such
  // a tensor must not be written while a pull is under way, nor a gradient
  // changed while its push is, nor after it until the next pull has every
  // variable: a server's update reads the gradient there after answering
  // the push (ps/gradient_part.h), and the next step's
  // weights are what it publishes. Nor may a weight be read from when its
  // gradient is pushed until the next pull has it: a server writes the
  // new values there too as it forms them (during the push, or in the
  // update where that pull waits), so that the pull need not
  // (SharedSegment.value_offsets); until that pull, after a push that
  // failed, they are undefined.
  virtual float* SharedValues(int /*var*/) { return nullptr; }
  virtual float* SharedGradients(int /*var*/) { return nullptr; }
  // Gives the pulled values' memory of variable `var` back to the system
  // once the caller moved its tensors out (the contents are lost); the
  // pushed gradient's stays as long as the client (a server may still read
  // the last push there). Later pulls land in the segment's landing region
  // and are copied out of it (a server may hold values it wrote into the
  // given-back memory as in place), and pushes no longer let a server write
  // there. Not while a push or pull is under way.
  virtual void ReleaseShared(int /*var*/) {}

 private:
  absl::Duration last_pull_wait_;
};

// Plans placement of `vars` over the servers and connects (lazily) to them.
absl::StatusOr<std::unique_ptr<ParameterClient>> NewGrpcParameterClient(
    ParameterClientOptions options, std::vector<v1::VariableDef> vars,
    v1::PlacementStrategy strategy);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_TRAIN_PS_CLIENT_H_
