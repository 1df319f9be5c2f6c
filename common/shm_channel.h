// A same-host call channel: a worker's Push or Pull calls to one server go
// through the worker's shared segment (common/shared_segment.h) instead of
// gRPC, one call at a time, with the very messages gRPC would carry (the
// tensors themselves are in the segment already; the messages only name
// them). gRPC stays the path that sets a channel up, and the path for every
// call a channel cannot take.
//
// A channel is kShmChannelBytes of the segment: control words, then a ring to
// the server and a ring to the worker (common/shm_ring.h). The server writes
// the control words; neither side trusts what the other writes.
//
// Each ring message is a ShmCallHeader (24 bytes) and a payload:
//   worker -> server: kOpen (starts call `call_id` of `method`, with its
//     timeout; the payload is its first message), kData (the next message);
//     `last` on the call's last message (the end of its requests);
//   server -> worker: kData (a response message), then kStatus (the call's
//     status: code, and the message as payload).
// A message of a call other than the current one (an abandoned call's,
// late) is skipped by either side.
#ifndef TOWERPS_COMMON_SHM_CHANNEL_H_
#define TOWERPS_COMMON_SHM_CHANNEL_H_

#include <atomic>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/shm_ring.h"

namespace towerps::common {

inline constexpr int64_t kShmChannelBytes = 64 * 1024;
inline constexpr int64_t kShmChannelControlBytes = 128;
inline constexpr int64_t kShmChannelRingBytes = (kShmChannelBytes - kShmChannelControlBytes) / 2;
static_assert(kShmChannelRingBytes % 64 == 0);

enum class ShmCallKind : uint8_t { kOpen = 1, kData = 2, kStatus = 3 };
enum class ShmMethod : uint8_t { kPush = 1, kPull = 2 };

struct ShmCallHeader {
  ShmCallKind kind = ShmCallKind::kData;
  ShmMethod method = ShmMethod::kPull;  // kOpen only
  bool last = false;
  uint32_t status_code = 0;  // kStatus only: an absl::StatusCode
  uint64_t call_id = 0;
  int64_t timeout_us = 0;  // kOpen only
};
inline constexpr size_t kShmCallHeaderBytes = 24;

// The header's bytes, to go before the payload in one ring message.
std::string EncodeShmCallHeader(const ShmCallHeader& h);
// Splits a ring message into its header and *payload (a view into
// `message`). DataLoss naming what was wrong for a message too short or with
// a kind or method out of range.
absl::StatusOr<ShmCallHeader> DecodeShmCallHeader(absl::string_view message,
                                                  absl::string_view* payload);

// A view of the channel at `base` (kShmChannelBytes, 64-byte aligned, in a
// mapping that outlives the view).
class ShmChannelView {
 public:
  explicit ShmChannelView(char* base);

  // The generation the server serves now (0: none): the worker sets one up
  // through a gRPC call that names this channel and a generation, and uses
  // it once this word reads that generation.
  std::atomic<uint64_t>& served_generation() { return Word(0); }
  // Bumped by the server process every few tens of milliseconds while it
  // serves the channel: a worker waiting for an answer that sees it stand
  // still for long takes the server as gone.
  std::atomic<uint64_t>& heartbeat() { return Word(8); }
  // The serving process's pid, written before served_generation: a worker
  // watches that process (a pidfd) to notice at once that it exited, where
  // the heartbeat takes its silence limit to. Only a hint (a server in
  // another pid namespace writes a pid the worker cannot watch; the
  // heartbeat still counts).
  std::atomic<uint64_t>& server_pid() { return Word(16); }

  ShmRing to_server() { return ShmRing(base_ + kShmChannelControlBytes, kShmChannelRingBytes); }
  ShmRing to_worker() {
    return ShmRing(base_ + kShmChannelControlBytes + kShmChannelRingBytes, kShmChannelRingBytes);
  }

  // Empty rings and zeroed control words. Only while neither side uses
  // them (the server, before it starts serving a generation).
  void Reset();

 private:
  std::atomic<uint64_t>& Word(int64_t offset) {
    return *reinterpret_cast<std::atomic<uint64_t>*>(base_ + offset);
  }
  char* const base_;
};

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_SHM_CHANNEL_H_
