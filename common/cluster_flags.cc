#include "common/cluster_flags.h"

#include <cstdlib>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, ps_hosts, "", "Comma-separated host:port of the ps tasks.");
ABSL_FLAG(std::string, worker_hosts, "", "Comma-separated host:port of the worker tasks.");
ABSL_FLAG(std::string, job_name, "", "This task's job: ps or worker.");
ABSL_FLAG(int, task_index, 0, "This task's index within its job.");

namespace towerps::common {

absl::StatusOr<ClusterSpec> ClusterSpecFromCommandLine(const std::string& role) {
  const char* tf_config = std::getenv("TF_CONFIG");
  return ClusterSpecForRole(role, absl::GetFlag(FLAGS_ps_hosts),
                            absl::GetFlag(FLAGS_worker_hosts), absl::GetFlag(FLAGS_job_name),
                            absl::GetFlag(FLAGS_task_index), tf_config ? tf_config : "");
}

bool ClusterFlagsGiven() {
  return !absl::GetFlag(FLAGS_ps_hosts).empty() || !absl::GetFlag(FLAGS_worker_hosts).empty() ||
         !absl::GetFlag(FLAGS_job_name).empty() || absl::GetFlag(FLAGS_task_index) != 0 ||
         std::getenv("TF_CONFIG") != nullptr;
}

}  // namespace towerps::common
