#include "common/rpc_security.h"

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/security/auth_metadata_processor.h"

namespace towerps::common {
namespace {

constexpr absl::string_view kBearerPrefix = "Bearer ";
// Calls that need no token: the standard health service, for probes.
constexpr absl::string_view kOpenServicePrefix = "/grpc.health.v1.Health/";
constexpr size_t kMaxTokenBytes = 4096;
constexpr size_t kMaxPemBytes = 1 << 20;

absl::StatusOr<std::string> ReadSmallFile(const std::string& flag, const std::string& path,
                                          size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", path, ": cannot read: ", std::strerror(errno)));
  }
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": read error"));
  }
  std::string text = buf.str();
  if (text.size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", path, ": larger than ", max_bytes, " bytes"));
  }
  return text;
}

absl::StatusOr<std::string> ReadPem(const std::string& flag, const std::string& path,
                                    absl::string_view must_contain, absl::string_view what) {
  absl::StatusOr<std::string> text = ReadSmallFile(flag, path, kMaxPemBytes);
  if (!text.ok()) return text.status();
  if (!absl::StrContains(*text, "-----BEGIN ") || !absl::StrContains(*text, must_contain)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", path, ": not a PEM ", what, " (no \"", must_contain, "\")"));
  }
  return text;
}

// The token's source is named, never its value.
absl::Status CheckToken(absl::string_view token, absl::string_view source) {
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat(source, ": the token is empty"));
  if (token.size() > kMaxTokenBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": the token is longer than ", kMaxTokenBytes, " bytes"));
  }
  for (const char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": the token may hold only printable ASCII without spaces (it is sent as an "
                  "HTTP/2 header)"));
    }
  }
  return absl::OkStatus();
}

absl::string_view SliceView(const grpc_slice& s) {
  return absl::string_view(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(s)),
                           GRPC_SLICE_LENGTH(s));
}

// The token check as gRPC's server auth filter calls it, for TLS ports: runs
// on every call before the handler, on the call's own thread (not blocking).
class BearerTokenProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit BearerTokenProcessor(std::string token) : token_(std::move(token)) {}

  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* /*context*/,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* /*response_metadata*/) override {
    absl::string_view method;
    std::vector<absl::string_view> authorization;
    for (const auto& [key, value] : auth_metadata) {
      const absl::string_view k(key.data(), key.size());
      const absl::string_view v(value.data(), value.size());
      if (k == ":path") method = v;
      if (k == "authorization") {
        authorization.push_back(v);
        // Handlers never see the token.
        consumed_auth_metadata->emplace(std::string(k), std::string(v));
      }
    }
    const absl::Status s = CheckBearerToken(method, authorization, token_);
    return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
  }

 private:
  const std::string token_;
};

// The same check through gRPC's C API, for plaintext ports (below).
void ProcessPlaintextCall(void* state, grpc_auth_context* /*context*/, const grpc_metadata* md,
                          size_t num_md, grpc_process_auth_metadata_done_cb done,
                          void* user_data) {
  const auto& token = *static_cast<const std::string*>(state);
  absl::string_view method;
  std::vector<absl::string_view> authorization;
  std::vector<grpc_metadata> consumed;
  for (size_t i = 0; i < num_md; ++i) {
    const absl::string_view k = SliceView(md[i].key);
    if (k == ":path") method = SliceView(md[i].value);
    if (k == "authorization") {
      authorization.push_back(SliceView(md[i].value));
      consumed.push_back(md[i]);
    }
  }
  const absl::Status s = CheckBearerToken(method, authorization, token);
  const std::string message(s.message());
  done(user_data, consumed.data(), consumed.size(), nullptr, 0,
       static_cast<grpc_status_code>(s.code()), s.ok() ? nullptr : message.c_str());
}

