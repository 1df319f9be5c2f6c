#include "worker/train/ps_peers.h"

#include <sys/mman.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/rpc.h"
#include "common/status.h"
#include "common/thread_name.h"
#include "grpcpp/client_context.h"
#include "proto/ps_wire.h"

namespace towerps::worker::internal {

PsPeers::PsPeers(ParameterClientOptions options, std::vector<v1::VariableDef> vars,
                 Placement placement)
    : options_(std::move(options)), vars_(std::move(vars)), placement_(std::move(placement)) {
  const int n = static_cast<int>(options_.ps_addresses.size());
  for (int s = 0; s < n; ++s) {
    auto server = std::make_unique<Server>(s);
    server->channel = common::NewChannel(options_.ps_addresses[s], options_.security.get());
    server->stub = v1::ParameterService::NewStub(server->channel);
    server->push = std::make_unique<grpc::internal::RpcMethod>(
        v1::ps_wire::PushMethod(), grpc::internal::RpcMethod::CLIENT_STREAMING, server->channel);
    server->pull = std::make_unique<grpc::internal::RpcMethod>(
        v1::ps_wire::PullMethod(), grpc::internal::RpcMethod::SERVER_STREAMING, server->channel);
    server->parts = placement_.PartsOn(s);
    servers_.push_back(std::move(server));
  }
  health_.resize(n);
  if (!options_.shared_memory) return;
  // One segment for the whole model, offered to every server that holds a
  // part of it: each variable whole, in pages of its own (given back on
  // their own: ReleaseSegmentMemory), the pulled values, the pushed
  // gradients (a push and the next pull overlap), then where retried pulls
  // land (pages that only a retry touches). A server's part lies where its
  // elements do, so a variable split across servers is still one run of
  // memory.
  std::vector<int64_t> value_at(vars_.size()), grad_at(vars_.size()), landing_at(vars_.size());
  region_bytes_.resize(vars_.size());
  int64_t end = common::kSegmentHeaderBytes;
  for (std::vector<int64_t>* at : {&value_at, &grad_at, &landing_at}) {
    for (size_t v = 0; v < vars_.size(); ++v) {
      (*at)[v] = end;
      int64_t elements = 1;
      for (int64_t d : vars_[v].shape()) elements *= d;
      region_bytes_[v] = (elements * static_cast<int64_t>(sizeof(float)) + kPageBytes - 1) /
                         kPageBytes * kPageBytes;
      end += region_bytes_[v];
    }
  }
  // Then each server's two channels (pulls, pushes) for same-host calls.
  const int64_t channels_at = end;
  if (options_.same_host_calls) end += 2 * n * common::kShmChannelBytes;
  if (vars_.empty()) return;
  auto segment = common::SharedSegment::Create(end - common::kSegmentHeaderBytes);
  if (!segment.ok()) {
    TLOG(INFO) << "worker " << options_.worker_task << ": no shared memory for pulls and pushes ("
               << segment.status().message() << "); they travel over gRPC";
    return;
  }
  segment_ = std::move(*segment);
  value_at_ = std::move(value_at);
  grad_at_ = std::move(grad_at);
  for (auto& server : servers_) {
    for (const VariablePart& part : server->parts) {
      const int64_t skip = part.offset * static_cast<int64_t>(sizeof(float));
      server->segment_offsets.push_back(value_at_[part.var] + skip);
      server->push_offsets.push_back(grad_at_[part.var] + skip);
      server->landing_offsets.push_back(landing_at[part.var] + skip);
    }
  }
  if (!options_.same_host_calls) return;
  for (int s = 0; s < n; ++s) {
    const int64_t at = channels_at + 2 * s * common::kShmChannelBytes;
    servers_[s]->pull_channel = std::make_unique<ShmCallClient>(segment_->mutable_at(0), at);
    servers_[s]->push_channel = std::make_unique<ShmCallClient>(
        segment_->mutable_at(0), at + common::kShmChannelBytes);
  }
}

float* PsPeers::SegmentValues(int var) {
  if (segment_ == nullptr) return nullptr;
  return reinterpret_cast<float*>(segment_->mutable_at(value_at_[var]));
}

float* PsPeers::SegmentGradients(int var) {
  if (segment_ == nullptr) return nullptr;
  return reinterpret_cast<float*>(segment_->mutable_at(grad_at_[var]));
}

void PsPeers::ReleaseSegmentMemory(int var) {
  if (segment_ == nullptr) return;
  // Best effort: the pages come back (zero) if anyone writes them again.
  // Only the pulled values: a server's update may still read the last push
  // in the gradient's pages after answering it (ps::GradientPart), and a
  // hole there would read as zeros; those pages go with the segment.
  values_released_.store(true);
  (void)madvise(segment_->mutable_at(value_at_[var]), static_cast<size_t>(region_bytes_[var]),
                MADV_REMOVE);
}

void PsPeers::DescribeSegment(v1::SharedSegment* request) const {
  request->set_pid(segment_->pid());
  request->set_fd(segment_->fd());
  request->set_nonce(segment_->nonce());
  request->set_size(segment_->size());
}

bool PsPeers::SegmentFor(int s, bool landing, v1::SharedSegment* request) {
  Server& server = *servers_[s];
  if (segment_ == nullptr || server.parts.empty() || server.segment_refused.load()) return false;
  DescribeSegment(request);
  const std::vector<int64_t>& at =
      landing || values_released_.load() ? server.landing_offsets : server.segment_offsets;
  *request->mutable_offsets() = {at.begin(), at.end()};
  request->set_pull_id(server.pull_ids.fetch_add(1) + 1);
  return true;
}

bool PsPeers::PushSegmentFor(int s, v1::SharedSegment* request) {
  Server& server = *servers_[s];
  if (segment_ == nullptr || server.parts.empty() || server.segment_refused.load() ||
      !server.segment_used.load()) {
    return false;
  }
  DescribeSegment(request);
  *request->mutable_offsets() = {server.push_offsets.begin(), server.push_offsets.end()};
  // Where this server's pulls land: it may write new values it forms
  // during the push there too (ParameterClient::SharedValues says when
  // the caller must not read them); not once that memory was given back.
  if (!values_released_.load()) {
    *request->mutable_value_offsets() = {server.segment_offsets.begin(),
                                         server.segment_offsets.end()};
  }
  return true;
}

void PsPeers::NoteInPlace(int s, int64_t bytes) {
  bytes_in_place_.fetch_add(bytes, std::memory_order_relaxed);
  if (!servers_[s]->segment_used.exchange(true)) {
    TLOG(INFO) << "worker " << options_.worker_task << ": " << ServerName(s)
               << " writes its pulls into this worker's shared memory";
  }
}

void PsPeers::NoteSegmentRefused(int s, absl::string_view why) {
  servers_[s]->names_with_commit.store(false, std::memory_order_relaxed);
  if (servers_[s]->segment_refused.exchange(true)) return;
  TLOG(INFO) << "worker " << options_.worker_task << ": " << ServerName(s)
             << " cannot write into this worker's shared memory (" << why
             << "); its pulls and pushes travel over gRPC";
}

PsPeers::~PsPeers() {
  stop_.Notify();
  if (heartbeats_.joinable()) heartbeats_.join();
}

std::string PsPeers::ServerName(int s) const {
  return absl::StrCat("ps ", s, " at ", options_.ps_addresses[s]);
}

std::string PsPeers::Call(const char* method, int s) const {
  return absl::StrCat(method, " on ", ServerName(s));
}

absl::Duration PsPeers::LogInterval() const {
  return std::clamp(options_.peer_timeout / 2, absl::Seconds(1), absl::Seconds(5));
}

void PsPeers::NoteReachable(int s) {
  absl::MutexLock lock(&mu_);
  health_[s].unreachable_since = absl::InfiniteFuture();
}

void PsPeers::NoteUnreachable(int s, const absl::Status& st) {
  absl::MutexLock lock(&mu_);
  Health& h = health_[s];
  if (h.unreachable_since == absl::InfiniteFuture()) h.unreachable_since = absl::Now();
  h.last_error = std::string(st.message());
}

void PsPeers::NoteRegistered(int s, int64_t incarnation) {
  absl::MutexLock lock(&mu_);
  health_[s].registered = true;
  health_[s].incarnation = incarnation;
  health_[s].unreachable_since = absl::InfiniteFuture();
}

void PsPeers::NoteGone(int s, const absl::Status& st) {
  absl::MutexLock lock(&mu_);
  Health& h = health_[s];
  if (h.registered && h.gone.empty()) h.gone = std::string(st.message());
}

absl::Status PsPeers::LostServer() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  for (int s = 0; s < static_cast<int>(health_.size()); ++s) {
    const Health& h = health_[s];
    if (!h.gone.empty()) {
      return absl::NotFoundError(absl::StrCat(ServerName(s),
                                              " restarted and no longer holds job \"",
                                              options_.job_id, "\" (", h.gone, ")"));
    }
    if (now - h.unreachable_since > options_.peer_timeout) {
      return absl::UnavailableError(absl::StrFormat(
          "%s unreachable for %.1f s (peer_timeout_s=%g); last error: %s", ServerName(s),
          absl::ToDoubleSeconds(now - h.unreachable_since),
          absl::ToDoubleSeconds(options_.peer_timeout), h.last_error));
    }
  }
  return absl::OkStatus();
}

