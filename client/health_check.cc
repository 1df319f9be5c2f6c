#include "client/health_check.h"

#include "common/grpc_status.h"
#include "common/rpc.h"
#include "grpcpp/client_context.h"
#include "proto/health.grpc.pb.h"

namespace towerps::client {

using grpc::health::v1::HealthCheckResponse;

const char* ServingStateName(ServingState state) {
  switch (state) {
    case ServingState::kServing:
      return "SERVING";
    case ServingState::kNotServing:
      return "NOT_SERVING";
    case ServingState::kServiceUnknown:
      return "SERVICE_UNKNOWN";
    case ServingState::kUnknown:
      break;
  }
  return "UNKNOWN";
}

absl::StatusOr<ServingState> CheckHealth(const std::string& address, const std::string& service,
                                         absl::Duration timeout,
                                         const common::RpcSecurity* security) {
  auto stub = grpc::health::v1::Health::NewStub(common::NewChannel(address, security));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  HealthCheckResponse response;
  const grpc::Status status = stub->Check(&ctx, request, &response);
  // The standard Check answers an unknown name with NOT_FOUND; only Watch
  // has the SERVICE_UNKNOWN value.
  if (status.error_code() == grpc::StatusCode::NOT_FOUND) return ServingState::kServiceUnknown;
  if (!status.ok()) return common::FromGrpcStatus(status, "Health/Check on " + address);
  switch (response.status()) {
    case HealthCheckResponse::SERVING:
      return ServingState::kServing;
    case HealthCheckResponse::NOT_SERVING:
      return ServingState::kNotServing;
    case HealthCheckResponse::SERVICE_UNKNOWN:
      return ServingState::kServiceUnknown;
    default:
      return ServingState::kUnknown;
  }
}

}  // namespace towerps::client
