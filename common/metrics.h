// Prometheus metrics for a process: one registry served over HTTP at
// /metrics by prometheus-cpp's Exposer (no HTTP code of ours).
//
// Naming: base units, `_total` on counters, `_seconds` and `_bytes` on
// amounts; labels `training_job` (a job id) and `task` (never `job` or
// `instance`, which Prometheus itself attaches to every scraped series).
//
// Thread-safe: metrics created from registry() may be updated from any thread.
#ifndef TOWERPS_COMMON_METRICS_H_
#define TOWERPS_COMMON_METRICS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "prometheus/registry.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace towerps::common {

class MetricsServer {
 public:
  // Serves the registry on `address` ("host:port"; port 0 picks a free one).
  // Unavailable, naming the address, when it cannot be bound (a port taken).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address);

  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Where metrics are registered. Lives as long as this server.
  prometheus::Registry& registry() { return *registry_; }
  // The port actually bound.
  int port() const { return port_; }

  // Also serves what `collectable` (computed at each scrape) collects. The
  // caller keeps it alive; Collect() runs on the HTTP thread.
  void Register(const std::weak_ptr<prometheus::Collectable>& collectable);
  // Stops serving it. When this returns, no Collect() call on it is running,
  // so what it reads may then be destroyed.
  void Remove(const std::weak_ptr<prometheus::Collectable>& collectable);

 private:
  MetricsServer(std::unique_ptr<prometheus::Exposer> exposer,
                std::shared_ptr<prometheus::Registry> registry, int port);

  const std::shared_ptr<prometheus::Registry> registry_;
  const std::unique_ptr<prometheus::Exposer> exposer_;
  const int port_;
};

// "<host>:<port>" for the metrics endpoint: the host of `bind_address`
// ("host:port", as the gRPC server binds) with `metrics_port`.
std::string MetricsAddress(const std::string& bind_address, int metrics_port);

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_METRICS_H_
