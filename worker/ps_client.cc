#include "worker/ps_client.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/parallel.h"
#include "common/rpc.h"
#include "common/slice_writer.h"
#include "common/status.h"
#include "grpcpp/client_context.h"
#include "proto/towerps.grpc.pb.h"

namespace towerps::worker {
namespace {

using common::FromGrpcStatus;

bool Retryable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsAborted(s);
}

// Runs fn(s) for every server in parallel; returns the first error, naming its server.
template <typename Fn>
absl::Status ForEachServer(int n, Fn fn) {
  const std::vector<absl::Status> results = common::RunInParallel(n, fn);
  for (int s = 0; s < n; ++s) {
    if (!results[s].ok()) return common::Annotate(results[s], absl::StrCat("ps ", s));
  }
  return absl::OkStatus();
}

class GrpcParameterClient : public ParameterClient {
 public:
  GrpcParameterClient(ParameterClientOptions options, std::vector<v1::VariableDef> vars,
                      common::Placement placement)
      : options_(std::move(options)),
        vars_(std::move(vars)),
        placement_(std::move(placement)) {
    if (options_.incarnation == 0) {
      std::random_device rd;
      options_.incarnation = (uint64_t{rd()} << 32) ^ rd() ^
                             static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
    }
    const int n = static_cast<int>(options_.ps_addresses.size());
    for (int s = 0; s < n; ++s) {
      stubs_.push_back(v1::ParameterService::NewStub(
          common::NewChannel(options_.ps_addresses[s])));
      on_server_.push_back(placement_.VariablesOn(s));
    }
    push_msgs_.resize(n);
  }

