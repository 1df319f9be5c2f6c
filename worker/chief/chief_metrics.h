// The chief's Prometheus metrics (issue 14), computed at each scrape from the
// job records:
//
//   towerps_chief_jobs{state}   jobs in each JobState (every state, 0 included)
//
// with the constant label task ("worker:0"), and (ChiefRefusals)
//
//   towerps_refusals_total{server="chief",reason}   submits refused by a limit
//
// Thread-safe if `list_jobs` is.
#ifndef TOWERPS_WORKER_CHIEF_CHIEF_METRICS_H_
#define TOWERPS_WORKER_CHIEF_CHIEF_METRICS_H_

#include <functional>
#include <string>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/registry.h"
#include "prometheus/metric_family.h"
#include "proto/job_service.pb.h"

namespace towerps::worker {

class ChiefJobsCollector : public prometheus::Collectable {
 public:
  // `list_jobs`: every job record (JobManager::List). Called at each scrape.
  ChiefJobsCollector(std::function<std::vector<v1::JobRecord>()> list_jobs, std::string task);

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const std::function<std::vector<v1::JobRecord>()> list_jobs_;
  const std::string task_;
};

// Counts the chief's refusals by limit (JobManagerOptions.on_refusal).
// Thread-safe.
class ChiefRefusals {
 public:
  // Registers the family in `registry`, which must outlive this object.
  ChiefRefusals(prometheus::Registry& registry, const std::string& task);
  void Count(const std::string& reason);

 private:
  prometheus::Family<prometheus::Counter>& refusals_;
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_CHIEF_CHIEF_METRICS_H_
