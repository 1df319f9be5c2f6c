#include "common/rpc_security_flags.h"

#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of this process. With --tls_key: serve TLS, and present it "
          "when calling other tasks (mutual TLS). Default: plaintext.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificates: verify the servers this process calls, and REQUIRE client "
          "certificates signed by them on this process's port (mutual TLS).");
ABSL_FLAG(std::string, tls_server_name, "",
          "With TLS: the name every server certificate must carry (DNS SAN), checked instead of "
          "the host dialed; one certificate with that name can then serve the whole cluster. "
          "Default: the host of each address dialed.");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding the cluster's shared bearer token: required on every call this process "
          "serves (but health), and sent on every call it makes. Alternative: "
          "$TOWERPS_AUTH_TOKEN (giving both is an error).");

namespace towerps::common {

RpcSecurityOptions RpcSecurityOptionsFromCommandLine() {
  RpcSecurityOptions options;
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  options.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  options.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  const char* env = std::getenv(kAuthTokenEnvVar);
  if (env != nullptr) options.auth_token_env = env;
  return options;
}

absl::StatusOr<std::shared_ptr<const RpcSecurity>> RpcSecurityFromCommandLine(RpcRole role) {
  return RpcSecurity::Create(RpcSecurityOptionsFromCommandLine(), role);
}

}  // namespace towerps::common
