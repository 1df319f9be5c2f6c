#include "worker/train/ps_client.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/parallel.h"
#include "common/retry.h"
#include "common/status.h"
#include "grpcpp/client_context.h"
#include "proto/job.pb.h"
#include "proto/ps.grpc.pb.h"
#include "proto/tensor.pb.h"
#include "worker/train/gradient_compressor.h"
#include "worker/train/ps_peers.h"
#include "worker/train/ps_streams.h"

namespace towerps::worker {
namespace {

using common::FromGrpcStatus;

class GrpcParameterClient : public ParameterClient {
 public:
  GrpcParameterClient(ParameterClientOptions options, std::vector<v1::VariableDef> vars,
                      Placement placement, std::unique_ptr<GradientCompressor> compressor)
      : peers_(WithIncarnation(std::move(options)), std::move(vars), std::move(placement)),
        compressor_(std::move(compressor)) {}

  absl::StatusOr<int64_t> Register(const v1::TrainingConfig& config) override {
    const int n = peers_.size();
    std::vector<int64_t> steps(n, 0);
    // Heartbeats start now: servers that hold the job hear from this worker
    // while it waits for the others to come up.
    peers_.StartHeartbeats();
    TOWERPS_RETURN_IF_ERROR(ForEachServer([&](int s) -> absl::Status {
      v1::RegisterRequest req;
      req.set_job_id(peers_.options().job_id);
      *req.mutable_config() = config;
      req.set_restore_from(peers_.options().restore_from);
      req.set_num_ps(n);
      req.set_worker_task(peers_.options().worker_task);
      for (const auto& def : peers_.placement().DefsOn(peers_.vars(), s)) *req.add_variables() = def;
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
      const absl::Duration attempt = std::min(absl::Seconds(5), peers_.options().peer_timeout);
      common::Backoff backoff(
          peers_.retry().WithBackoff(absl::ZeroDuration(), absl::ZeroDuration()), peers_.options().cancel);
      while (true) {
        absl::Status st;
        for (const bool wait_for_ready : {true, false}) {
          grpc::ClientContext ctx;
          ctx.set_wait_for_ready(wait_for_ready);
          // Connected: the server may take a while to create a large job.
          const bool connected = peers_.channel(s).GetState(true) == GRPC_CHANNEL_READY;
          ctx.set_deadline(absl::ToChronoTime(
              absl::Now() + (connected ? attempt : std::min(attempt, absl::Seconds(1)))));
          const common::ScopedCancellationCallback cancel_call(peers_.options().cancel,
                                                               [&ctx] { ctx.TryCancel(); });
          st = FromGrpcStatus(peers_.stub(s).RegisterVariables(&ctx, req, &resp),
                              peers_.Call("RegisterVariables", s));
          if (st.ok() || !peers_.retry().IsRetryable(st)) break;
          if (peers_.channel(s).GetState(false) == GRPC_CHANNEL_READY) break;  // connected: slow
        }
        if (st.ok()) break;
        if (peers_.retry().IsRetryable(st) && peers_.channel(s).GetState(false) != GRPC_CHANNEL_READY) {
          peers_.NoteUnreachable(s, st);
        }
        TOWERPS_RETURN_IF_ERROR(backoff.Wait(st));
        TOWERPS_RETURN_IF_ERROR(peers_.LostServer());
        const absl::Time now = absl::Now();
        if (now >= next_log) {
          TLOG(WARNING) << "worker " << peers_.options().worker_task << ": waiting for "
                        << peers_.ServerName(s) << " to come up ("
                        << absl::StrFormat("%.1f", absl::ToDoubleSeconds(now - start))
                        << " s so far, peer_timeout_s="
                        << absl::ToDoubleSeconds(peers_.options().peer_timeout) << "): " << st.message();
          next_log = now + peers_.LogInterval();
        }
      }
      peers_.NoteRegistered(s, resp.incarnation());
      steps[s] = resp.global_step();
      return absl::OkStatus();
    }));
    return *std::min_element(steps.begin(), steps.end());
  }

  absl::StatusOr<std::unique_ptr<PullStream>> StartPull(
      int64_t min_step, int64_t iteration,
      const std::vector<common::Tensor*>& weights) override {
    return StartPullAfter(min_step, iteration, 0, weights);
  }

  absl::StatusOr<std::unique_ptr<PullStream>> StartPullAfterPush(
      int64_t min_step, int64_t iteration,
      const std::vector<common::Tensor*>& weights) override {
    if (sequence_ == 0) {
      return absl::FailedPreconditionError("pull after push: no push was started");
    }
    return StartPullAfter(min_step, iteration, sequence_, weights);
  }

