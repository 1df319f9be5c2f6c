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

TEST(PsMetricsTest, CountsPushOutcomesAndCheckpoints) {
  prometheus::Registry registry;
  PsMetrics m(registry, "ps:1");
  m.CountPush("j", "applied");
  m.CountPush("j", "applied");
  m.CountPush("j", "stale");
  m.CountSkippedUpdate("j");
  m.RecordCheckpoint(1000, 0.5);
  m.RecordCheckpoint(24, 0.25);
  const std::string text = Scrape(registry);
  for (const char* want :
       {"towerps_ps_pushes_total{task=\"ps:1\",outcome=\"applied\",training_job=\"j\"} 2",
        "towerps_ps_pushes_total{task=\"ps:1\",outcome=\"stale\",training_job=\"j\"} 1",
        "towerps_ps_updates_skipped_total{task=\"ps:1\",training_job=\"j\"} 1",
        "towerps_ps_checkpoint_bytes_total{task=\"ps:1\"} 1024",
        "towerps_ps_checkpoint_seconds_count{task=\"ps:1\"} 2",
        "towerps_ps_checkpoint_seconds_sum{task=\"ps:1\"} 0.75"}) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
}

TEST(PsMetricsTest, CountsRefusalsByReason) {
  prometheus::Registry registry;
  PsMetrics m(registry, "ps:0");
  m.CountRefusal("memory_budget_bytes");
  m.CountRefusal("memory_budget_bytes");
  m.CountRefusal("max_job_bytes");
  const std::string text = Scrape(registry);
  for (const char* want :
       {"towerps_refusals_total{server=\"ps\",task=\"ps:0\",reason=\"memory_budget_bytes\"} 2",
        "towerps_refusals_total{server=\"ps\",task=\"ps:0\",reason=\"max_job_bytes\"} 1"}) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
}

TEST(PsMemoryCollectorTest, ReadsTheBudgetAndTheReservedBytesAtEachScrape) {
  PsMemoryCollector::Reading now{.budget_bytes = 1 << 20, .reserved_bytes = 4096};
  PsMemoryCollector c([&now] { return now; }, "ps:1");
  auto text = [&c] { return prometheus::TextSerializer().Serialize(c.Collect()); };
  std::string t = text();
  EXPECT_NE(t.find("towerps_ps_memory_budget_bytes{task=\"ps:1\"} 1048576"), std::string::npos)
      << t;
  EXPECT_NE(t.find("towerps_ps_memory_reserved_bytes{task=\"ps:1\"} 4096"), std::string::npos)
      << t;
  EXPECT_NE(t.find("# TYPE towerps_ps_memory_reserved_bytes gauge"), std::string::npos) << t;
  // A job deleted, and no budget: read again, the budget's series absent.
  now = {.budget_bytes = 0, .reserved_bytes = 0};
  t = text();
  EXPECT_EQ(t.find("towerps_ps_memory_budget_bytes"), std::string::npos) << t;
  EXPECT_NE(t.find("towerps_ps_memory_reserved_bytes{task=\"ps:1\"} 0"), std::string::npos) << t;
}

TEST(GrpcCodeNameTest, NamesEveryCode) {
  EXPECT_EQ(GrpcCodeName(0), "OK");
  EXPECT_EQ(GrpcCodeName(14), "UNAVAILABLE");
  EXPECT_EQ(GrpcCodeName(16), "UNAUTHENTICATED");
  EXPECT_EQ(GrpcCodeName(99), "UNKNOWN");
}

}  // namespace
}  // namespace towerps::ps
