#include "worker/chief/ps_control.h"

#include <chrono>

#include "common/grpc_status.h"
#include "common/rpc.h"
#include "grpcpp/grpcpp.h"
#include "proto/ps.grpc.pb.h"

namespace towerps::worker {
namespace {

class GrpcPsControl final : public PsControl {
 public:
  GrpcPsControl(const std::string& address, const common::RpcSecurity& security)
      : stub_(v1::ParameterService::NewStub(common::NewChannel(address, &security))) {}

  absl::StatusOr<v1::DeleteJobResponse> DeleteJob(const std::string& job_id,
                                                  absl::Duration timeout) override {
    grpc::ClientContext ctx;
    ctx.set_wait_for_ready(true);
    SetDeadline(ctx, timeout);
    v1::DeleteJobRequest request;
    request.set_job_id(job_id);
    v1::DeleteJobResponse response;
    absl::Status st = common::FromGrpcStatus(stub_->DeleteJob(&ctx, request, &response));
    if (!st.ok()) return st;
    return response;
  }

  absl::StatusOr<v1::SaveResponse> SaveCheckpoint(const v1::SaveRequest& request,
                                                  absl::Duration timeout) override {
    grpc::ClientContext ctx;
    SetDeadline(ctx, timeout);
    v1::SaveResponse response;
    absl::Status st = common::FromGrpcStatus(stub_->SaveCheckpoint(&ctx, request, &response));
    if (!st.ok()) return st;
    return response;
  }

  absl::StatusOr<v1::StatusResponse> GetStatus(const std::string& job_id,
                                               absl::Duration timeout) override {
    grpc::ClientContext ctx;
    SetDeadline(ctx, timeout);
    v1::StatusRequest request;
    request.set_job_id(job_id);
    v1::StatusResponse response;
    absl::Status st = common::FromGrpcStatus(stub_->GetStatus(&ctx, request, &response));
    if (!st.ok()) return st;
    return response;
  }

 private:
  static void SetDeadline(grpc::ClientContext& ctx, absl::Duration timeout) {
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  }

  const std::unique_ptr<v1::ParameterService::Stub> stub_;
};

}  // namespace

std::unique_ptr<PsControl> NewGrpcPsControl(
    const std::string& address, std::shared_ptr<const common::RpcSecurity> security) {
  return std::make_unique<GrpcPsControl>(address, *security);
}

}  // namespace towerps::worker
