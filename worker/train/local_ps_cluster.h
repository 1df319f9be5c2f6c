// Test-only: real parameter servers (ps/ logic and its gRPC adapter) on
// 127.0.0.1 ephemeral ports inside the test process, which the worker-side
// tests (ps client, trainer, job runner, worker service) talk to over real
// gRPC. A server can be stopped and started again on the same port: the new
// one is a new incarnation that holds no job, as after a process restart.
//
// Thread-compatible: one test thread drives it. The servers themselves are
// thread-safe.
#ifndef TOWERPS_WORKER_TRAIN_LOCAL_PS_CLUSTER_H_
#define TOWERPS_WORKER_TRAIN_LOCAL_PS_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/server.h"
#include "ps/parameter_server.h"
#include "ps/ps_service.h"

namespace towerps::worker {

class LocalPsCluster {
 public:
  // Starts `num_ps` servers, each on a port of its own choosing (127.0.0.1:0),
  // which Restart keeps. With `start` false, reserves the ports instead (binds
  // each once on 127.0.0.1:0) and starts nothing: addresses() already names
  // the ports that Start(i) will use, so a client can be pointed at a server
  // that is not up yet (another process may take a reserved port meanwhile:
  // Start then fails with Unavailable).
  // `shared_memory`: whether the servers write pulls into clients' shared
  // memory segments (ps --shared_memory).
  explicit LocalPsCluster(int num_ps, bool start = true, bool shared_memory = true);
  ~LocalPsCluster();
  LocalPsCluster(const LocalPsCluster&) = delete;
  LocalPsCluster& operator=(const LocalPsCluster&) = delete;

  // Options for the servers Start makes from now on (each gets its own
  // task_index); e.g. a test's hooks. Default: ParameterServerOptions().
  void set_server_options(ps::ParameterServerOptions options) {
    server_options_ = std::move(options);
  }

  // Starts ps `i` (a fresh ParameterServer, holding no job) on its port.
  // REQUIRES: not running. Unavailable if the port cannot be bound again.
  absl::Status Start(int i);
  // Shuts ps `i` down (in-flight calls are cancelled) and frees its state.
  void Stop(int i);
  // Stop then Start: a new incarnation on the same address.
  absl::Status Restart(int i);

  const std::vector<std::string>& addresses() const { return addresses_; }
  // REQUIRES: ps `i` running.
  ps::ParameterServer& server(int i) { return *servers_[i].ps; }
  ps::ParameterServiceImpl& service(int i) { return *servers_[i].service; }
  bool running(int i) const { return servers_[i].grpc != nullptr; }

 private:
  struct Server {
    std::unique_ptr<ps::ParameterServer> ps;
    std::unique_ptr<ps::ParameterServiceImpl> service;
    std::unique_ptr<grpc::Server> grpc;
  };
  std::vector<std::string> addresses_;
  bool shared_memory_ = true;
  ps::ParameterServerOptions server_options_;
  std::vector<int> ports_;
  std::vector<Server> servers_;
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_TRAIN_LOCAL_PS_CLUSTER_H_
