#include "common/metrics.h"

#include <dlfcn.h>
#include <pthread.h>

#include <cstddef>
#include <cstring>
#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "prometheus/exposer.h"

// Debian's civetweb (1.15, under prometheus-cpp's Exposer) starts its threads
// with a fixed 100 KiB stack (pthread_attr_setstacksize(0x19000)), and has no
// option to change it. glibc takes the static TLS of every loaded library out
// of a requested stack (glibc bug 11787), and the worker's libraries
// (OpenBLAS, cuBLAS, cuBLASLt) hold more than 100 KiB of it, so
// pthread_create failed with EINVAL and the worker's Exposer could not start.
//
// This definition, exported from the executable (see the linkopts of
// //common:metrics), interposes on libc's, but changes only civetweb's
// requests: when the caller's code lies in libcivetweb (dladdr on the return
// address), a request below 1 MiB becomes 1 MiB (virtual memory, committed as
// used). Every other caller gets libc's behaviour unchanged.
namespace {

bool CalledFromCivetweb(const void* return_address) {
  Dl_info info;
  if (dladdr(return_address, &info) == 0 || info.dli_fname == nullptr) return false;
  return std::strstr(info.dli_fname, "libcivetweb") != nullptr;
}

}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  using Fn = int (*)(pthread_attr_t*, size_t);
  static const Fn real =
      reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  constexpr size_t kCivetwebMinStack = size_t{1} << 20;
  if (size < kCivetwebMinStack && CalledFromCivetweb(__builtin_return_address(0))) {
    size = kCivetwebMinStack;
  }
  return real(attr, size);
}

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

void MetricsServer::Register(const std::weak_ptr<prometheus::Collectable>& collectable) {
  exposer_->RegisterCollectable(collectable);
}

// prometheus-cpp's handler collects under the same mutex that
// RemoveCollectable takes, which gives Remove its guarantee.
void MetricsServer::Remove(const std::weak_ptr<prometheus::Collectable>& collectable) {
  exposer_->RemoveCollectable(collectable);
}

std::string MetricsAddress(const std::string& bind_address, int metrics_port) {
  std::string host = bind_address;
  const size_t colon = bind_address.rfind(':');
  if (colon != std::string::npos) host = bind_address.substr(0, colon);
  if (host.empty()) host = "0.0.0.0";
  return absl::StrCat(host, ":", metrics_port);
}

}  // namespace towerps::common
