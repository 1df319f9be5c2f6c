#include "common/metrics.h"

#include <pthread.h>

#include "gtest/gtest.h"
#include "prometheus/counter.h"

namespace towerps::common {
namespace {

TEST(MetricsServerTest, PicksAFreePortAndReportsIt) {
  auto server = MetricsServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_GT((*server)->port(), 0);
  auto& family = prometheus::BuildCounter().Name("towerps_test_total").Help("t").Register(
      (*server)->registry());
  family.Add({{"training_job", "j"}}).Increment();
}

TEST(MetricsServerTest, TakenPortIsUnavailableNamingTheAddress) {
  auto first = MetricsServer::Start("127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string address = "127.0.0.1:" + std::to_string((*first)->port());
  auto second = MetricsServer::Start(address);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find(address), std::string::npos) << second.status();
}

TEST(MetricsAddressTest, KeepsTheHostOfTheBindAddress) {
  EXPECT_EQ(MetricsAddress("0.0.0.0:2222", 9100), "0.0.0.0:9100");
  EXPECT_EQ(MetricsAddress("127.0.0.1:2222", 9100), "127.0.0.1:9100");
  EXPECT_EQ(MetricsAddress("[::1]:2222", 9100), "[::1]:9100");
}

// metrics.cc replaces pthread_attr_setstacksize for the whole process, but
// raises only civetweb's requests: any other caller's small stack stays small.
TEST(MetricsStackSizeTest, OtherCallersKeepTheStackTheyAskFor) {
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  constexpr size_t kSmall = 100 * 1024;
  ASSERT_EQ(pthread_attr_setstacksize(&attr, kSmall), 0);
  size_t got = 0;
  ASSERT_EQ(pthread_attr_getstacksize(&attr, &got), 0);
  EXPECT_EQ(got, kSmall);
  pthread_attr_destroy(&attr);
}

}  // namespace
}  // namespace towerps::common
