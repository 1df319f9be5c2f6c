#include "common/rpc.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "grpcpp/client_context.h"
#include "proto/health.grpc.pb.h"
#include "proto/ps.grpc.pb.h"

namespace towerps::common {
namespace {

using ::testing::HasSubstr;

// Any generated service will do: its methods all answer UNIMPLEMENTED.
using EmptyService = v1::ParameterService::Service;

TEST(StartServerTest, PicksAFreePortForPortZero) {
  EmptyService service;
  int port = 0;
  auto server = StartServer("127.0.0.1:0", {&service}, &port);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_GT(port, 0);
  (*server)->Shutdown();
}

// gRPC turns SO_REUSEPORT on by default, so a second server on a taken port
// used to start and share the calls; now it is an error naming the cause.
TEST(StartServerTest, SecondServerOnATakenPortFailsWithAddressInUse) {
  for (const std::string host : {"127.0.0.1", "0.0.0.0"}) {
    EmptyService first_service, second_service;
    int port = 0;
    auto first = StartServer(absl::StrCat(host, ":0"), {&first_service}, &port);
    ASSERT_TRUE(first.ok()) << first.status();
    const std::string address = absl::StrCat(host, ":", port);
    int second_port = -1;
    auto second = StartServer(address, {&second_service}, &second_port);
    ASSERT_FALSE(second.ok()) << "a second server started on " << address;
    EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(second.status().message(), HasSubstr(address));
    EXPECT_THAT(second.status().message(), HasSubstr("address in use"));
    EXPECT_THAT(second.status().message(), HasSubstr(absl::StrCat("port ", port)));
    EXPECT_EQ(second_port, -1);
    (*first)->Shutdown();
  }
}

TEST(StartServerTest, MalformedAddressNamesTheProblem) {
  EmptyService service;
  int port = 0;
  auto server = StartServer("127.0.0.1:notaport", {&service}, &port);
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(), HasSubstr("127.0.0.1:notaport"));
  EXPECT_THAT(server.status().message(), HasSubstr("invalid port"));
}

// Asks the server's grpc.health.v1.Health about `service`; NOT_FOUND (an
// unknown name) reads as SERVICE_UNKNOWN.
grpc::health::v1::HealthCheckResponse::ServingStatus Check(int port, const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(NewChannel(absl::StrCat("127.0.0.1:", port)));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&ctx, request, &response);
  if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
    return grpc::health::v1::HealthCheckResponse::SERVICE_UNKNOWN;
  }
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response.status();
}

TEST(HealthTest, NotServingUntilReadyThenServingThenNotServingWhenDraining) {
  using Response = grpc::health::v1::HealthCheckResponse;
  const std::string name = v1::ParameterService::service_full_name();
  EmptyService service;
  int port = 0;
  auto server = StartServer("127.0.0.1:0", {&service}, &port, {name});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(Check(port, ""), Response::NOT_SERVING);
  EXPECT_EQ(Check(port, name), Response::NOT_SERVING);
  EXPECT_EQ(Check(port, "no.such.Service"), Response::SERVICE_UNKNOWN);

  SetServing(**server);
  EXPECT_EQ(Check(port, ""), Response::SERVING);
  EXPECT_EQ(Check(port, name), Response::SERVING);
  EXPECT_EQ(Check(port, "no.such.Service"), Response::SERVICE_UNKNOWN);

  BeginDraining(**server);
  EXPECT_EQ(Check(port, ""), Response::NOT_SERVING);
  EXPECT_EQ(Check(port, name), Response::NOT_SERVING);
  SetServing(**server);  // too late: draining is final
  EXPECT_EQ(Check(port, ""), Response::NOT_SERVING);
  (*server)->Shutdown();
}

}  // namespace
}  // namespace towerps::common
