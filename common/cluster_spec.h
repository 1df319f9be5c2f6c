// The cluster spec: which ps and worker tasks exist, and which one this
// process is. Read once in main() from flags or from TF_CONFIG.
//
// Thread-compatible value type.
#ifndef TOWERPS_COMMON_CLUSTER_SPEC_H_
#define TOWERPS_COMMON_CLUSTER_SPEC_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace towerps::common {

struct ClusterSpec {
  std::vector<std::string> ps;      // "host:port", one per ps task.
  std::vector<std::string> worker;  // "host:port", one per worker task; 0 is the chief.
  std::string job_name;             // "ps" or "worker".
  int task_index = 0;

  bool is_chief() const { return job_name == "worker" && task_index == 0; }
  // This task's own address.
  const std::string& self_address() const {
    return job_name == "ps" ? ps[task_index] : worker[task_index];
  }
  // "/job:worker/replica:0/task:1".
  std::string TaskName() const;
  // Worker tasks (this one included, if it is a worker) whose address names
  // the same host as this task's: the processes that share this machine's
  // cores. Loopback names (localhost, 127.0.0.0/8, ::1) are one host. Hosts
  // are compared by name: two names of one machine count as two hosts.
  int WorkersOnSameHost() const;
  // Ps tasks (this one included, if it is a ps) on the same host as this
  // task, by the same rule: the servers whose updates and copies share this
  // machine's cores with its workers' compute.
  int PsOnSameHost() const;
};

// Builds a spec from --ps_hosts/--worker_hosts (comma-separated host:port),
// --job_name and --task_index. Returns InvalidArgument naming the problem.
absl::StatusOr<ClusterSpec> ClusterSpecFromFlags(const std::string& ps_hosts,
                                                 const std::string& worker_hosts,
                                                 const std::string& job_name,
                                                 int task_index);

// Parses TF_CONFIG: {"cluster": {"ps": [...], "worker": [...], "chief": [...]},
// "task": {"type": "worker", "index": 0}}. A "chief" entry (as TFJob writes it)
// becomes worker 0 and shifts the workers after it.
absl::StatusOr<ClusterSpec> ClusterSpecFromTfConfig(const std::string& json);

// Flags win when any of --ps_hosts/--worker_hosts/--job_name is set; otherwise
// `tf_config` (the environment variable's value) is used if non-empty.
absl::StatusOr<ClusterSpec> ResolveClusterSpec(const std::string& ps_hosts,
                                               const std::string& worker_hosts,
                                               const std::string& job_name,
                                               int task_index,
                                               const std::string& tf_config);

// ResolveClusterSpec for a binary that runs `role` tasks ("ps" or "worker"):
// InvalidArgument if the spec names another job.
absl::StatusOr<ClusterSpec> ClusterSpecForRole(const std::string& role,
                                               const std::string& ps_hosts,
                                               const std::string& worker_hosts,
                                               const std::string& job_name,
                                               int task_index,
                                               const std::string& tf_config);

// Checks job name, index range, host:port syntax and duplicate addresses.
absl::Status ValidateClusterSpec(const ClusterSpec& spec);

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_CLUSTER_SPEC_H_
