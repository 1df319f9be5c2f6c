// A one-way queue of messages in shared memory: one writer and one reader,
// which may be threads of one process or two processes that map the same
// memory (a worker's shared segment, common/shared_segment.h, which a server
// maps too). A waiting side sleeps on a futex word in the memory itself, so
// a message costs a copy and, only when the reader sleeps, one wake-up: no
// socket, no poller thread, no HTTP/2 framing.
//
// Each side treats the memory as written by a party it does not trust: the
// positions and lengths it reads there are checked before use, so that
// whatever the other process writes (or a crash leaves half written) gives
// DataLoss, never an access outside the ring or an endless loop.
//
// Layout of a ring of `bytes` bytes at `memory` (64-byte aligned):
//   [0, 64)    the writer's words: bytes written so far (uint64), a futex
//              word bumped after each message, "the writer sleeps" flag;
//   [64, 128)  the reader's words: the same for what it has read;
//   [128, bytes) the data: each message is its length (uint32, little
//              endian) and its bytes, padded to 8 bytes; a message that would
//              pass the end of the data starts at its beginning instead (the
//              tail is skipped, marked by a length of 0xffffffff when 4 bytes
//              or more are left).
//
// Thread-compatible per side: one thread at a time writes, one at a time
// reads (each may be a different thread each time).
#ifndef TOWERPS_COMMON_SHM_RING_H_
#define TOWERPS_COMMON_SHM_RING_H_

#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace towerps::common {

inline constexpr int64_t kShmRingHeaderBytes = 128;

class ShmRing {
 public:
  // Makes `bytes` bytes at `memory` an empty ring. Called by the memory's
  // owner before either side uses it (and never while one does).
  // REQUIRES: memory 64-byte aligned; bytes a multiple of 64, at least
  // kShmRingHeaderBytes + 64.
  static void Init(char* memory, int64_t bytes);

  // A view of the ring at `memory` (not owned; it must outlive this).
  // REQUIRES: as for Init; Init was called on this memory once.
  ShmRing(char* memory, int64_t bytes);

  // The longest message Write accepts.
  int64_t max_message_bytes() const;

  // Appends one message, the concatenation of `parts`. Waits (on the futex)
  // for room until `deadline`: DeadlineExceeded when there is none by then
  // (the reader is gone or slow; nothing was written). InvalidArgument when
  // longer than max_message_bytes(); DataLoss when the reader's position in
  // the memory cannot be right.
  absl::Status Write(std::initializer_list<absl::string_view> parts, absl::Time deadline);

  // Takes the next message into *out. Waits (on the futex) until `deadline`:
  // DeadlineExceeded when none came by then. DataLoss when the positions or
  // a length in the memory cannot be right.
  absl::Status Read(std::string* out, absl::Time deadline);

  // Whether a message is waiting to be read (no wait).
  bool HasMessage() const;

  // Wakes whoever sleeps on this ring (either side, any process): each
  // waiting Write or Read looks at the ring again and goes back to sleep if
  // nothing changed. For stopping: with short deadlines a caller looks at
  // its own conditions between waits anyway.
  void WakeAll();

 private:
  char* const memory_;
  const int64_t capacity_;  // bytes of data: bytes - kShmRingHeaderBytes
};

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_SHM_RING_H_
