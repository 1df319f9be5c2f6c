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

}  // namespace
}  // namespace towerps::worker
