#include "ps/shm_calls.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/thread_name.h"
#include "grpcpp/support/slice.h"

namespace towerps::ps {

using common::ShmCallHeader;
using common::ShmCallKind;

namespace {

// How long one wait on a ring lasts before the waiter looks at its stop
// flag and its deadlines again.
constexpr absl::Duration kWaitSlice = absl::Milliseconds(100);
// How long a message to the worker may wait for room (the worker reads each
// at once; a full ring means it has gone).
constexpr absl::Duration kWriteTimeout = absl::Seconds(5);
// The longest call a worker may ask for.
constexpr int64_t kMaxTimeoutUs = int64_t{3600} * 1000 * 1000;
// Status messages longer than this are cut.
constexpr size_t kMaxStatusMessage = 4096;

// One call on a channel as a CallStream: the worker's messages of this call
// from the ring to the server, answers into the ring to the worker.
class ChannelCallStream final : public CallStream {
 public:
  ChannelCallStream(common::ShmRing in, common::ShmRing out, const ShmCallHeader& open,
                    absl::string_view first, const std::atomic<bool>* stop)
      : in_(in),
        out_(out),
        call_id_(open.call_id),
        deadline_(absl::Now() +
                  absl::Microseconds(std::clamp<int64_t>(open.timeout_us, 0, kMaxTimeoutUs))),
        stop_(stop),
        first_(std::string(first)),
        last_seen_(open.last) {}

  bool Read(grpc::ByteBuffer* message) override {
    if (first_.has_value()) {
      ToBuffer(*first_, message);
      first_.reset();
      return true;
    }
    if (last_seen_ || broken_) return false;
    std::string raw;
    while (true) {
      if (stop_->load()) return Break(false);
      const absl::Time now = absl::Now();
      if (now >= deadline_) return false;  // the worker gave up on the call
      absl::Status st = in_.Read(&raw, std::min(deadline_, now + kWaitSlice));
      if (absl::IsDeadlineExceeded(st)) continue;
      if (!st.ok()) return Break(true, st.message());
      absl::string_view payload;
      absl::StatusOr<ShmCallHeader> h = common::DecodeShmCallHeader(raw, &payload);
      if (!h.ok()) return Break(true, h.status().message());
      if (h->kind == ShmCallKind::kOpen) {
        // The worker abandoned this call and started the next one.
        next_open_ = std::move(raw);
        return Break(false);
      }
      if (h->call_id != call_id_ || h->kind != ShmCallKind::kData) continue;  // late
      ToBuffer(payload, message);
      last_seen_ = h->last;
      return true;
    }
  }

  bool Write(const grpc::ByteBuffer& message, grpc::WriteOptions) override {
    if (broken_ || stop_->load()) return false;
    std::vector<grpc::Slice> slices;
    if (!message.Dump(&slices).ok()) return Break(false);
    std::string payload;
    for (const grpc::Slice& s : slices) {
      payload.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    ShmCallHeader h;
    h.kind = ShmCallKind::kData;
    h.call_id = call_id_;
    absl::Status st = out_.Write({common::EncodeShmCallHeader(h), payload},
                                 absl::Now() + kWriteTimeout);
    if (st.ok()) return true;
    // A message too long for the ring (slices, where the segment could not
    // be used) closes the channel, so that the worker, which waits for an
    // answer, makes the call again over gRPC.
    return Break(absl::IsInvalidArgument(st), st.message());
  }

  absl::Time deadline() const override { return deadline_; }
  bool IsCancelled() override { return broken_ || stop_->load(); }

  bool broken() const { return broken_; }
  // Why the channel cannot go on (what the worker wrote cannot be right);
  // empty when it can.
  const std::string& fatal() const { return fatal_; }
  std::optional<std::string> TakeNextOpen() { return std::exchange(next_open_, std::nullopt); }

 private:
  static void ToBuffer(absl::string_view bytes, grpc::ByteBuffer* out) {
    grpc::Slice slice(bytes.data(), bytes.size());
    *out = grpc::ByteBuffer(&slice, 1);
  }
  // Always false (for `return Break(...)`).
  bool Break(bool fatal, absl::string_view why = "") {
    broken_ = true;
    if (fatal) fatal_ = std::string(why);
    return false;
  }

  common::ShmRing in_, out_;
  const uint64_t call_id_;
  const absl::Time deadline_;
  const std::atomic<bool>* const stop_;
  std::optional<std::string> first_;  // the open's payload, not read yet
  bool last_seen_;
  bool broken_ = false;
  std::string fatal_;
  std::optional<std::string> next_open_;
};

}  // namespace

struct ShmCallServer::Channel {
  Channel(std::shared_ptr<common::SegmentFile> f, char* base, uint64_t g)
      : file(std::move(f)), view(base), generation(g) {}
  const std::shared_ptr<common::SegmentFile> file;  // keeps the mapping
  common::ShmChannelView view;
  const uint64_t generation;
  std::atomic<bool> stop{false};
  std::atomic<bool> done{false};  // its thread has returned
  std::thread thread;
};

ShmCallServer::ShmCallServer(Handler handler, absl::Duration idle_exit)
    : handler_(std::move(handler)), idle_exit_(idle_exit) {
  ticker_ = std::thread([this] {
    common::SetCurrentThreadName("shm heartbeat");
    while (!stop_.WaitForNotificationWithTimeout(absl::Milliseconds(50))) Tick();
  });
}

ShmCallServer::~ShmCallServer() {
  stop_.Notify();
  ticker_.join();
  StopServing();
}

void ShmCallServer::StopServing() {
  absl::MutexLock attach(&attach_mu_);
  std::map<std::pair<std::string, int64_t>, std::unique_ptr<Channel>> all;
  {
    absl::MutexLock lock(&mu_);
    all.swap(channels_);
  }
  for (auto& [key, c] : all) {
    c->stop.store(true);
    c->view.to_server().WakeAll();
  }
  for (auto& [key, c] : all) c->thread.join();
}

void ShmCallServer::Tick() {
  std::vector<std::unique_ptr<Channel>> finished;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = channels_.begin(); it != channels_.end();) {
      if (it->second->done.load()) {
        finished.push_back(std::move(it->second));
        it = channels_.erase(it);
        continue;
      }
      it->second->view.heartbeat().fetch_add(1, std::memory_order_release);
      ++it;
    }
  }
  for (auto& c : finished) c->thread.join();  // returned already
}

