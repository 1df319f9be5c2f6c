#include "worker/chief/chief_metrics.h"

#include <map>
#include <utility>

#include "prometheus/client_metric.h"
#include "prometheus/metric_type.h"

namespace towerps::worker {

ChiefJobsCollector::ChiefJobsCollector(std::function<std::vector<v1::JobRecord>()> list_jobs,
                                       std::string task)
    : list_jobs_(std::move(list_jobs)), task_(std::move(task)) {}

std::vector<prometheus::MetricFamily> ChiefJobsCollector::Collect() const {
  std::map<int, int64_t> count;
  for (int s = v1::JobState_MIN; s <= v1::JobState_MAX; ++s) {
    if (v1::JobState_IsValid(s) && s != v1::JOB_STATE_UNSPECIFIED) count[s] = 0;
  }
  for (const v1::JobRecord& r : list_jobs_()) ++count[r.state()];
  prometheus::MetricFamily family;
  family.name = "towerps_chief_jobs";
  family.help = "Jobs the chief knows, by state.";
  family.type = prometheus::MetricType::Gauge;
  for (const auto& [state, n] : count) {
    prometheus::ClientMetric m;
    m.label = {{"task", task_}, {"state", v1::JobState_Name(static_cast<v1::JobState>(state))}};
    m.gauge.value = static_cast<double>(n);
    family.metric.push_back(std::move(m));
  }
  return {std::move(family)};
}

ChiefRefusals::ChiefRefusals(prometheus::Registry& registry, const std::string& task)
    : refusals_(prometheus::BuildCounter()
                    .Name("towerps_refusals_total")
                    .Help("Requests refused by a resource limit, by the limit's name.")
                    .Labels({{"task", task}, {"server", "chief"}})
                    .Register(registry)) {}

void ChiefRefusals::Count(const std::string& reason) {
  refusals_.Add({{"reason", reason}}).Increment();
}

}  // namespace towerps::worker
