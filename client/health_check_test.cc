// CheckHealth against an in-process server with gRPC's default health service
// (as common::StartServer sets it up), and against a closed port.
#include "client/health_check.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/rpc.h"
#include "gtest/gtest.h"
#include "proto/ps.grpc.pb.h"

namespace towerps::client {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(10);

// "127.0.0.1:PORT" for a port that was free a moment ago.
std::string DeadAddress() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
}

TEST(CheckHealthTest, FollowsTheServersLifecycle) {
  const std::string name = v1::ParameterService::service_full_name();
  v1::ParameterService::Service service;  // answers UNIMPLEMENTED; never called
  int port = 0;
  auto server = common::StartServer("127.0.0.1:0", {&service}, &port, {name});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = absl::StrCat("127.0.0.1:", port);

  auto state = CheckHealth(address, "", kTimeout);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(*state, ServingState::kNotServing);

  common::SetServing(**server);
  for (const std::string& service_name : {std::string(), name}) {
    state = CheckHealth(address, service_name, kTimeout);
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_EQ(*state, ServingState::kServing) << service_name;
  }
  state = CheckHealth(address, "towerps.v1.NoSuchService", kTimeout);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(*state, ServingState::kServiceUnknown);

  common::BeginDraining(**server);
  state = CheckHealth(address, name, kTimeout);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(*state, ServingState::kNotServing);
  (*server)->Shutdown();
}

TEST(CheckHealthTest, ClosedPortIsUnavailable) {
  auto state = CheckHealth(DeadAddress(), "", absl::Seconds(2));
  ASSERT_FALSE(state.ok());
  EXPECT_TRUE(absl::IsUnavailable(state.status()) || absl::IsDeadlineExceeded(state.status()))
      << state.status();
}

TEST(ServingStateNameTest, StandardNames) {
  EXPECT_STREQ(ServingStateName(ServingState::kServing), "SERVING");
  EXPECT_STREQ(ServingStateName(ServingState::kNotServing), "NOT_SERVING");
  EXPECT_STREQ(ServingStateName(ServingState::kServiceUnknown), "SERVICE_UNKNOWN");
  EXPECT_STREQ(ServingStateName(ServingState::kUnknown), "UNKNOWN");
}

}  // namespace
}  // namespace towerps::client
