// PsControl: the chief's control calls to one parameter server (free a
// job's variables, write a checkpoint shard, report status). The data plane
// (register, push, pull) is the workers' ps client, not this.
//
// Implementations are thread-safe. Each call blocks until the server answers
// or `timeout` passes (DeadlineExceeded); Unavailable when it cannot be
// reached; otherwise the server's own error.
#ifndef TOWERPS_WORKER_CHIEF_PS_CONTROL_H_
#define TOWERPS_WORKER_CHIEF_PS_CONTROL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc_security.h"
#include "proto/ps.pb.h"

namespace towerps::worker {

class PsControl {
 public:
  virtual ~PsControl() = default;

  // Frees `job_id` on the server (OK, existed() false, if it held nothing).
  // Waits for a server that is not up yet, until `timeout`.
  virtual absl::StatusOr<v1::DeleteJobResponse> DeleteJob(const std::string& job_id,
                                                          absl::Duration timeout) = 0;
  // Writes the server's shard of request.job_id() under request's dir.
  virtual absl::StatusOr<v1::SaveResponse> SaveCheckpoint(const v1::SaveRequest& request,
                                                          absl::Duration timeout) = 0;
  // The status of `job_id` (no job: every job the server holds).
  virtual absl::StatusOr<v1::StatusResponse> GetStatus(const std::string& job_id,
                                                       absl::Duration timeout) = 0;
};

// A ps process at `address` ("host:port").
std::unique_ptr<PsControl> NewGrpcPsControl(
    const std::string& address, std::shared_ptr<const common::RpcSecurity> security);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_CHIEF_PS_CONTROL_H_