// Plaintext with a token. gRPC 1.51's InsecureServerCredentials() takes no
// AuthMetadataProcessor (it aborts), but the core's insecure credentials
// go through the same server auth filter as TLS, so the token is checked on
// every call in the same place. ServerCredentials' port hook is a private
// virtual, which a derived class may override.
class PlaintextWithTokenServerCredentials final : public grpc::ServerCredentials {
 public:
  explicit PlaintextWithTokenServerCredentials(const std::string& token)
      : creds_(grpc_insecure_server_credentials_create()) {
    grpc_auth_metadata_processor processor;
    processor.process = &ProcessPlaintextCall;
    processor.destroy = [](void* state) { delete static_cast<std::string*>(state); };
    processor.state = new std::string(token);
    grpc_server_credentials_set_auth_metadata_processor(creds_, processor);
  }
  ~PlaintextWithTokenServerCredentials() override { grpc_server_credentials_release(creds_); }

  void SetAuthMetadataProcessor(
      const std::shared_ptr<grpc::AuthMetadataProcessor>& /*processor*/) override {
    // Ours is set in the constructor; nothing else calls this.
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    return grpc_server_add_http2_port(server, addr.c_str(), creds_);
  }

  grpc_server_credentials* const creds_;
};

class BearerTokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(const std::string& header) : header_(header) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", header_);
    }
    methods->Proceed();
  }

 private:
  const std::string& header_;  // Owned by the factory, which outlives its channel's calls.
};

class BearerTokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenInterceptorFactory(const std::string& token)
      : header_(absl::StrCat(kBearerPrefix, token)) {}

  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new BearerTokenInterceptor(header_);
  }

 private:
  const std::string header_;
};

}  // namespace

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Every byte of `a` is compared (against `b` or against itself), so the
  // time depends on the lengths only.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    const unsigned char other = i < b.size() ? static_cast<unsigned char>(b[i])
                                             : static_cast<unsigned char>(~a[i]);
    diff |= static_cast<unsigned char>(a[i]) ^ other;
  }
  return diff == 0;
}

absl::Status CheckBearerToken(absl::string_view method,
                              const std::vector<absl::string_view>& authorization,
                              absl::string_view token) {
  if (token.empty() || absl::StartsWith(method, kOpenServicePrefix)) return absl::OkStatus();
  if (authorization.empty()) {
    return absl::UnauthenticatedError(
        "missing bearer token: this server requires \"authorization: Bearer <token>\" "
        "(towerctl: --auth_token_file or $TOWERPS_AUTH_TOKEN)");
  }
  bool match = false;
  for (absl::string_view value : authorization) {
    const bool bearer = absl::StartsWith(value, kBearerPrefix);
    if (bearer) value.remove_prefix(kBearerPrefix.size());
    match |= bearer & ConstantTimeEquals(value, token);
  }
  if (!match) return absl::PermissionDeniedError("wrong bearer token");
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const RpcSecurity>> RpcSecurity::Create(
    const RpcSecurityOptions& options, RpcRole role) {
  auto security = std::shared_ptr<RpcSecurity>(new RpcSecurity());
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError(
        options.tls_cert.empty()
            ? absl::StrCat("--tls_key=", options.tls_key, " needs --tls_cert (its certificate)")
            : absl::StrCat("--tls_cert=", options.tls_cert, " needs --tls_key (its private key)"));
  }
  if (role != RpcRole::kClient && !options.tls_ca.empty() && options.tls_cert.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_ca=", options.tls_ca,
        " needs --tls_cert and --tls_key: a server cannot serve TLS without its certificate"));
  }
  if (!options.tls_cert.empty()) {
    absl::StatusOr<std::string> cert =
        ReadPem("tls_cert", options.tls_cert, "CERTIFICATE-----", "certificate");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key =
        ReadPem("tls_key", options.tls_key, "PRIVATE KEY-----", "private key");
    if (!key.ok()) return key.status();
    security->cert_pem_ = std::move(*cert);
    security->key_pem_ = std::move(*key);
  }
  if (!options.tls_ca.empty()) {
    absl::StatusOr<std::string> ca =
        ReadPem("tls_ca", options.tls_ca, "CERTIFICATE-----", "CA certificate");
    if (!ca.ok()) return ca.status();
    security->ca_pem_ = std::move(*ca);
  }
  security->tls_ = !options.tls_cert.empty() || !options.tls_ca.empty();
  if (!options.tls_server_name.empty()) {
    if (!security->tls_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tls_server_name=", options.tls_server_name,
          " needs TLS (--tls_ca, or --tls_cert and --tls_key): a plaintext channel checks no "
          "certificate"));
    }
    const bool host_name =
        options.tls_server_name.size() <= 253 &&
        absl::c_all_of(options.tls_server_name, [](char c) {
          return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-';
        });
    if (!host_name) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tls_server_name=\"", absl::CHexEscape(options.tls_server_name),
                       "\" is not a host name (letters, digits, '.' and '-')"));
    }
    security->tls_server_name_ = options.tls_server_name;
  }

  if (!options.auth_token_file.empty() && !options.auth_token_env.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--auth_token_file=", options.auth_token_file, " and $", kAuthTokenEnvVar,
        " are both set: give the token one way only"));
  }
  if (!options.auth_token_file.empty()) {
    absl::StatusOr<std::string> text =
        ReadSmallFile("auth_token_file", options.auth_token_file, 64 << 10);
    if (!text.ok()) return text.status();
    const std::string source = absl::StrCat("--auth_token_file=", options.auth_token_file);
    const absl::string_view token = absl::StripTrailingAsciiWhitespace(*text);
    if (auto s = CheckToken(token, source); !s.ok()) return s;
    security->token_ = std::string(token);
  } else if (!options.auth_token_env.empty()) {
    const absl::string_view token = absl::StripTrailingAsciiWhitespace(options.auth_token_env);
    if (auto s = CheckToken(token, absl::StrCat("$", kAuthTokenEnvVar)); !s.ok()) return s;
    security->token_ = std::string(token);
  }
  return std::shared_ptr<const RpcSecurity>(std::move(security));
}

