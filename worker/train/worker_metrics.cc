#include "worker/train/worker_metrics.h"

#include <utility>

#include "prometheus/client_metric.h"
#include "prometheus/metric_type.h"

namespace towerps::worker {

WorkerMetrics::WorkerMetrics(prometheus::Registry& registry, const std::string& task)
    : steps_(prometheus::BuildCounter()
                 .Name("towerps_worker_steps_total")
                 .Help("Training steps this worker ran (one pushed gradient each).")
                 .Labels({{"task", task}})
                 .Register(registry)),
      examples_(prometheus::BuildCounter()
                    .Name("towerps_worker_examples_total")
                    .Help("Training examples in this worker's pushed gradients.")
                    .Labels({{"task", task}})
                    .Register(registry)) {}

void WorkerMetrics::CountIteration(const std::string& training_job, int64_t examples) {
  steps_.Add({{"training_job", training_job}}).Increment();
  examples_.Add({{"training_job", training_job}}).Increment(static_cast<double>(examples));
}

DeviceMemoryCollector::DeviceMemoryCollector(const DeviceManager& devices, std::string task)
    : devices_(devices), task_(std::move(task)) {}

std::vector<prometheus::MetricFamily> DeviceMemoryCollector::Collect() const {
  auto family = [](const char* name, const char* help) {
    prometheus::MetricFamily f;
    f.name = name;
    f.help = help;
    f.type = prometheus::MetricType::Gauge;
    return f;
  };
  std::vector<prometheus::MetricFamily> out = {
      family("towerps_worker_device_memory_bytes", "Bytes allocated on the virtual device."),
      family("towerps_worker_device_memory_peak_bytes",
             "Most bytes ever allocated at once on the virtual device."),
      family("towerps_worker_device_memory_limit_bytes",
             "The virtual device's memory limit (devices with a limit only)."),
  };
  auto add = [this](prometheus::MetricFamily& f, const VirtualDevice& d, int64_t value) {
    prometheus::ClientMetric m;
    m.label = {{"task", task_}, {"device", d.short_name()}};
    m.gauge.value = static_cast<double>(value);
    f.metric.push_back(std::move(m));
  };
  for (const VirtualDevice* d : devices_.devices()) {
    add(out[0], *d, d->bytes_in_use());
    add(out[1], *d, d->peak_bytes_in_use());
    if (d->memory_limit() > 0) add(out[2], *d, d->memory_limit());
  }
  return out;
}

}  // namespace towerps::worker
