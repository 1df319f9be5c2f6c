// The cluster flags every towerps binary takes (--ps_hosts, --worker_hosts,
// --job_name, --task_index), defined once here and linked into each main().
//
// Call only from main(), after absl::ParseCommandLine.
#ifndef TOWERPS_COMMON_CLUSTER_FLAGS_H_
#define TOWERPS_COMMON_CLUSTER_FLAGS_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/cluster_spec.h"

namespace towerps::common {

// The spec from the flags, or from the TF_CONFIG environment variable when no
// cluster flag is set; InvalidArgument if it is malformed or names a job other
// than `role`.
absl::StatusOr<ClusterSpec> ClusterSpecFromCommandLine(const std::string& role);

// Whether any cluster flag (--ps_hosts, --worker_hosts, --job_name,
// --task_index other than 0) or TF_CONFIG is set: a command that can run
// without a cluster (worker --print_job_spec) resolves one only then.
bool ClusterFlagsGiven();

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_CLUSTER_FLAGS_H_
