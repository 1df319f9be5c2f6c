// The streams' common part (ps_streams.h): one call per server on the
// server's executor, a token that abandons them all, the servers' outcomes,
// and a same-host call's answers through shared memory. Private to
// :ps_client; internal.
#ifndef TOWERPS_WORKER_TRAIN_PS_STREAM_BASE_H_
#define TOWERPS_WORKER_TRAIN_PS_STREAM_BASE_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/cancellation.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "worker/train/ps_peers.h"
#include "worker/train/shm_call_client.h"

namespace towerps::worker::internal {

// A same-host call's status, worded as common::FromGrpcStatus words a gRPC
// call's.
inline absl::Status FromShmStatus(const absl::Status& st, const std::string& call) {
  return common::FromGrpcStatus(
      grpc::Status(static_cast<grpc::StatusCode>(st.code()), std::string(st.message())), call);
}

// What both streams share: one call per server on the server's executor,
// a token that abandons them all (the destructor, or the job's cancellation
// through options.cancel), and the servers' outcomes.
class StreamBase {
 public:
  explicit StreamBase(PsPeers& peers)
      : peers_(peers),
        results_(peers.size()),
        running_(peers.size()),
        chain_(peers.options().cancel, [this] {
          Abandon(peers_.options().cancel->Check().message());
        }) {}

 protected:
  // Cancels every call under way and wakes every wait; idempotent.
  void Abandon(absl::string_view reason) ABSL_LOCKS_EXCLUDED(mu_) {
    abandon_.Cancel(reason);
    absl::MutexLock lock(&mu_);
    cv_.SignalAll();
  }
  // For the destructors: abandons what is left and waits for every call to
  // return (they touch this object).
  void AbandonAndJoin() ABSL_LOCKS_EXCLUDED(mu_) {
    Abandon("the stream was abandoned");
    absl::MutexLock lock(&mu_);
    while (running_ > 0) cv_.Wait(&mu_);
  }
  void Done(int s, absl::Status st) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    results_[s] = std::move(st);
    if (!results_[s].ok()) failed_ = true;
    --running_;
    cv_.SignalAll();
  }
  // The answers of a same-host call of `method` ("Pull", "Push") to server
  // `s` through `channel`, each given to `take`, until the call's status,
  // returned worded as FromGrpcStatus words a gRPC call's. When the channel
  // broke (or `take` refused an answer: the channel is given up), sets
  // *broke and says how: the caller makes the call again over gRPC.
  absl::Status ReceiveShm(ShmCallClient* channel, int s, const char* method,
                          const std::function<absl::Status(const std::string&)>& take,
                          bool* broke) {
    if (channel->FirstUse()) {
      TLOG(INFO) << "worker " << peers_.options().worker_task << ": " << method
                 << " calls to " << peers_.ServerName(s)
                 << " go through shared memory (no gRPC call per step)";
    }
    const common::ScopedCancellationCallback wake(&abandon_, [channel] { channel->Wake(); });
    std::string bytes;
    absl::Status st;
    while (true) {
      switch (channel->Receive(&bytes, &st, [this] { return abandon_.cancelled(); })) {
        case ShmCallClient::Got::kMessage:
          st = take(bytes);
          if (st.ok()) continue;
          channel->GiveUp();
          *broke = true;
          return st;
        case ShmCallClient::Got::kBroken:
          *broke = true;
          return st;
        case ShmCallClient::Got::kStatus:
          return FromShmStatus(st, peers_.Call(method, s));
      }
    }
  }

  absl::Status WaitAll() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    while (running_ > 0) cv_.Wait(&mu_);
    return peers_.Combine(results_);
  }

  PsPeers& peers_;
  // Cancelled to abandon the calls: what their retries wait on, and what
  // cancels each call's context.
  common::CancellationToken abandon_;
  mutable absl::Mutex mu_;
  absl::CondVar cv_;  // Signalled whenever anything below changes.
  std::vector<absl::Status> results_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_);
  bool failed_ ABSL_GUARDED_BY(mu_) = false;

 private:
  // The job's cancellation abandons the stream. Last: removed first.
  common::ScopedCancellationCallback chain_;
};

}  // namespace towerps::worker::internal

#endif  // TOWERPS_WORKER_TRAIN_PS_STREAM_BASE_H_