int ShmCallServer::serving() {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [key, c] : channels_) n += c->done.load() ? 0 : 1;
  return n;
}

absl::Status ShmCallServer::Attach(std::shared_ptr<common::SegmentFile> file,
                                   const std::string& key, int64_t offset, uint64_t generation) {
  if (generation == 0) return absl::InvalidArgumentError("shm channel: generation 0");
  if (offset % 64 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm channel: offset ", offset, " is not 64-byte aligned"));
  }
  TOWERPS_ASSIGN_OR_RETURN(char* base, file->Region(offset, common::kShmChannelBytes));
  absl::MutexLock attach(&attach_mu_);
  std::unique_ptr<Channel> old;
  {
    absl::MutexLock lock(&mu_);
    auto it = channels_.find({key, offset});
    if (it != channels_.end()) {
      if (it->second->generation == generation && !it->second->done.load()) {
        return absl::OkStatus();
      }
      if (it->second->generation > generation) {  // a late call's offer
        return absl::FailedPreconditionError(
            absl::StrCat("shm channel: generation ", generation, " is older than ",
                         it->second->generation));
      }
      old = std::move(it->second);
      channels_.erase(it);
    }
  }
  if (old != nullptr) {  // the worker gave up on it: its thread goes first
    old->stop.store(true);
    old->view.to_server().WakeAll();
    old->thread.join();
  }
  auto c = std::make_unique<Channel>(std::move(file), base, generation);
  c->view.Reset();
  c->view.server_pid().store(static_cast<uint64_t>(getpid()), std::memory_order_relaxed);
  c->view.served_generation().store(generation, std::memory_order_release);
  Channel* raw = c.get();
  raw->thread = std::thread([this, raw] { Serve(raw); });
  absl::MutexLock lock(&mu_);
  channels_[{key, offset}] = std::move(c);
  return absl::OkStatus();
}

void ShmCallServer::Serve(Channel* c) {
  common::SetCurrentThreadName("shm calls");
  common::ShmRing in = c->view.to_server();
  common::ShmRing out = c->view.to_worker();
  absl::Time last_call = absl::Now();
  std::optional<std::string> pending;  // an open that ended the call before it
  std::string raw;
  std::string why;  // why the channel stopped early, for the log
  while (!c->stop.load()) {
    if (pending.has_value()) {
      raw = *std::move(pending);
      pending.reset();
    } else {
      absl::Status st = in.Read(&raw, absl::Now() + kWaitSlice);
      if (absl::IsDeadlineExceeded(st)) {
        if (absl::Now() - last_call > idle_exit_) break;
        continue;
      }
      if (!st.ok()) {
        why = std::string(st.message());
        break;
      }
    }
    absl::string_view payload;
    absl::StatusOr<ShmCallHeader> h = common::DecodeShmCallHeader(raw, &payload);
    if (!h.ok()) {
      why = std::string(h.status().message());
      break;
    }
    if (h->kind != ShmCallKind::kOpen) continue;  // late, of an abandoned call
    ChannelCallStream stream(in, out, *h, payload, &c->stop);
    const grpc::Status s = handler_(h->method, &stream);
    calls_served_.fetch_add(1, std::memory_order_relaxed);
    last_call = absl::Now();
    pending = stream.TakeNextOpen();
    if (!stream.fatal().empty()) {
      why = stream.fatal();
      break;
    }
    // No status when the worker is not waiting for it, or when the server
    // stops serving the channel: the worker then makes the call over gRPC.
    if (stream.broken() || c->stop.load()) continue;
    ShmCallHeader end;
    end.kind = ShmCallKind::kStatus;
    end.call_id = h->call_id;
    end.status_code = static_cast<uint32_t>(s.error_code());
    const std::string message = s.error_message().substr(0, kMaxStatusMessage);
    if (!out.Write({common::EncodeShmCallHeader(end), message}, absl::Now() + kWriteTimeout)
             .ok()) {
      why = "the worker does not read its answers";
      break;
    }
  }
  if (!why.empty()) TLOG(WARNING) << "same-host channel closed: " << why;
  uint64_t mine = c->generation;
  c->view.served_generation().compare_exchange_strong(mine, 0);
  c->done.store(true);
}

}  // namespace towerps::ps
