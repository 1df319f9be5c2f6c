#include "common/cluster_flags.h"

#include <cstdlib>

#include "absl/flags/flag.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"

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

bool IsOwnFlagFile(absl::string_view file) {
  absl::ConsumePrefix(&file, "./");
  for (absl::string_view room : {"ps/", "worker/", "client/", "common/", "tests/"}) {
    if (absl::StartsWith(file, room)) return true;
  }
  return false;
}

void ListOwnFlagsInHelp() {
  absl::FlagsUsageConfig config;
  config.contains_help_flags = IsOwnFlagFile;
  config.contains_helpshort_flags = IsOwnFlagFile;
  absl::SetFlagsUsageConfig(config);
}

}  // namespace towerps::common
