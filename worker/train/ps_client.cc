#include "worker/train/ps_client.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/parallel.h"
#include "common/retry.h"
#include "common/rpc.h"
#include "common/status.h"
#include "common/tensor_wire.h"
#include "grpcpp/client_context.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"
#include "proto/job.pb.h"
#include "proto/ps.grpc.pb.h"
#include "proto/ps_wire.h"
#include "proto/tensor.pb.h"
#include "worker/train/gradient_compressor.h"

namespace towerps::worker {
namespace {

using common::FromGrpcStatus;

using v1::ps_wire::kPullSlicesField;
using v1::ps_wire::kPullStepField;
using v1::ps_wire::kPushSlicesField;
using v1::ps_wire::PullMethod;
using v1::ps_wire::PushMethod;

class GrpcParameterClient : public ParameterClient {
 public:
  GrpcParameterClient(ParameterClientOptions options, std::vector<v1::VariableDef> vars,
                      Placement placement, std::unique_ptr<GradientCompressor> compressor)
      : options_(std::move(options)),
        vars_(std::move(vars)),
        placement_(std::move(placement)),
        compressor_(std::move(compressor)) {
    if (options_.incarnation == 0) {
      std::random_device rd;
      options_.incarnation = (uint64_t{rd()} << 32) ^ rd() ^
                             static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
    }
    const int n = static_cast<int>(options_.ps_addresses.size());
    for (int s = 0; s < n; ++s) {
      channels_.push_back(common::NewChannel(options_.ps_addresses[s], options_.security.get()));
      stubs_.push_back(v1::ParameterService::NewStub(channels_.back()));
      push_methods_.push_back(std::make_unique<grpc::internal::RpcMethod>(
          PushMethod(), grpc::internal::RpcMethod::CLIENT_STREAMING, channels_.back()));
      pull_methods_.push_back(std::make_unique<grpc::internal::RpcMethod>(
          PullMethod(), grpc::internal::RpcMethod::SERVER_STREAMING, channels_.back()));
      on_server_.push_back(placement_.PartsOn(s));
    }
    health_.resize(n);
  }

  ~GrpcParameterClient() override {
    stop_.Notify();
    if (heartbeats_.joinable()) heartbeats_.join();
  }

  absl::StatusOr<int64_t> Register(const v1::TrainingConfig& config) override {
    const int n = static_cast<int>(stubs_.size());
    std::vector<int64_t> steps(n, 0);
    // Heartbeats start now: servers that hold the job hear from this worker
    // while it waits for the others to come up.
    if (!heartbeats_.joinable()) heartbeats_ = std::thread([this] { HeartbeatLoop(); });
    TOWERPS_RETURN_IF_ERROR(ForEachServer([&](int s) -> absl::Status {
      v1::RegisterRequest req;
      req.set_job_id(options_.job_id);
      *req.mutable_config() = config;
      req.set_restore_from(options_.restore_from);
      req.set_num_ps(n);
      req.set_worker_task(options_.worker_task);
      for (const auto& def : placement_.DefsOn(vars_, s)) *req.add_variables() = def;
      v1::RegisterResponse resp;
      // Wait for the server to come up (workers may start first). Each
      // round is a wait_for_ready call (a call in flight is what drives the
      // channel's connection attempts; without one, gRPC polls them only every
      // few seconds) and, if that finds no connection, one call without it,
      // which fails at once with the transport's reason for the log line and
      // the final error. Those calls pace the loop, so the backoff has no
      // delay: it decides, and stops at once when the job is cancelled. The
      // time limit is peer_timeout (LostServer).
      const absl::Time start = absl::Now();
      absl::Time next_log = start + absl::Seconds(1);
      const absl::Duration attempt = std::min(absl::Seconds(5), options_.peer_timeout);
      common::Backoff backoff(
          retry_.WithBackoff(absl::ZeroDuration(), absl::ZeroDuration()), options_.cancel);
      while (true) {
        absl::Status st;
        for (const bool wait_for_ready : {true, false}) {
          grpc::ClientContext ctx;
          ctx.set_wait_for_ready(wait_for_ready);
          // Connected: the server may take a while to create a large job.
          const bool connected = channels_[s]->GetState(true) == GRPC_CHANNEL_READY;
          ctx.set_deadline(absl::ToChronoTime(
              absl::Now() + (connected ? attempt : std::min(attempt, absl::Seconds(1)))));
          const common::ScopedCancellationCallback cancel_call(options_.cancel,
                                                               [&ctx] { ctx.TryCancel(); });
          st = FromGrpcStatus(stubs_[s]->RegisterVariables(&ctx, req, &resp),
                              Call("RegisterVariables", s));
          if (st.ok() || !retry_.IsRetryable(st)) break;
          if (channels_[s]->GetState(false) == GRPC_CHANNEL_READY) break;  // connected: slow
        }
        if (st.ok()) break;
        if (retry_.IsRetryable(st) && channels_[s]->GetState(false) != GRPC_CHANNEL_READY) {
          NoteUnreachable(s, st);
        }
        TOWERPS_RETURN_IF_ERROR(backoff.Wait(st));
        TOWERPS_RETURN_IF_ERROR(LostServer());
        const absl::Time now = absl::Now();
        if (now >= next_log) {
          TLOG(WARNING) << "worker " << options_.worker_task << ": waiting for "
                        << ServerName(s) << " to come up ("
                        << absl::StrFormat("%.1f", absl::ToDoubleSeconds(now - start))
                        << " s so far, peer_timeout_s="
                        << absl::ToDoubleSeconds(options_.peer_timeout) << "): " << st.message();
          next_log = now + LogInterval();
        }
      }
      NoteRegistered(s, resp.incarnation());
      steps[s] = resp.global_step();
      return absl::OkStatus();
    }));
    return *std::min_element(steps.begin(), steps.end());
  }

