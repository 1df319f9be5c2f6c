#include "common/shm_channel.h"

#include <cstring>
#include <string>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"

namespace towerps::common {

static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<uint64_t>) == sizeof(uint64_t));

// Byte 0 kind, 1 method, 2 last, 3 zero, 4-7 status code, 8-15 call id,
// 16-23 timeout (little endian).
std::string EncodeShmCallHeader(const ShmCallHeader& h) {
  std::string out(kShmCallHeaderBytes, '\0');
  out[0] = static_cast<char>(h.kind);
  out[1] = static_cast<char>(h.method);
  out[2] = h.last ? 1 : 0;
  absl::little_endian::Store32(out.data() + 4, h.status_code);
  absl::little_endian::Store64(out.data() + 8, h.call_id);
  absl::little_endian::Store64(out.data() + 16, static_cast<uint64_t>(h.timeout_us));
  return out;
}

absl::StatusOr<ShmCallHeader> DecodeShmCallHeader(absl::string_view message,
                                                  absl::string_view* payload) {
  if (message.size() < kShmCallHeaderBytes) {
    return absl::DataLossError(
        absl::StrCat("shm channel: a message of ", message.size(), " bytes has no header"));
  }
  ShmCallHeader h;
  const uint8_t kind = static_cast<uint8_t>(message[0]);
  const uint8_t method = static_cast<uint8_t>(message[1]);
  const uint8_t last = static_cast<uint8_t>(message[2]);
  if (kind < 1 || kind > 3) {
    return absl::DataLossError(absl::StrCat("shm channel: message kind ", kind));
  }
  if (kind == static_cast<uint8_t>(ShmCallKind::kOpen) && (method < 1 || method > 2)) {
    return absl::DataLossError(absl::StrCat("shm channel: method ", method));
  }
  if (last > 1) return absl::DataLossError(absl::StrCat("shm channel: last flag ", last));
  h.kind = static_cast<ShmCallKind>(kind);
  h.method = method == 1 ? ShmMethod::kPush : ShmMethod::kPull;
  h.last = last == 1;
  h.status_code = absl::little_endian::Load32(message.data() + 4);
  if (h.status_code > 16) {
    return absl::DataLossError(absl::StrCat("shm channel: status code ", h.status_code));
  }
  h.call_id = absl::little_endian::Load64(message.data() + 8);
  h.timeout_us = static_cast<int64_t>(absl::little_endian::Load64(message.data() + 16));
  *payload = message.substr(kShmCallHeaderBytes);
  return h;
}

ShmChannelView::ShmChannelView(char* base) : base_(base) {}

void ShmChannelView::Reset() {
  // Atomically: a worker may look at the words meanwhile (not at the rings).
  for (int64_t at = 0; at < kShmChannelControlBytes; at += 8) {
    Word(at).store(0, std::memory_order_relaxed);
  }
  ShmRing::Init(base_ + kShmChannelControlBytes, kShmChannelRingBytes);
  ShmRing::Init(base_ + kShmChannelControlBytes + kShmChannelRingBytes, kShmChannelRingBytes);
}

}  // namespace towerps::common
