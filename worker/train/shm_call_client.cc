#include "worker/train/shm_call_client.h"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace towerps::worker::internal {

using common::ShmCallHeader;
using common::ShmCallKind;

namespace {

// How long one wait lasts before the caller's conditions are looked at again.
constexpr absl::Duration kWaitSlice = absl::Milliseconds(50);
// How long a message to the server may wait for room (the server reads each
// at once; a full ring means it has gone).
constexpr absl::Duration kWriteTimeout = absl::Seconds(2);

}  // namespace

ShmCallClient::ShmCallClient(char* base, int64_t offset)
    : view_(base + offset), offset_(offset) {}

bool ShmCallClient::Ready() {
  const bool ready = !given_up_ && offered_ != 0 &&
                     view_.served_generation().load(std::memory_order_acquire) == offered_;
  if (ready && watched_ != offered_) WatchServer();
  return ready;
}

ShmCallClient::~ShmCallClient() {
  if (server_pidfd_ >= 0) close(server_pidfd_);
}

void ShmCallClient::WatchServer() {
  watched_ = offered_;
  if (server_pidfd_ >= 0) close(server_pidfd_);
  server_pidfd_ = -1;
  // Written by the server before it served this generation (read after it).
  const uint64_t pid = view_.server_pid().load(std::memory_order_relaxed);
  if (pid == 0 || pid > static_cast<uint64_t>(std::numeric_limits<pid_t>::max())) return;
  // No pidfd (an old kernel, a sandbox): the heartbeat alone tells.
  const long fd = syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0);
  if (fd >= 0) server_pidfd_ = static_cast<int>(fd);
}

bool ShmCallClient::ServerExited() const {
  if (server_pidfd_ < 0) return false;
  pollfd p{server_pidfd_, POLLIN, 0};
  return poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
}

void ShmCallClient::Offer(v1::SharedSegment* segment) {
  ++offered_;
  given_up_ = false;
  segment->set_channel_offset(offset_);
  segment->set_channel_generation(offered_);
}

void ShmCallClient::GiveUp() { given_up_ = true; }

void ShmCallClient::Wake() {
  view_.to_worker().WakeAll();
  view_.to_server().WakeAll();
}

bool ShmCallClient::Start(common::ShmMethod method, absl::Duration timeout,
                          absl::string_view first, bool last) {
  common::ShmRing out = view_.to_server();
  if (static_cast<int64_t>(common::kShmCallHeaderBytes + first.size()) >
      out.max_message_bytes()) {
    return false;  // too long for the channel: this call goes over gRPC
  }
  ShmCallHeader h;
  h.kind = ShmCallKind::kOpen;
  h.method = method;
  h.last = last;
  h.call_id = ++call_id_;
  h.timeout_us = absl::ToInt64Microseconds(timeout);
  const absl::Time now = absl::Now();
  deadline_ = now + timeout;
  if (!out.Write({common::EncodeShmCallHeader(h), first}, std::min(deadline_, now + kWriteTimeout))
           .ok()) {
    GiveUp();
    return false;
  }
  return true;
}

bool ShmCallClient::Send(absl::string_view message, bool last) {
  ShmCallHeader h;
  h.kind = ShmCallKind::kData;
  h.last = last;
  h.call_id = call_id_;
  if (!view_.to_server()
           .Write({common::EncodeShmCallHeader(h), message},
                  std::min(deadline_, absl::Now() + kWriteTimeout))
           .ok()) {
    GiveUp();
    return false;
  }
  return true;
}

ShmCallClient::Got ShmCallClient::Receive(std::string* message, absl::Status* status,
                                          const std::function<bool()>& cancelled) {
  common::ShmRing in = view_.to_worker();
  uint64_t beat = view_.heartbeat().load(std::memory_order_acquire);
  absl::Time beat_seen = absl::Now();
  std::string raw;
  while (true) {
    if (cancelled()) {
      GiveUp();
      *status = absl::CancelledError("same-host call: abandoned");
      return Got::kStatus;
    }
    const absl::Time now = absl::Now();
    if (now >= deadline_) {
      GiveUp();  // the server may still be in the call
      *status = absl::DeadlineExceededError("same-host call: no answer by its deadline");
      return Got::kStatus;
    }
    if (view_.served_generation().load(std::memory_order_acquire) != offered_) {
      GiveUp();
      *status = absl::UnavailableError("same-host call: the server no longer serves the channel");
      return Got::kBroken;
    }
    absl::Status st = in.Read(&raw, std::min(deadline_, now + kWaitSlice));
    if (absl::IsDeadlineExceeded(st)) {
      if (ServerExited()) {
        GiveUp();
        *status = absl::UnavailableError("same-host call: the server process exited");
        return Got::kBroken;
      }
      const uint64_t b = view_.heartbeat().load(std::memory_order_acquire);
      if (b != beat) {
        beat = b;
        beat_seen = absl::Now();
      } else if (absl::Now() - beat_seen > server_silence_) {
        GiveUp();
        *status = absl::UnavailableError(absl::StrCat(
            "same-host call: the server stopped answering (no heartbeat for ",
            absl::FormatDuration(server_silence_), ")"));
        return Got::kBroken;
      }
      continue;
    }
    absl::string_view payload;
    absl::StatusOr<ShmCallHeader> h =
        st.ok() ? common::DecodeShmCallHeader(raw, &payload) : absl::StatusOr<ShmCallHeader>(st);
    if (!h.ok()) {
      GiveUp();
      *status = absl::DataLossError(absl::StrCat("same-host call: ", h.status().message()));
      return Got::kBroken;
    }
    if (h->call_id != call_id_) continue;  // late, of an abandoned call
    if (h->kind == ShmCallKind::kData) {
      message->assign(payload.data(), payload.size());
      return Got::kMessage;
    }
    if (h->kind == ShmCallKind::kStatus) {
      *status = absl::Status(static_cast<absl::StatusCode>(h->status_code), payload);
      return Got::kStatus;
    }
  }
}

}  // namespace towerps::worker::internal