  absl::StatusOr<int64_t> Pull(int64_t min_step, int64_t iteration,
                               const std::vector<common::Tensor*>& weights) override {
    if (weights.size() != vars_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pull: got ", weights.size(), " buffers for ", vars_.size(), " variables"));
    }
    const int n = static_cast<int>(stubs_.size());
    std::vector<int64_t> steps(n, 0);
    std::vector<absl::Duration> waited(n, absl::ZeroDuration());
    TOWERPS_RETURN_IF_ERROR(LostServer());
    const common::RetryPolicy policy = retry_.WithDeadline(options_.wait_timeout);
    TOWERPS_RETURN_IF_ERROR(ForEachServer([&](int s) -> absl::Status {
      common::Backoff backoff(policy, options_.cancel);
      absl::Time next_log = absl::Now() + LogInterval();
      while (true) {
        const absl::Time attempt = absl::Now();
        absl::Status st = PullOnce(s, min_step, iteration, weights, &steps[s], &waited[s]);
        // A server-side wait that ran out counts whole.
        if (absl::IsDeadlineExceeded(st)) waited[s] += absl::Now() - attempt;
        // DEADLINE_EXCEEDED here is the server's step wait (max_wait_ms): it answered.
        if (st.ok() || absl::IsDeadlineExceeded(st)) NoteReachable(s);
        if (st.ok()) return st;
        if (absl::IsNotFound(st)) NoteGone(s, st);
        if (absl::IsUnavailable(st)) NoteUnreachable(s, st);
        TOWERPS_RETURN_IF_ERROR(LostServer());
        // The server waited already: ask again at once.
        TOWERPS_RETURN_IF_ERROR(absl::IsDeadlineExceeded(st) ? backoff.AgainAtOnce(st)
                                                             : backoff.Wait(st));
        const absl::Time now = absl::Now();
        if (now >= next_log) {
          TLOG(WARNING) << "worker " << options_.worker_task << ": still waiting on "
                        << ServerName(s) << " for step " << min_step << ": " << st.message();
          next_log = now + LogInterval();
        }
      }
    }));
    last_pull_wait_ = *std::max_element(waited.begin(), waited.end());
    return *std::min_element(steps.begin(), steps.end());
  }

  absl::Duration last_pull_wait() const override { return last_pull_wait_; }

