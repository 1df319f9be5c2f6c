// Fuzzes what a same-host call channel's reader and writer make of memory the
// other process wrote (common/shm_ring, common/shm_channel): the input is a
// ring's bytes (its header words and data, zero-padded), as a worker that
// writes garbage, or dies half way, could leave them.
// Invariants: Read and Write return OK, DeadlineExceeded (nothing waiting /
// no room; the deadline is already past, so nothing sleeps) or DataLoss,
// never touching memory outside the ring; a message read is at most
// max_message_bytes; a message's header decodes or is DataLoss; after
// DataLoss the next call says DataLoss too (nothing was consumed on a bad
// read); a Write into a ring that took it reads back whole.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "common/shm_channel.h"
#include "common/shm_ring.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using towerps::common::ShmRing;

constexpr int64_t kRingBytes = towerps::common::kShmRingHeaderBytes + 1024;

bool Allowed(const absl::Status& st) {
  return st.ok() || absl::IsDeadlineExceeded(st) || absl::IsDataLoss(st);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Its own allocation of exactly the ring's bytes, so that ASan sees any
  // access past it.
  std::unique_ptr<char, decltype(&std::free)> memory(
      static_cast<char*>(std::aligned_alloc(64, kRingBytes)), &std::free);
  std::memset(memory.get(), 0, kRingBytes);
  std::memcpy(memory.get(), data, std::min<size_t>(size, kRingBytes));
  ShmRing ring(memory.get(), kRingBytes);
  const absl::Time past = absl::InfinitePast();
  std::string msg;
  bool drained = false;  // read to the end with no DataLoss
  for (int i = 0; i < 64; ++i) {
    absl::Status st = ring.Read(&msg, past);
    FUZZ_CHECK(Allowed(st), "read: %s", st.ToString().c_str());
    if (absl::IsDataLoss(st)) {
      absl::Status again = ring.Read(&msg, past);
      FUZZ_CHECK(absl::IsDataLoss(again), "read after DataLoss: %s", again.ToString().c_str());
      break;
    }
    if (!st.ok()) {
      drained = true;
      break;
    }
    FUZZ_CHECK(static_cast<int64_t>(msg.size()) <= ring.max_message_bytes(),
               "a message of %zu bytes", msg.size());
    absl::string_view payload;
    auto h = towerps::common::DecodeShmCallHeader(msg, &payload);
    FUZZ_CHECK(h.ok() || absl::IsDataLoss(h.status()), "header: %s",
               h.status().ToString().c_str());
  }
  // The writer's side of the same memory: a message goes in, or there is no
  // room, or the positions are wrong. (After DataLoss the ring is broken: a
  // message half written by garbage may take in what comes next.)
  const std::string probe = "probe-message";
  absl::Status w = ring.Write({probe}, past);
  FUZZ_CHECK(Allowed(w), "write: %s", w.ToString().c_str());
  if (w.ok() && drained) {
    absl::Status st = ring.Read(&msg, past);
    FUZZ_CHECK(st.ok() && msg == probe, "the probe came back as %s \"%s\"",
               st.ToString().c_str(), msg.c_str());
    st = ring.Read(&msg, past);
    FUZZ_CHECK(absl::IsDeadlineExceeded(st), "after the probe: %s", st.ToString().c_str());
  }
  return 0;
}
