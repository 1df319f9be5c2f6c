// The worker's view of the parameter servers: one object that registers a
// job's variables on their ps tasks (by the placement plan), pushes gradients
// and pulls weights, fanning out to every ps in parallel.
//
// Thread-compatible: one training loop drives one client. Buffers passed to
// Pull/Push are used only during the call.
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
  virtual absl::StatusOr<int64_t> Pull(int64_t min_step, int64_t iteration,
                                       const std::vector<common::Tensor*>& weights) = 0;

  // Pushes one mean gradient per variable (VariableDef order) computed on
  // weights of `step` from `num_examples` examples. Retries transport
  // failures with the same sequence number, so it is applied at most once.
  // With compression, the gradient is encoded once and every attempt sends
  // the same bytes; InvalidArgument for a NaN or Inf in it (nothing sent).
  virtual absl::StatusOr<PushResult> Push(
      int64_t step, int64_t num_examples,
      const std::vector<const common::Tensor*>& grads) = 0;

  // Of the last successful Pull: the longest any server made it wait for its
  // step (the sync barrier, the staleness bound), retries included.
  virtual absl::Duration last_pull_wait() const { return absl::ZeroDuration(); }

  virtual v1::StatusResponse Status(int ps_task) = 0;
  virtual const Placement& placement() const = 0;
};

// Plans placement of `vars` over the servers and connects (lazily) to them.
absl::StatusOr<std::unique_ptr<ParameterClient>> NewGrpcParameterClient(
    ParameterClientOptions options, std::vector<v1::VariableDef> vars,
    v1::PlacementStrategy strategy);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_TRAIN_PS_CLIENT_H_
