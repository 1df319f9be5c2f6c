#include "common/rpc_security.h"

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/rpc.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "proto/health.grpc.pb.h"
#include "proto/ps.grpc.pb.h"

namespace towerps::common {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kToken[] = "s3cr3t-Token_value";

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// --- The token check --------------------------------------------------------

TEST(ConstantTimeEqualsTest, EqualOnlyForTheSameBytes) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
  EXPECT_FALSE(ConstantTimeEquals("ab", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
  EXPECT_FALSE(ConstantTimeEquals(std::string("a\0b", 3), std::string("a\0c", 3)));
}

TEST(CheckBearerTokenTest, RightTokenPasses) {
  EXPECT_TRUE(CheckBearerToken("/towerps.v1.ParameterService/Push",
                               {absl::StrCat("Bearer ", kToken)}, kToken)
                  .ok());
}

TEST(CheckBearerTokenTest, MissingTokenIsUnauthenticated) {
  const absl::Status s = CheckBearerToken("/towerps.v1.ParameterService/Push", {}, kToken);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(s.message(), Not(HasSubstr(kToken)));
}

TEST(CheckBearerTokenTest, WrongTokenIsPermissionDeniedAndNamesNoToken) {
  for (const std::string& value :
       {std::string("Bearer wrong"), absl::StrCat("Bearer ", kToken, "x"), std::string(kToken),
        absl::StrCat("Basic ", kToken), std::string("Bearer "), std::string("")}) {
    const absl::Status s = CheckBearerToken("/towerps.v1.JobService/CancelJob", {value}, kToken);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << value;
    EXPECT_THAT(s.message(), Not(HasSubstr(kToken)));
  }
}

TEST(CheckBearerTokenTest, HealthIsOpenAndReflectionIsNot) {
  EXPECT_TRUE(CheckBearerToken("/grpc.health.v1.Health/Check", {}, kToken).ok());
  EXPECT_TRUE(CheckBearerToken("/grpc.health.v1.Health/Watch", {}, kToken).ok());
  EXPECT_EQ(CheckBearerToken("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", {},
                             kToken)
                .code(),
            absl::StatusCode::kUnauthenticated);
  // A method name that only starts like health's is not health.
  EXPECT_EQ(CheckBearerToken("/grpc.health.v1.HealthX/Check", {}, kToken).code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(CheckBearerTokenTest, NoTokenConfiguredLetsEveryCallThrough) {
  EXPECT_TRUE(CheckBearerToken("/towerps.v1.ParameterService/Push", {}, "").ok());
}

// --- Options ----------------------------------------------------------------

TEST(RpcSecurityTest, NoOptionsIsPlaintextWithoutToken) {
  auto s = RpcSecurity::Create({}, RpcRole::kServerAndClient);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE((*s)->tls());
  EXPECT_FALSE((*s)->has_token());
  EXPECT_THAT((*s)->Describe(), HasSubstr("WITHOUT TLS and WITHOUT a token"));
}

TEST(RpcSecurityTest, CertWithoutKeyAndKeyWithoutCertNameTheFlags) {
  RpcSecurityOptions o;
  o.tls_cert = "/x/cert.pem";
  auto s = RpcSecurity::Create(o, RpcRole::kServer);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("--tls_cert=/x/cert.pem needs --tls_key"));
  o = {};
  o.tls_key = "/x/key.pem";
  s = RpcSecurity::Create(o, RpcRole::kClient);
  EXPECT_THAT(s.status().message(), HasSubstr("--tls_key=/x/key.pem needs --tls_cert"));
}

TEST(RpcSecurityTest, UnreadableOrNonPemFilesNameFlagAndPath) {
  RpcSecurityOptions o;
  o.tls_cert = WriteFile("cert.pem", "-----BEGIN CERTIFICATE-----\nxx\n-----END CERTIFICATE-----\n");
  o.tls_key = "/nonexistent/key.pem";
  auto s = RpcSecurity::Create(o, RpcRole::kServer);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("--tls_key=/nonexistent/key.pem: cannot read"));
  o.tls_key = WriteFile("notpem.key", "hello");
  s = RpcSecurity::Create(o, RpcRole::kServer);
  EXPECT_THAT(s.status().message(), HasSubstr("--tls_key=" + o.tls_key + ": not a PEM"));
}

TEST(RpcSecurityTest, ServerWithCaButNoCertIsAnError) {
  RpcSecurityOptions o;
  o.tls_ca = WriteFile("ca.pem", "-----BEGIN CERTIFICATE-----\nxx\n-----END CERTIFICATE-----\n");
  EXPECT_THAT(RpcSecurity::Create(o, RpcRole::kServer).status().message(),
              HasSubstr("needs --tls_cert and --tls_key"));
  // A client may verify servers with a CA and present no certificate.
  auto client = RpcSecurity::Create(o, RpcRole::kClient);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->tls());
}

TEST(RpcSecurityTest, ServerNameNeedsTlsAndMustBeAHostName) {
  RpcSecurityOptions o;
  o.tls_server_name = "towerps";
  EXPECT_THAT(RpcSecurity::Create(o, RpcRole::kClient).status().message(),
              HasSubstr("--tls_server_name=towerps needs TLS"));
  o.tls_ca = WriteFile("ca.pem", "-----BEGIN CERTIFICATE-----\nxx\n-----END CERTIFICATE-----\n");
  auto client = RpcSecurity::Create(o, RpcRole::kClient);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->tls_server_name(), "towerps");
  for (const std::string& bad : std::vector<std::string>{"tower ps", "a/b", "x:2222", std::string(254, 'a')}) {
    o.tls_server_name = bad;
    auto s = RpcSecurity::Create(o, RpcRole::kClient);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.status().message(), HasSubstr("is not a host name")) << bad;
  }
}