  absl::StatusOr<PushResult> Push(int64_t step, int64_t num_examples,
                                  const std::vector<const common::Tensor*>& grads) override {
    if (grads.size() != vars_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push: got ", grads.size(), " gradients for ", vars_.size(), " variables"));
    }
    // Compressed once per push: every attempt below sends these bytes.
    std::shared_ptr<const EncodedPush> encoded;
    if (compressor_ != nullptr) {
      TOWERPS_ASSIGN_OR_RETURN(encoded, compressor_->Encode(grads));
    }
    const uint64_t sequence = ++sequence_;
    const int n = static_cast<int>(stubs_.size());
    std::vector<v1::PushResponse> responses(n);
    TOWERPS_RETURN_IF_ERROR(LostServer());
    TOWERPS_RETURN_IF_ERROR(ForEachServer([&](int s) -> absl::Status {
      common::Backoff backoff(retry_, options_.cancel);
      int timeouts = 0;
      while (true) {
        absl::Status st =
            PushOnce(s, sequence, step, num_examples, grads, encoded, &responses[s]);
        if (st.ok()) NoteReachable(s);
        if (st.ok()) return st;
        if (absl::IsNotFound(st)) NoteGone(s, st);
        if (absl::IsUnavailable(st)) NoteUnreachable(s, st);
        TOWERPS_RETURN_IF_ERROR(LostServer());
        // Unreachable: retried until the server is lost (peer_timeout);
        // timed out while connected: max_push_attempts times.
        if (absl::IsDeadlineExceeded(st) && ++timeouts >= options_.max_push_attempts) return st;
        TOWERPS_RETURN_IF_ERROR(backoff.Wait(st));
        TLOG(WARNING) << "worker " << options_.worker_task << ": push to " << ServerName(s)
                      << " failed (attempt " << backoff.attempts() << "), retrying: "
                      << st.message();
      }
    }));
    PushResult r;
    r.global_step = INT64_MAX;
    for (const auto& resp : responses) {
      switch (resp.outcome()) {
        case v1::PushResponse::STALE: ++r.stale; break;
        case v1::PushResponse::DUPLICATE: ++r.duplicate; break;
        default: ++r.applied;
      }
      r.global_step = std::min(r.global_step, resp.global_step());
    }
    return r;
  }

  v1::StatusResponse Status(int ps_task) override {
    v1::StatusRequest req;
    req.set_job_id(options_.job_id);
    v1::StatusResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    stubs_[ps_task]->GetStatus(&ctx, req, &resp);
    return resp;
  }

  const Placement& placement() const override { return placement_; }