  absl::StatusOr<std::unique_ptr<PullStream>> StartPullAfter(
      int64_t min_step, int64_t iteration, uint64_t after_push,
      const std::vector<common::Tensor*>& weights) {
    const std::vector<v1::VariableDef>& vars = peers_.vars();
    if (weights.size() != vars.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pull: got ", weights.size(), " buffers for ", vars.size(), " variables"));
    }
    for (size_t v = 0; v < vars.size(); ++v) {
      TOWERPS_RETURN_IF_ERROR(Fits("pull", vars[v], *weights[v]));
    }
    TOWERPS_RETURN_IF_ERROR(peers_.LostServer());
    return internal::StartGrpcPull(peers_, min_step, iteration, after_push, weights);
  }

  absl::StatusOr<std::unique_ptr<PushStream>> StartPush(
      int64_t step, int64_t num_examples,
      const std::vector<const common::Tensor*>& grads) override {
    const std::vector<v1::VariableDef>& vars = peers_.vars();
    if (grads.size() != vars.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push: got ", grads.size(), " gradients for ", vars.size(), " variables"));
    }
    for (size_t v = 0; v < vars.size(); ++v) {
      TOWERPS_RETURN_IF_ERROR(Fits("push", vars[v], *grads[v]));
    }
    TOWERPS_RETURN_IF_ERROR(peers_.LostServer());
    return internal::StartGrpcPush(peers_, compressor_.get(), ++sequence_, step, num_examples,
                                   grads);
  }

  v1::StatusResponse Status(int ps_task) override {
    v1::StatusRequest req;
    req.set_job_id(peers_.options().job_id);
    v1::StatusResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    peers_.stub(ps_task).GetStatus(&ctx, req, &resp);
    return resp;
  }

  const Placement& placement() const override { return peers_.placement(); }
  int64_t bytes_pulled_in_place() const override { return peers_.bytes_in_place(); }
  int64_t bytes_pushed_in_place() const override { return peers_.bytes_pushed_in_place(); }
  float* SharedValues(int var) override { return peers_.SegmentValues(var); }
  float* SharedGradients(int var) override { return peers_.SegmentGradients(var); }
  void ReleaseShared(int var) override { peers_.ReleaseSegmentMemory(var); }

 private:
  static ParameterClientOptions WithIncarnation(ParameterClientOptions options) {
    if (options.incarnation == 0) {
      std::random_device rd;
      options.incarnation = (uint64_t{rd()} << 32) ^ rd() ^
                            static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
    }
    return options;
  }

  // InvalidArgument unless `t` has the variable's element count.
  static absl::Status Fits(const char* what, const v1::VariableDef& var, const common::Tensor& t) {
    int64_t n = 1;
    for (int64_t d : var.shape()) n *= d;
    if (t.num_elements() == n) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(what, ": buffer of ", var.name(), " is ",
                                                   t.ShapeString(), ", want ", n, " elements"));
  }

  // Runs fn(s) for every server in parallel; PsPeers::Combine's verdict.
  template <typename Fn>
  absl::Status ForEachServer(Fn fn) {
    return peers_.Combine(common::RunInParallel(peers_.size(), fn));
  }

  internal::PsPeers peers_;
  // Null: no compression. Used by one push at a time (its stream).
  const std::unique_ptr<GradientCompressor> compressor_;
  // Used by the one thread that starts pushes (thread-compatible).
  uint64_t sequence_ = 0;
};

}  // namespace

absl::StatusOr<int64_t> ParameterClient::Pull(int64_t min_step, int64_t iteration,
                                              const std::vector<common::Tensor*>& weights) {
  TOWERPS_ASSIGN_OR_RETURN(std::unique_ptr<PullStream> pull,
                           StartPull(min_step, iteration, weights));
  TOWERPS_ASSIGN_OR_RETURN(int64_t step, pull->Finish());
  last_pull_wait_ = pull->server_wait();
  return step;
}

absl::StatusOr<PushResult> ParameterClient::Push(
    int64_t step, int64_t num_examples, const std::vector<const common::Tensor*>& grads) {
  TOWERPS_ASSIGN_OR_RETURN(std::unique_ptr<PushStream> push,
                           StartPush(step, num_examples, grads));
  TOWERPS_RETURN_IF_ERROR(push->Send(0, static_cast<int>(grads.size())));
  return push->Finish();
}

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
