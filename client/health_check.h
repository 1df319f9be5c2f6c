// One grpc.health.v1.Health/Check call, for `towerctl health`: asks a ps or
// worker (or any gRPC server with the standard health service) whether it
// serves.
//
// Thread-safe.
#ifndef TOWERPS_CLIENT_HEALTH_CHECK_H_
#define TOWERPS_CLIENT_HEALTH_CHECK_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc_security.h"

namespace towerps::client {

// What the server reports.
enum class ServingState {
  kUnknown,         // The server answered UNKNOWN (status not set).
  kServing,         // Ready for calls.
  kNotServing,      // Starting up or shutting down.
  kServiceUnknown,  // The server does not know the service name asked about.
};

// "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN" or "UNKNOWN": the standard names.
const char* ServingStateName(ServingState state);

// Asks `address` ("host:port") about `service` ("" is the whole process; else a
// full service name such as "towerps.v1.ParameterService"). Blocks for at
// most `timeout`. A server's NOT_FOUND (a name it does not know) is
// kServiceUnknown, not an error. Errors: Unavailable or DeadlineExceeded when
// the address cannot be reached in time; Unimplemented when the server has no
// health service; any other status the server returned. `security` (not
// owned; null: plaintext) sets TLS; health needs no token, but one is sent
// when given.
absl::StatusOr<ServingState> CheckHealth(const std::string& address, const std::string& service,
                                         absl::Duration timeout,
                                         const common::RpcSecurity* security = nullptr);

}  // namespace towerps::client

#endif  // TOWERPS_CLIENT_HEALTH_CHECK_H_
