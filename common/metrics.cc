#include "common/metrics.h"

#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "prometheus/exposer.h"

namespace towerps::common {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address) {
  auto registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<prometheus::Exposer> exposer;
  // prometheus-cpp reports a port it cannot bind by throwing (civetweb's
  // CivetException); errors are values past this point.
  try {
    exposer = std::make_unique<prometheus::Exposer>(address, /*num_threads=*/1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot listen on ", address, " (port taken?): ", e.what()));
  }
  exposer->RegisterCollectable(registry);
  const std::vector<int> ports = exposer->GetListeningPorts();
  const int port = ports.empty() ? 0 : ports.front();
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(exposer), registry, port));
}

MetricsServer::MetricsServer(std::unique_ptr<prometheus::Exposer> exposer,
                             std::shared_ptr<prometheus::Registry> registry, int port)
    : registry_(std::move(registry)), exposer_(std::move(exposer)), port_(port) {}

MetricsServer::~MetricsServer() = default;

std::string MetricsAddress(const std::string& bind_address, int metrics_port) {
  std::string host = bind_address;
  const size_t colon = bind_address.rfind(':');
  if (colon != std::string::npos) host = bind_address.substr(0, colon);
  if (host.empty()) host = "0.0.0.0";
  return absl::StrCat(host, ":", metrics_port);
}

}  // namespace towerps::common
