// The transport-security flags of ps and worker (--tls_cert, --tls_key,
// --tls_ca, --auth_token_file; $TOWERPS_AUTH_TOKEN), defined once here and
// linked into each main(). towerctl parses the same names itself into the
// same RpcSecurityOptions.
//
// Call only from main(), after absl::ParseCommandLine.
#ifndef TOWERPS_COMMON_RPC_SECURITY_FLAGS_H_
#define TOWERPS_COMMON_RPC_SECURITY_FLAGS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/rpc_security.h"

namespace towerps::common {

// The flags' values and the environment variable, as given.
RpcSecurityOptions RpcSecurityOptionsFromCommandLine();

// RpcSecurity::Create on those options: InvalidArgument naming the flag and
// path for bad settings (the binaries exit 2 on it).
absl::StatusOr<std::shared_ptr<const RpcSecurity>> RpcSecurityFromCommandLine(RpcRole role);

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_RPC_SECURITY_FLAGS_H_
