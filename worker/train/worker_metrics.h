// A worker's Prometheus metrics (issue 14), updated by RunJob as it trains:
//
//   towerps_worker_steps_total{training_job}     gradients this worker pushed
//   towerps_worker_examples_total{training_job}  examples in those gradients
//
// Every series also carries the constant label task ("worker:0").
//
// Thread-safe.
#ifndef TOWERPS_WORKER_TRAIN_WORKER_METRICS_H_
#define TOWERPS_WORKER_TRAIN_WORKER_METRICS_H_

#include <cstdint>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/registry.h"

namespace towerps::worker {

class WorkerMetrics {
 public:
  // Registers the families in `registry`, which must outlive this object.
  WorkerMetrics(prometheus::Registry& registry, const std::string& task);

  // One trained step of `training_job` over `examples` examples.
  void CountIteration(const std::string& training_job, int64_t examples);

 private:
  prometheus::Family<prometheus::Counter>& steps_;
  prometheus::Family<prometheus::Counter>& examples_;
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_TRAIN_WORKER_METRICS_H_
