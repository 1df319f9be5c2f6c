#include "worker/chief/chief_metrics.h"

#include <string>

#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"

namespace towerps::worker {
namespace {

v1::JobRecord Record(v1::JobState state) {
  v1::JobRecord r;
  r.set_state(state);
  return r;
}

TEST(ChiefJobsCollectorTest, CountsJobsByStateWithZeros) {
  std::vector<v1::JobRecord> jobs = {Record(v1::QUEUED), Record(v1::QUEUED), Record(v1::RUNNING)};
  ChiefJobsCollector c([&jobs] { return jobs; }, "worker:0");
  std::string text = prometheus::TextSerializer().Serialize(c.Collect());
  for (const char* want : {"# TYPE towerps_chief_jobs gauge",
                           "towerps_chief_jobs{task=\"worker:0\",state=\"QUEUED\"} 2",
                           "towerps_chief_jobs{task=\"worker:0\",state=\"RUNNING\"} 1",
                           "towerps_chief_jobs{task=\"worker:0\",state=\"CANCELLED\"} 0"}) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
  jobs.push_back(Record(v1::CANCELLED));  // read again at the next scrape
  text = prometheus::TextSerializer().Serialize(c.Collect());
  EXPECT_NE(text.find("state=\"CANCELLED\"} 1"), std::string::npos) << text;
}

TEST(ChiefRefusalsTest, CountsByReason) {
  prometheus::Registry registry;
  ChiefRefusals r(registry, "worker:0");
  r.Count("spec_limits");
  r.Count("spec_limits");
  r.Count("max_queued_jobs");
  const std::string text = prometheus::TextSerializer().Serialize(registry.Collect());
  for (const char* want :
       {"towerps_refusals_total{server=\"chief\",task=\"worker:0\",reason=\"spec_limits\"} 2",
        "towerps_refusals_total{server=\"chief\",task=\"worker:0\",reason=\"max_queued_jobs\"} 1"}) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
}

}  // namespace
}  // namespace towerps::worker