absl::Status PsPeers::Combine(const std::vector<absl::Status>& results) {
  TOWERPS_RETURN_IF_ERROR(LostServer());
  for (int s = 0; s < static_cast<int>(results.size()); ++s) {
    if (!results[s].ok()) return common::Annotate(results[s], ServerName(s));
  }
  return absl::OkStatus();
}

void PsPeers::StartHeartbeats() {
  if (!heartbeats_.joinable()) {
    heartbeats_ = std::thread([this] {
      common::SetCurrentThreadName("ps heartbeats");
      HeartbeatLoop();
    });
  }
}

void PsPeers::HeartbeatLoop() {
  const absl::Duration interval =
      std::clamp(options_.peer_timeout / 6, absl::Milliseconds(50), absl::Seconds(10));
  const absl::Duration timeout =
      std::clamp(options_.peer_timeout / 3, absl::Milliseconds(200), absl::Seconds(10));
  v1::HeartbeatRequest req;
  req.set_job_id(options_.job_id);
  req.set_worker_task(options_.worker_task);
  while (!stop_.WaitForNotificationWithTimeout(interval)) {
    for (int s = 0; s < size() && !stop_.HasBeenNotified(); ++s) {
      int64_t incarnation = 0;
      {
        absl::MutexLock lock(&mu_);
        if (!health_[s].registered) continue;
        incarnation = health_[s].incarnation;
      }
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
      v1::HeartbeatResponse resp;
      const absl::Status st =
          common::FromGrpcStatus(stub(s).Heartbeat(&ctx, req, &resp), Call("Heartbeat", s));
      if (st.ok() && resp.incarnation() != incarnation) {
        NoteGone(s, absl::NotFoundError(absl::StrCat("its incarnation changed from ",
                                                     incarnation, " to ", resp.incarnation())));
      } else if (st.ok() || absl::IsUnimplemented(st)) {  // (a server without heartbeats)
        NoteReachable(s);
      } else if (absl::IsNotFound(st)) {
        NoteGone(s, st);
      } else if (retry_.IsRetryable(st)) {
        NoteUnreachable(s, st);
      }
    }
  }
}

}  // namespace towerps::worker::internal