  absl::Status CheckCancelled() const {
    if (options_.cancelled != nullptr && options_.cancelled->load()) {
      return absl::CancelledError("job cancelled");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> Register(const v1::TrainingConfig& config) override {
    const int n = static_cast<int>(stubs_.size());
    std::vector<int64_t> steps(n, 0);
    TOWERPS_RETURN_IF_ERROR(ForEachServer(n, [&](int s) -> absl::Status {
      v1::RegisterRequest req;
      req.set_job_id(options_.job_id);
      *req.mutable_config() = config;
      req.set_restore_from(options_.restore_from);
      req.set_num_ps(n);
      for (int v : on_server_[s]) *req.add_variables() = vars_[v];
      v1::RegisterResponse resp;
      // Wait for the server to come up (workers may start first), in short
      // slices so that a cancellation is noticed.
      const absl::Time give_up = absl::Now() + options_.wait_timeout;
      while (true) {
        grpc::ClientContext ctx;
        ctx.set_wait_for_ready(true);
        ctx.set_deadline(absl::ToChronoTime(std::min(give_up, absl::Now() + absl::Seconds(5))));
        absl::Status st = FromGrpcStatus(stubs_[s]->RegisterVariables(&ctx, req, &resp));
        if (st.ok()) break;
        if (!absl::IsDeadlineExceeded(st) && !absl::IsUnavailable(st)) return st;
        TOWERPS_RETURN_IF_ERROR(CheckCancelled());
        if (absl::Now() >= give_up) return st;
      }
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
    const absl::Time give_up = absl::Now() + options_.wait_timeout;
    TOWERPS_RETURN_IF_ERROR(ForEachServer(n, [&](int s) -> absl::Status {
      absl::Duration backoff = absl::Milliseconds(100);
      while (true) {
        absl::Status st = PullOnce(s, min_step, iteration, weights, &steps[s]);
        if (st.ok() || !Retryable(st)) return st;
        TOWERPS_RETURN_IF_ERROR(CheckCancelled());
        if (absl::Now() >= give_up) {
          return absl::DeadlineExceededError(absl::StrCat(
              "gave up after ", absl::FormatDuration(options_.wait_timeout),
              ": ", st.message()));
        }
        TLOG(WARNING) << "worker " << options_.worker_task << ": still waiting on ps "
                      << s << " for step " << min_step << ": " << st.message();
        if (absl::IsDeadlineExceeded(st)) continue;  // the server waited already
        absl::SleepFor(backoff);
        backoff = std::min(backoff * 2, absl::Seconds(2));
      }
    }));
    return *std::min_element(steps.begin(), steps.end());
  }

  absl::StatusOr<PushResult> Push(int64_t step, int64_t num_examples,
                                  const std::vector<const common::Tensor*>& grads) override {
    if (grads.size() != vars_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push: got ", grads.size(), " gradients for ", vars_.size(), " variables"));
    }
    const uint64_t sequence = ++sequence_;
    const int n = static_cast<int>(stubs_.size());
    std::vector<v1::PushResponse> responses(n);
    TOWERPS_RETURN_IF_ERROR(ForEachServer(n, [&](int s) -> absl::Status {
      absl::Duration backoff = absl::Milliseconds(100);
      for (int attempt = 1;; ++attempt) {
        absl::Status st = PushOnce(s, sequence, step, num_examples, grads, &responses[s]);
        if (st.ok() || !Retryable(st) || attempt >= options_.max_push_attempts) return st;
        TOWERPS_RETURN_IF_ERROR(CheckCancelled());
        TLOG(WARNING) << "worker " << options_.worker_task << ": push to ps " << s
                      << " failed (attempt " << attempt << "), retrying: " << st.message();
        absl::SleepFor(backoff);
        backoff = std::min(backoff * 2, absl::Seconds(5));
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

  const common::Placement& placement() const override { return placement_; }

 private:
  absl::Status PullOnce(int s, int64_t min_step, int64_t iteration,
                        const std::vector<common::Tensor*>& weights, int64_t* step) {
    v1::PullRequest req;
    req.set_job_id(options_.job_id);
    req.set_min_step(min_step);
    req.set_worker_task(options_.worker_task);
    req.set_worker_iteration(iteration);
    req.set_chunk_bytes(options_.chunk_bytes);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
    auto reader = stubs_[s]->Pull(&ctx, req);
    const std::vector<int>& vars = on_server_[s];
    std::vector<int64_t> covered(vars.size(), 0);
    v1::PullResponse msg;
    bool first = true;
    absl::Status bad;
    while (reader->Read(&msg)) {
      if (first) *step = msg.global_step();
      first = false;
      for (const auto& slice : msg.slices()) {
        if (!bad.ok()) break;
        if (slice.var_index() >= vars.size()) {
          bad = absl::DataLossError(absl::StrCat("pull: bad var_index ", slice.var_index()));
          break;
        }
        common::Tensor* t = weights[vars[slice.var_index()]];
        const int64_t count = static_cast<int64_t>(slice.data().size() / 4);
        if (slice.data().size() % 4 != 0 ||
            static_cast<int64_t>(slice.offset()) + count > t->num_elements()) {
          bad = absl::DataLossError(absl::StrCat(
              "pull: slice of ", vars_[vars[slice.var_index()]].name(), " does not fit ",
              t->ShapeString()));
          break;
        }
        std::memcpy(t->data() + slice.offset(), slice.data().data(), slice.data().size());
        covered[slice.var_index()] += count;
      }
    }
    absl::Status st = FromGrpcStatus(reader->Finish());
    if (!st.ok()) return st;
    if (!bad.ok()) return bad;
    for (size_t k = 0; k < vars.size(); ++k) {
      if (covered[k] != weights[vars[k]]->num_elements()) {
        return absl::DataLossError(absl::StrCat("pull: variable ", vars_[vars[k]].name(),
                                                " came back incomplete"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status PushOnce(int s, uint64_t sequence, int64_t step, int64_t num_examples,
                        const std::vector<const common::Tensor*>& grads,
                        v1::PushResponse* response) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
    auto writer = stubs_[s]->Push(&ctx, response);
    v1::PushRequest& msg = push_msgs_[s];  // reused: keeps string capacity
    msg.Clear();
    v1::PushHeader* h = msg.mutable_header();
    h->set_job_id(options_.job_id);
    h->set_worker_task(options_.worker_task);
    h->set_incarnation(options_.incarnation);
    h->set_sequence(sequence);
    h->set_step(step);
    h->set_num_examples(num_examples);
    bool ok = writer->Write(msg);
    msg.clear_header();
    common::SliceWriter<v1::PushRequest> out(
        &msg, options_.chunk_bytes,
        [&writer](const v1::PushRequest& m) { return writer->Write(m); });
    const std::vector<int>& vars = on_server_[s];
    for (size_t k = 0; ok && k < vars.size(); ++k) {
      const common::Tensor& g = *grads[vars[k]];
      ok = out.Add(static_cast<uint32_t>(k), g.data(), g.num_elements());
    }
    if (ok) out.Finish();
    writer->WritesDone();
    return FromGrpcStatus(writer->Finish());
  }

  ParameterClientOptions options_;
  const std::vector<v1::VariableDef> vars_;
  const common::Placement placement_;
  std::vector<std::unique_ptr<v1::ParameterService::Stub>> stubs_;
  std::vector<std::vector<int>> on_server_;  // variable indices per server
  std::vector<v1::PushRequest> push_msgs_;
  uint64_t sequence_ = 0;
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
      common::Placement placement,
      common::PlanPlacement(vars, static_cast<int>(options.ps_addresses.size()), strategy));
  return std::unique_ptr<ParameterClient>(
      new GrpcParameterClient(std::move(options), std::move(vars), std::move(placement)));
}

}  // namespace towerps::worker