TEST(RpcSecurityTest, TokenFileIsTrimmedAndEmptyOrBadTokensAreRefused) {
  RpcSecurityOptions o;
  o.auth_token_file = WriteFile("token", absl::StrCat(kToken, "\n"));
  auto s = RpcSecurity::Create(o, RpcRole::kServer);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE((*s)->has_token());
  EXPECT_THAT((*s)->Describe(), HasSubstr("token is visible"));
  EXPECT_THAT((*s)->Describe(), Not(HasSubstr(kToken)));

  o.auth_token_file = WriteFile("empty_token", "\n");
  s = RpcSecurity::Create(o, RpcRole::kServer);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("--auth_token_file=" + o.auth_token_file));
  EXPECT_THAT(s.status().message(), HasSubstr("empty"));

  o.auth_token_file = WriteFile("spaced_token", "two words");
  s = RpcSecurity::Create(o, RpcRole::kServer);
  EXPECT_THAT(s.status().message(), HasSubstr("printable ASCII"));
  EXPECT_THAT(s.status().message(), Not(HasSubstr("two words")));

  o.auth_token_file = "/nonexistent/token";
  EXPECT_THAT(RpcSecurity::Create(o, RpcRole::kServer).status().message(),
              HasSubstr("--auth_token_file=/nonexistent/token: cannot read"));
}

TEST(RpcSecurityTest, TokenFromEnvOrFileButNotBoth) {
  RpcSecurityOptions o;
  o.auth_token_env = kToken;
  auto s = RpcSecurity::Create(o, RpcRole::kClient);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE((*s)->has_token());
  o.auth_token_file = WriteFile("token2", kToken);
  s = RpcSecurity::Create(o, RpcRole::kClient);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("both set"));
}

// --- A real server over plaintext with a token --------------------------------
// (TLS and mutual TLS are exercised with real certificates by tests/tls_test.sh.)

using EmptyService = v1::ParameterService::Service;  // every method UNIMPLEMENTED

std::shared_ptr<const RpcSecurity> WithToken(const std::string& token) {
  RpcSecurityOptions o;
  o.auth_token_env = token;
  auto s = RpcSecurity::Create(o, RpcRole::kServerAndClient);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

grpc::Status CallGetStatus(int port, const RpcSecurity* security) {
  auto stub = v1::ParameterService::NewStub(NewChannel(absl::StrCat("127.0.0.1:", port), security));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::StatusResponse response;
  return stub->GetStatus(&ctx, v1::StatusRequest(), &response);
}

TEST(PlaintextTokenServerTest, EveryCallButHealthNeedsTheToken) {
  EmptyService service;
  int port = 0;
  const auto server_security = WithToken(kToken);
  auto server = StartServer("127.0.0.1:0", {&service}, &port, {}, server_security.get());
  ASSERT_TRUE(server.ok()) << server.status();

  const grpc::Status missing = CallGetStatus(port, nullptr);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::UNAUTHENTICATED) << missing.error_message();
  EXPECT_THAT(missing.error_message(), Not(HasSubstr(kToken)));

  const auto wrong_security = WithToken("not-the-token");
  const grpc::Status wrong = CallGetStatus(port, wrong_security.get());
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::PERMISSION_DENIED) << wrong.error_message();
  EXPECT_THAT(wrong.error_message(), Not(HasSubstr("not-the-token")));
  EXPECT_THAT(wrong.error_message(), Not(HasSubstr(kToken)));

  // The right token reaches the handler (which answers UNIMPLEMENTED).
  const grpc::Status right = CallGetStatus(port, server_security.get());
  EXPECT_EQ(right.error_code(), grpc::StatusCode::UNIMPLEMENTED) << right.error_message();

  // Health without any token.
  auto health = grpc::health::v1::Health::NewStub(NewChannel(absl::StrCat("127.0.0.1:", port)));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status h = health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &response);
  EXPECT_TRUE(h.ok()) << h.error_message();
  (*server)->Shutdown();
}

}  // namespace
}  // namespace towerps::common
