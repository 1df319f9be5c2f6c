// The worker's side of a same-host call channel (common/shm_channel.h): one
// channel in this worker's segment, for its Push (or Pull) calls to one
// server, one call at a time.
//
// The channel is set up through gRPC: while it is not Ready, each gRPC call
// to that server names it (Offer, a new generation each time); a server that
// can serves it from then on (ps/shm_calls.h) and says so in the channel.
// Once Ready, calls go through it. Whatever goes wrong with the channel
// itself (the server stopped answering, broke the protocol, the call ran past
// its deadline) ends the call as kBroken and gives the channel up: the caller
// makes the same call again over gRPC, which offers the channel afresh.
//
// Thread-compatible: one thread at a time (the server's push or pull
// executor) uses it; Wake may be called from any thread.
#ifndef TOWERPS_WORKER_TRAIN_SHM_CALL_CLIENT_H_
#define TOWERPS_WORKER_TRAIN_SHM_CALL_CLIENT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/shm_channel.h"
#include "proto/ps.pb.h"

namespace towerps::worker::internal {

class ShmCallClient {
 public:
  // The channel at byte `offset` of the segment whose memory is `base`.
  // REQUIRES: kShmChannelBytes there, 64-byte aligned, zeroed.
  ShmCallClient(char* base, int64_t offset);

  // Whether calls go through the channel now: the server serves the
  // generation offered last.
  bool Ready();
  // Names the channel, with a new generation, in a gRPC call's segment.
  void Offer(v1::SharedSegment* segment);

  // --- One call. ---
  enum class Got { kMessage, kStatus, kBroken };
  // Starts call of `method` with its first message (`last`: its only one),
  // to be answered within `timeout`. false: the channel broke (kBroken).
  bool Start(common::ShmMethod method, absl::Duration timeout, absl::string_view first, bool last);
  // The call's next message; false: the channel broke.
  bool Send(absl::string_view message, bool last);
  // Waits for the server's next message of the call: kMessage (its bytes in
  // *message), kStatus (the call's status in *status; the call is over), or
  // kBroken (the channel broke: *status says how; it was given up).
  // `cancelled`: looked at between waits, and after Wake; when it returns
  // true the call ends as kBroken with Cancelled.
  Got Receive(std::string* message, absl::Status* status, const std::function<bool()>& cancelled);
  // Wakes a Receive or Send waiting on the channel (from any thread).
  void Wake();
  // Gives the channel up (the call under way is abandoned): the next gRPC
  // call offers it afresh.
  void GiveUp();

  // True the first time only (for a caller that logs the first use).
  bool FirstUse() { return !std::exchange(used_, true); }

  // A server that does not bump the heartbeat this long while a call waits
  // is taken as gone. Default: 2 s. A server process that exited is taken
  // as gone at once (its pid, from the channel, watched through a pidfd).
  void set_server_silence(absl::Duration d) { server_silence_ = d; }

  ShmCallClient(const ShmCallClient&) = delete;
  ShmCallClient& operator=(const ShmCallClient&) = delete;
  ~ShmCallClient();

 private:
  // Watches the process serving generation offered_ (server_pid), once.
  void WatchServer();
  // Whether the watched server process has exited.
  bool ServerExited() const;
  common::ShmChannelView view_;
  const int64_t offset_;
  uint64_t offered_ = 0;  // the generation offered last (0: none yet)
  bool given_up_ = false;
  bool used_ = false;
  uint64_t call_id_ = 0;  // the current (or last) call's
  absl::Time deadline_;   // the current call's
  absl::Duration server_silence_ = absl::Seconds(2);
  int server_pidfd_ = -1;   // the serving process (-1: none watched)
  uint64_t watched_ = 0;    // the generation whose server it watches
};

}  // namespace towerps::worker::internal

#endif  // TOWERPS_WORKER_TRAIN_SHM_CALL_CLIENT_H_
