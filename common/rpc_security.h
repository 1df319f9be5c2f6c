// Transport security of every channel: TLS or mutual TLS with gRPC's own
// credentials, and a shared bearer token checked on every call (issue 15).
//
// One RpcSecurity is made in main() from the flags (rpc_security_flags) and
// passed to StartServer and NewChannel (common/rpc.h); it is immutable, so
// thread-safe, and shared by every channel and server of the process.
//
// The token travels as "authorization: Bearer <token>" metadata. Servers
// check it on every call before the handler runs, except the standard health
// service (grpc.health.v1.Health), which stays open so that probes that cannot
// send metadata (Kubernetes' grpc probes, load balancers) still work; it
// reveals only SERVING/NOT_SERVING. Server reflection needs the token.
// A missing token is UNAUTHENTICATED, a wrong one PERMISSION_DENIED; neither
// message contains a token.
#ifndef TOWERPS_COMMON_RPC_SECURITY_H_
#define TOWERPS_COMMON_RPC_SECURITY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/client_interceptor.h"

namespace towerps::common {

// The environment variable that may carry the token instead of a file.
inline constexpr char kAuthTokenEnvVar[] = "TOWERPS_AUTH_TOKEN";

// Where the security settings come from: flag values as given. Empty means
// "not given".
struct RpcSecurityOptions {
  // --tls_cert / --tls_key: this process's PEM certificate chain and private
  // key. REQUIRES: both or neither. Servers serve TLS with them; clients
  // present them (mutual TLS) when given.
  std::string tls_cert;
  std::string tls_key;
  // --tls_ca: PEM CA certificates. Clients verify servers with them (the
  // certificate must name the address dialed, e.g. SAN IP:127.0.0.1).
  // Servers then REQUIRE client certificates signed by them (mutual TLS).
  // Default (TLS without --tls_ca): clients use gRPC's default roots and
  // servers ask no client certificate.
  std::string tls_ca;
  // --tls_server_name: the name every server certificate must carry (a DNS
  // SAN), checked instead of the address dialed. Lets one certificate with
  // e.g. SAN DNS:towerps serve a whole cluster whose addresses are not known
  // when it is made (Kubernetes pod names, containers, port-forwards).
  // Needs TLS. Default: the host of the address dialed.
  std::string tls_server_name;
  // --auth_token_file: a file holding the shared token (trailing whitespace
  // and newlines are dropped).
  std::string auth_token_file;
  // The value of $TOWERPS_AUTH_TOKEN, or empty when unset. Giving both this and
  // auth_token_file is an error (ambiguous), never a silent choice.
  std::string auth_token_env;
};

// What a process does with the settings.
enum class RpcRole {
  kServer,           // ps: serves only.
  kServerAndClient,  // worker: serves, and calls the servers and other workers.
  kClient,           // towerctl: calls only.
};

class RpcSecurity {
 public:
  // Reads and checks the files. InvalidArgument naming the flag (and the
  // path) for: a cert without a key or the reverse; an unreadable, empty or
  // non-PEM file; --tls_server_name without TLS or not a host name; an
  // empty token file; a token with characters outside
  // printable ASCII (it must fit an HTTP header); both the token file and
  // $TOWERPS_AUTH_TOKEN set; and, for a role that serves, --tls_ca without a
  // certificate. Never prints a token.
  static absl::StatusOr<std::shared_ptr<const RpcSecurity>> Create(const RpcSecurityOptions& options,
                                                                   RpcRole role);

  // Plaintext, no token: the default when no flag is given.
  static std::shared_ptr<const RpcSecurity> Insecure();

  bool tls() const { return tls_; }
  // Servers require client certificates (mutual TLS).
  bool mutual_tls() const { return tls_ && !ca_pem_.empty(); }
  bool has_token() const { return !token_.empty(); }
  // --tls_server_name, or empty.
  const std::string& tls_server_name() const { return tls_server_name_; }

  // One line for the startup log, naming no secret, e.g. "TLS with client
  // certificates required (mutual TLS), bearer token required". Without TLS
  // it says so (and that a token then crosses the network in the clear).
  std::string Describe() const;

  // Credentials for a server's listening port, with the token check attached
  // when there is a token (also over plaintext: see the .cc).
  std::shared_ptr<grpc::ServerCredentials> ServerCredentials() const;

  // Credentials for a client channel.
  std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials() const;

  // Interceptors that add the token to every call of a channel (empty
  // without a token).
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
  ClientInterceptors() const;

 private:
  RpcSecurity() = default;

  bool tls_ = false;
  std::string cert_pem_;
  std::string key_pem_;
  std::string ca_pem_;
  std::string tls_server_name_;
  std::string token_;
};

// Whether `a` equals `b`, taking time that depends on their lengths only, not
// on where they differ.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// The server's decision for one call of `method` ("/package.Service/Method")
// whose "authorization" metadata values are `authorization` (none: empty).
// OK when `token` is empty (no token configured), for the health service, or
// when one value is exactly "Bearer <token>" (compared in constant time);
// else UNAUTHENTICATED when no value is given, PERMISSION_DENIED when the
// values do not match. The messages never contain a token.
absl::Status CheckBearerToken(absl::string_view method,
                              const std::vector<absl::string_view>& authorization,
                              absl::string_view token);

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_RPC_SECURITY_H_