std::shared_ptr<const RpcSecurity> RpcSecurity::Insecure() {
  static const auto* const insecure =
      new std::shared_ptr<const RpcSecurity>(new RpcSecurity());
  return *insecure;
}

std::string RpcSecurity::Describe() const {
  std::string tls =
      !tls_ ? "plaintext (no TLS)"
      : mutual_tls()
          ? "TLS, client certificates required and verified against --tls_ca (mutual TLS)"
          : (ca_pem_.empty() ? "TLS (servers verified against gRPC's default roots)"
                             : "TLS (servers verified against --tls_ca)");
  if (!tls_ && token_.empty()) {
    return "serving and calling WITHOUT TLS and WITHOUT a token: anyone who reaches the ports "
           "can call every RPC (see --tls_cert/--tls_key/--tls_ca and --auth_token_file)";
  }
  if (token_.empty()) return absl::StrCat(tls, "; no bearer token");
  return absl::StrCat(tls, "; bearer token required on every call but health",
                      tls_ ? "" : " (WARNING: without TLS the token is visible on the network)");
}

std::shared_ptr<grpc::ServerCredentials> RpcSecurity::ServerCredentials() const {
  if (!tls_ || cert_pem_.empty()) {
    if (token_.empty()) return grpc::InsecureServerCredentials();
    return std::make_shared<PlaintextWithTokenServerCredentials>(token_);
  }
  grpc::SslServerCredentialsOptions ssl(
      ca_pem_.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                      : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = ca_pem_;
  ssl.pem_key_cert_pairs.push_back({key_pem_, cert_pem_});
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::SslServerCredentials(ssl);
  if (!token_.empty()) {
    creds->SetAuthMetadataProcessor(std::make_shared<BearerTokenProcessor>(token_));
  }
  return creds;
}

std::shared_ptr<grpc::ChannelCredentials> RpcSecurity::ChannelCredentials() const {
  if (!tls_) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ca_pem_;
  ssl.pem_private_key = key_pem_;
  ssl.pem_cert_chain = cert_pem_;
  return grpc::SslCredentials(ssl);
}

std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
RpcSecurity::ClientInterceptors() const {
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> out;
  if (!token_.empty()) out.push_back(std::make_unique<BearerTokenInterceptorFactory>(token_));
  return out;
}

}  // namespace towerps::common
