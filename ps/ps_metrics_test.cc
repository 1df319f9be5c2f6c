#include "ps/ps_metrics.h"

#include <string>

#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"

namespace towerps::ps {
namespace {

std::string Scrape(prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

TEST(PsMetricsTest, CountsBytesStepsAndRpcsWithTheirLabels) {
  prometheus::Registry registry;
  PsMetrics m(registry, "ps:0");
  m.AddPushBytes("j1", 400);
  m.AddPushBytes("j1", 100);
  m.AddPullBytes("j1", 800);
  m.SetGlobalStep("j1", 7);
  m.RecordRpc("Push", "OK", 0.01);
  m.RecordRpc("Push", "INVALID_ARGUMENT", 0.001);
  const std::string text = Scrape(registry);
  EXPECT_NE(text.find("towerps_ps_push_bytes_total{task=\"ps:0\",training_job=\"j1\"} 500"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("towerps_ps_pull_bytes_total{task=\"ps:0\",training_job=\"j1\"} 800"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("towerps_ps_global_step{task=\"ps:0\",training_job=\"j1\"} 7"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("towerps_ps_requests_total{task=\"ps:0\",code=\"INVALID_ARGUMENT\",method=\"Push\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("towerps_ps_rpc_seconds_count{task=\"ps:0\",method=\"Push\"} 2"),
            std::string::npos)
      << text;
}

TEST(GrpcCodeNameTest, NamesEveryCode) {
  EXPECT_EQ(GrpcCodeName(0), "OK");
  EXPECT_EQ(GrpcCodeName(14), "UNAVAILABLE");
  EXPECT_EQ(GrpcCodeName(16), "UNAUTHENTICATED");
  EXPECT_EQ(GrpcCodeName(99), "UNKNOWN");
}

}  // namespace
}  // namespace towerps::ps
