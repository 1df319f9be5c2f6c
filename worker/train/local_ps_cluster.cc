#include "worker/train/local_ps_cluster.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc.h"
#include "gtest/gtest.h"

namespace towerps::worker {

LocalPsCluster::LocalPsCluster(int num_ps, bool start, bool shared_memory)
    : shared_memory_(shared_memory), servers_(num_ps) {
  if (start) {
    // Each server binds port 0 itself and keeps the port it got: no window
    // in which another process (a client's ephemeral port, a test running
    // beside this one) takes a port reserved for later.
    ports_.assign(num_ps, 0);
    addresses_.assign(num_ps, "127.0.0.1:0");
    for (int i = 0; i < num_ps; ++i) EXPECT_TRUE(Start(i).ok());
    return;
  }
  for (int i = 0; i < num_ps; ++i) {
    // Port 0 picks a free port; reading it back and starting on it again
    // later (gRPC binds with SO_REUSEADDR) gives a stable address per task.
    int port = 0;
    ps::ParameterServer probe_ps({});
    ps::ParameterServiceImpl probe(probe_ps, 1 << 16);
    auto probe_server = common::StartServer("127.0.0.1:0", {&probe}, &port);
    EXPECT_TRUE(probe_server.ok()) << probe_server.status();
    if (probe_server.ok()) (*probe_server)->Shutdown();
    ports_.push_back(port);
    addresses_.push_back(absl::StrCat("127.0.0.1:", port));
  }
}

LocalPsCluster::~LocalPsCluster() {
  for (int i = 0; i < static_cast<int>(servers_.size()); ++i) Stop(i);
}

absl::Status LocalPsCluster::Start(int i) {
  Server& s = servers_[i];
  ps::ParameterServerOptions options = server_options_;
  options.task_index = i;
  s.ps = std::make_unique<ps::ParameterServer>(options);
  s.service =
      std::make_unique<ps::ParameterServiceImpl>(*s.ps, 1 << 16, nullptr, shared_memory_);
  int port = 0;
  auto server = common::StartServer(addresses_[i], {s.service.get()}, &port);
  if (!server.ok()) return server.status();
  if (ports_[i] == 0) {  // the first start of a cluster made with start = true
    ports_[i] = port;
    addresses_[i] = absl::StrCat("127.0.0.1:", port);
  }
  if (port != ports_[i]) {
    return absl::UnavailableError(absl::StrCat("ps ", i, " bound port ", port,
                                               " instead of ", ports_[i]));
  }
  s.grpc = std::move(*server);
  return absl::OkStatus();
}

void LocalPsCluster::Stop(int i) {
  Server& s = servers_[i];
  if (s.grpc == nullptr) return;
  // Waiting pulls end at their max_wait; the deadline cancels them sooner.
  s.grpc->Shutdown(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(100));
  s.grpc->Wait();
  s.grpc.reset();
  s.service.reset();
  s.ps.reset();
}

absl::Status LocalPsCluster::Restart(int i) {
  Stop(i);
  return Start(i);
}

}  // namespace towerps::worker
