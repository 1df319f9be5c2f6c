// A worker's Prometheus metrics (issue 14), updated by RunJob as it trains:
//
//   towerps_worker_steps_total{training_job}     gradients this worker pushed
//   towerps_worker_examples_total{training_job}  examples in those gradients
//
// and, read from the devices at each scrape (DeviceMemoryCollector):
//
//   towerps_worker_device_memory_bytes{device}        allocated on each virtual device
//   towerps_worker_device_memory_peak_bytes{device}   its peak
//   towerps_worker_device_memory_limit_bytes{device}  its limit (devices with one only)
//
// Every series also carries the constant label task ("worker:0").
// Examples per second: rate(towerps_worker_examples_total[1m]).
//
// Thread-safe.
#ifndef TOWERPS_WORKER_TRAIN_WORKER_METRICS_H_
#define TOWERPS_WORKER_TRAIN_WORKER_METRICS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "worker/device/device_manager.h"

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

// Memory per virtual device, read at each scrape. `devices` is not owned
// and must outlive every scrape (remove this collector first).
class DeviceMemoryCollector : public prometheus::Collectable {
 public:
  DeviceMemoryCollector(const DeviceManager& devices, std::string task);
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const DeviceManager& devices_;
  const std::string task_;
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_TRAIN_WORKER_METRICS_H_
