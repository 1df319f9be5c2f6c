#include "worker/chief/worker_client.h"

#include <chrono>
#include <utility>

#include "common/grpc_status.h"
#include "common/rpc.h"
#include "grpcpp/grpcpp.h"
#include "proto/worker.grpc.pb.h"

namespace towerps::worker {
namespace {

std::chrono::system_clock::time_point DeadlineIn(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}

class GrpcWorkerClient final : public WorkerClient {
 public:
  GrpcWorkerClient(const std::string& address, const common::RpcSecurity& security)
      : stub_(v1::WorkerService::NewStub(common::NewChannel(address, &security))) {}

  absl::Status StartJob(const v1::StartJobRequest& request) override {
    grpc::ClientContext ctx;
    // A worker that is still starting up is waited for, briefly.
    ctx.set_wait_for_ready(true);
    ctx.set_deadline(DeadlineIn(absl::Seconds(5)));
    v1::StartJobResponse response;
    return common::FromGrpcStatus(stub_->StartJob(&ctx, request, &response));
  }

  absl::Status StopJob(const std::string& job_id) override {
    grpc::ClientContext ctx;
    // The worker waits up to 30 s for its job's thread.
    ctx.set_deadline(DeadlineIn(absl::Seconds(35)));
    v1::StopJobRequest request;
    request.set_job_id(job_id);
    v1::StopJobResponse response;
    return common::FromGrpcStatus(stub_->StopJob(&ctx, request, &response));
  }

  absl::StatusOr<v1::WorkerStatus> GetStatus(absl::Duration timeout) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(timeout));
    v1::WorkerStatus status;
    absl::Status st =
        common::FromGrpcStatus(stub_->GetStatus(&ctx, v1::WorkerStatusRequest(), &status));
    if (!st.ok()) return st;
    return status;
  }

 private:
  const std::unique_ptr<v1::WorkerService::Stub> stub_;
};

class InProcessWorkerClient final : public WorkerClient {
 public:
  InProcessWorkerClient(WorkerRuntime& runtime, JobHooksProvider hooks)
      : runtime_(runtime), hooks_(std::move(hooks)) {}

  absl::Status StartJob(const v1::StartJobRequest& request) override {
    return runtime_.Start(request, hooks_ ? hooks_(request) : JobHooks());
  }

  absl::Status StopJob(const std::string& job_id) override {
    runtime_.Stop(job_id);
    return absl::OkStatus();
  }

  absl::StatusOr<v1::WorkerStatus> GetStatus(absl::Duration) override {
    return runtime_.Status();
  }

 private:
  WorkerRuntime& runtime_;
  const JobHooksProvider hooks_;
};

}  // namespace

std::unique_ptr<WorkerClient> NewGrpcWorkerClient(
    const std::string& address, std::shared_ptr<const common::RpcSecurity> security) {
  return std::make_unique<GrpcWorkerClient>(address, *security);
}

std::unique_ptr<WorkerClient> NewInProcessWorkerClient(WorkerRuntime& runtime,
                                                       JobHooksProvider hooks) {
  return std::make_unique<InProcessWorkerClient>(runtime, std::move(hooks));
}

}  // namespace towerps::worker
