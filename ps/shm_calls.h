// The server's side of same-host calls (common/shm_channel.h): a worker on
// this host gets its Push and Pull calls served through channels in its own
// shared segment, with no gRPC call, socket write or poller wake-up per
// message. A gRPC Push or Pull whose segment names a channel sets it up
// (Attach); from then on one thread here serves that channel, one call at a
// time, with the very handlers gRPC calls use (the handler given).
//
// A channel's thread ends when the server stops, when the same channel is
// set up again (the worker gave up on it and asked afresh, with a later
// generation), after idle_exit with no call (the worker has gone, or waits
// on something else: its next call goes over gRPC and sets the channel up
// again), or when what the worker wrote cannot be right. It then marks the
// channel as served by no one. While a channel is served, a ticker thread
// bumps its heartbeat every 50 ms, so that a worker waiting on a server that
// died stops waiting (and goes back to gRPC) within a second or so.
//
// Thread-safe.
#ifndef TOWERPS_PS_SHM_CALLS_H_
#define TOWERPS_PS_SHM_CALLS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/shared_segment.h"
#include "common/shm_channel.h"
#include "grpcpp/support/status.h"
#include "ps/call_stream.h"

namespace towerps::ps {

class ShmCallServer {
 public:
  // Serves one call: what ps_service does with a gRPC call's stream.
  using Handler = std::function<grpc::Status(common::ShmMethod, CallStream*)>;

  // Default idle_exit: 15 s.
  explicit ShmCallServer(Handler handler, absl::Duration idle_exit = absl::Seconds(15));
  // Stops every channel (a call under way ends as cancelled) and joins
  // their threads.
  ~ShmCallServer();
  ShmCallServer(const ShmCallServer&) = delete;
  ShmCallServer& operator=(const ShmCallServer&) = delete;

  // Serves the channel at byte `offset` of `file` (the segment `key`, its
  // nonce, names) as `generation`: at once if it is served as that
  // already; else after stopping whatever served it before, resetting it
  // and marking it served as `generation`. InvalidArgument when the channel
  // does not fit the segment, is not 64-byte aligned, or the generation is 0;
  // FailedPrecondition for a generation older than the one served (a late
  // call's).
  absl::Status Attach(std::shared_ptr<common::SegmentFile> file, const std::string& key,
                      int64_t offset, uint64_t generation) ABSL_LOCKS_EXCLUDED(attach_mu_, mu_);

  // Stops serving every channel now (a call under way ends as cancelled,
  // unanswered: its worker makes it again over gRPC). Channels set up
  // afterwards are served again. For a server that shuts down.
  void StopServing() ABSL_LOCKS_EXCLUDED(attach_mu_, mu_);

  // Channels served now.
  int serving() ABSL_LOCKS_EXCLUDED(mu_);
  // Calls served through channels since construction.
  int64_t calls_served() const { return calls_served_.load(std::memory_order_relaxed); }

 private:
  struct Channel;
  void Serve(Channel* c);
  void Tick();

  const Handler handler_;
  const absl::Duration idle_exit_;
  absl::Mutex attach_mu_;  // one Attach at a time (it may join a thread)
  absl::Mutex mu_;
  std::map<std::pair<std::string, int64_t>, std::unique_ptr<Channel>> channels_
      ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> calls_served_{0};
  absl::Notification stop_;
  std::thread ticker_;
};

}  // namespace towerps::ps

#endif  // TOWERPS_PS_SHM_CALLS_H_