 private:
  // Adds the server's reported wait to `*waited`.
  absl::Status PullOnce(int s, int64_t min_step, int64_t iteration,
                        const std::vector<common::Tensor*>& weights, int64_t* step,
                        absl::Duration* waited) {
    v1::PullRequest req;
    req.set_job_id(options_.job_id);
    req.set_min_step(min_step);
    req.set_worker_task(options_.worker_task);
    req.set_worker_iteration(iteration);
    req.set_chunk_bytes(options_.chunk_bytes);
    // Short server-side waits, so that a lost peer elsewhere is noticed
    // between them (see Pull).
    req.set_max_wait_ms(absl::ToInt64Milliseconds(
        std::clamp(options_.peer_timeout / 4, absl::Milliseconds(250), absl::Seconds(5))));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
    // A cancelled job ends the call at once, not after the server's wait.
    const common::ScopedCancellationCallback cancel_call(options_.cancel,
                                                         [&ctx] { ctx.TryCancel(); });
    // Payload goes from gRPC's receive buffers straight into the tensors.
    std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
        grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(
            channels_[s].get(), *pull_methods_[s], &ctx, req));
    const std::vector<VariablePart>& parts = on_server_[s];
    std::vector<int64_t> covered(parts.size(), 0);
    common::TensorWireHandler handler;
    bool first = true;
    absl::Duration server_wait;
    handler.on_varint = [&](int field, uint64_t value) {
      if (field == kPullStepField && first) *step = static_cast<int64_t>(value);
      if (field == v1::ps_wire::kPullWaitedField && first) {
        server_wait = absl::Microseconds(static_cast<int64_t>(value));
      }
      return absl::OkStatus();
    };
    handler.on_slice = [&](uint32_t var, uint64_t offset, uint64_t bytes) -> absl::StatusOr<char*> {
      if (var >= parts.size()) {
        return absl::DataLossError(absl::StrCat("pull: bad var_index ", var));
      }
      const VariablePart& part = parts[var];
      common::Tensor* t = weights[part.var];
      const uint64_t count = bytes / 4;
      if (bytes % 4 != 0 || part.offset + part.count > t->num_elements() ||
          offset > static_cast<uint64_t>(part.count) ||
          count > static_cast<uint64_t>(part.count) - offset) {
        return absl::DataLossError(absl::StrCat("pull: slice of ", vars_[part.var].name(),
                                                " does not fit ", t->ShapeString()));
      }
      covered[var] += static_cast<int64_t>(count);
      return reinterpret_cast<char*>(t->data() + part.offset + offset);
    };
    grpc::ByteBuffer msg;
    absl::Status bad;
    while (reader->Read(&msg)) {
      if (bad.ok()) {
        bad = common::ReadTensorMessage(msg, kPullSlicesField, handler);
        if (absl::IsInvalidArgument(bad)) bad = absl::DataLossError(bad.message());
      }
      first = false;
    }
    absl::Status st = FromGrpcStatus(reader->Finish(), Call("Pull", s));
    if (!st.ok()) return st;
    if (!bad.ok()) return bad;
    *waited += server_wait;
    for (size_t k = 0; k < parts.size(); ++k) {
      if (covered[k] != parts[k].count) {
        return absl::DataLossError(absl::StrCat("pull: variable ", vars_[parts[k].var].name(),
                                                " came back incomplete"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status PushOnce(int s, uint64_t sequence, int64_t step, int64_t num_examples,
                        const std::vector<const common::Tensor*>& grads,
                        const std::shared_ptr<const EncodedPush>& encoded,
                        v1::PushResponse* response) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
    const common::ScopedCancellationCallback cancel_call(options_.cancel,
                                                         [&ctx] { ctx.TryCancel(); });
    std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
        grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
            channels_[s].get(), *push_methods_[s], &ctx, response));
    v1::PushRequest msg;
    v1::PushHeader* h = msg.mutable_header();
    h->set_job_id(options_.job_id);
    h->set_worker_task(options_.worker_task);
    h->set_incarnation(options_.incarnation);
    h->set_sequence(sequence);
    h->set_step(step);
    h->set_num_examples(num_examples);
    if (encoded != nullptr) h->set_slice_encoding(encoded->encoding());
    bool ok = writer->Write(common::ToByteBuffer(msg));
    // The messages point into the gradients (no copy): gRPC is done with
    // them when Finish returns, before this call does.
    common::TensorWireWriter out(
        kPushSlicesField, options_.chunk_bytes,
        [&writer](const grpc::ByteBuffer& m) { return writer->Write(m); });
    const std::vector<VariablePart>& parts = on_server_[s];
    if (encoded != nullptr) ok = ok && EncodedPush::WriteTo(encoded, s, &out);
    for (size_t k = 0; ok && encoded == nullptr && k < parts.size(); ++k) {
      const common::Tensor& g = *grads[parts[k].var];
      ok = out.Add(static_cast<uint32_t>(k), g.data() + parts[k].offset, parts[k].count);
    }
    if (ok) out.Finish();
    writer->WritesDone();
    return FromGrpcStatus(writer->Finish(), Call("Push", s));
  }

  // --- Liveness of the servers (see the header). ---

  std::string ServerName(int s) const {
    return absl::StrCat("ps ", s, " at ", options_.ps_addresses[s]);
  }
  std::string Call(const char* method, int s) const {
    return absl::StrCat(method, " on ", ServerName(s));
  }
  absl::Duration LogInterval() const {
    return std::clamp(options_.peer_timeout / 2, absl::Seconds(1), absl::Seconds(5));
  }

  // Runs fn(s) for every server in parallel. A lost server is the cause
  // whatever the calls returned (a wait elsewhere ends because of it);
  // otherwise the first error, naming its server.
  template <typename Fn>
  absl::Status ForEachServer(Fn fn) {
    const int n = static_cast<int>(stubs_.size());
    const std::vector<absl::Status> results = common::RunInParallel(n, fn);
    TOWERPS_RETURN_IF_ERROR(LostServer());
    for (int s = 0; s < n; ++s) {
      if (!results[s].ok()) return common::Annotate(results[s], ServerName(s));
    }
    return absl::OkStatus();
  }

  void NoteReachable(int s) {
    absl::MutexLock lock(&health_mu_);
    health_[s].unreachable_since = absl::InfiniteFuture();
  }
  void NoteUnreachable(int s, const absl::Status& st) {
    absl::MutexLock lock(&health_mu_);
    Health& h = health_[s];
    if (h.unreachable_since == absl::InfiniteFuture()) h.unreachable_since = absl::Now();
    h.last_error = std::string(st.message());
  }
  void NoteRegistered(int s, int64_t incarnation) {
    absl::MutexLock lock(&health_mu_);
    health_[s].registered = true;
    health_[s].incarnation = incarnation;
    health_[s].unreachable_since = absl::InfiniteFuture();
  }
  // NOT_FOUND (or a new incarnation) from a server that held the job.
  void NoteGone(int s, const absl::Status& st) {
    absl::MutexLock lock(&health_mu_);
    Health& h = health_[s];
    if (h.registered && h.gone.empty()) h.gone = std::string(st.message());
  }

  // UNAVAILABLE / NOT_FOUND naming the first server lost, else OK.
  absl::Status LostServer() {
    absl::MutexLock lock(&health_mu_);
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

  // Every peer_timeout / 6: one Heartbeat to each server that holds the job.
  void HeartbeatLoop() {
    const absl::Duration interval =
        std::clamp(options_.peer_timeout / 6, absl::Milliseconds(50), absl::Seconds(10));
    const absl::Duration timeout =
        std::clamp(options_.peer_timeout / 3, absl::Milliseconds(200), absl::Seconds(10));
    v1::HeartbeatRequest req;
    req.set_job_id(options_.job_id);
    req.set_worker_task(options_.worker_task);
    while (!stop_.WaitForNotificationWithTimeout(interval)) {
      for (int s = 0; s < static_cast<int>(stubs_.size()) && !stop_.HasBeenNotified(); ++s) {
        int64_t incarnation = 0;
        {
          absl::MutexLock lock(&health_mu_);
          if (!health_[s].registered) continue;
          incarnation = health_[s].incarnation;
        }
        grpc::ClientContext ctx;
        ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
        v1::HeartbeatResponse resp;
        const absl::Status st =
            FromGrpcStatus(stubs_[s]->Heartbeat(&ctx, req, &resp), Call("Heartbeat", s));
        if (st.ok() && resp.incarnation() != incarnation) {
          NoteGone(s, absl::NotFoundError(absl::StrCat(
                          "its incarnation changed from ", incarnation, " to ",
                          resp.incarnation())));
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

  // Constant after construction.
  ParameterClientOptions options_;  // (incarnation chosen in the constructor)
  const std::vector<v1::VariableDef> vars_;
  const Placement placement_;
  const std::unique_ptr<GradientCompressor> compressor_;  // null: no compression
  // Every loop here asks again on the transport's codes: UNAVAILABLE and
  // DEADLINE_EXCEEDED (a server-side wait that ran out, or a slow server).
  // ABORTED is a server's verdict, e.g. a lost worker: not retried here; the
  // chief's job manager restarts the attempt. The domain limits (a lost
  // server, max_push_attempts, wait_timeout) come on top.
  const common::RetryPolicy retry_ = common::RetryPolicy::Transport();
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::ParameterService::Stub>> stubs_;
  std::vector<std::vector<VariablePart>> on_server_;  // parts per server, by var_index

  // Push and Pull on byte buffers (common/tensor_wire.h), per channel.
  std::vector<std::unique_ptr<grpc::internal::RpcMethod>> push_methods_, pull_methods_;

  // Used by the one thread that calls Pull/Push (thread-compatible).
  uint64_t sequence_ = 0;
  absl::Duration last_pull_wait_;

  struct Health {
    bool registered = false;   // The job is registered there.
    int64_t incarnation = 0;   // The server's, when it registered the job.
    absl::Time unreachable_since = absl::InfiniteFuture();  // Future: reachable.
    std::string last_error;    // The last transport error.
    std::string gone;          // Set: it restarted and lost the job (why).
  };
  absl::Mutex health_mu_;
  std::vector<Health> health_ ABSL_GUARDED_BY(health_mu_);
  absl::Notification stop_;
  std::thread heartbeats_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ParameterClient>> NewGrpcParameterClient(
    ParameterClientOptions options, std::vector<v1::VariableDef> vars,
    v1::PlacementStrategy strategy) {
  if (options.ps_addresses.empty()) {
    return absl::InvalidArgumentError("parameter client: no ps addresses");
  }
  if (options.job_id.empty()) return absl::InvalidArgumentError("parameter client: no job id");
  if (options.chunk_bytes < 4096) {
    return absl::InvalidArgumentError("parameter client: chunk_bytes must be >= 4096");
  }
  TOWERPS_ASSIGN_OR_RETURN(
      Placement placement,
      PlanPlacement(vars, static_cast<int>(options.ps_addresses.size()), strategy));
  TOWERPS_ASSIGN_OR_RETURN(std::unique_ptr<GradientCompressor> compressor,
                           GradientCompressor::Create(options.compression, vars, placement,
                                                      options.chunk_bytes));
  if (compressor != nullptr) {
    TLOG(INFO) << "worker " << options.worker_task << ", job \"" << options.job_id
               << "\": " << compressor->Summary();
  }
  return std::unique_ptr<ParameterClient>(new GrpcParameterClient(
      std::move(options), std::move(vars), std::move(placement), std::move(compressor)));
}

}  // namespace towerps::worker
