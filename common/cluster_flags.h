// The cluster flags every towerps binary takes (--ps_hosts, --worker_hosts,
// --job_name, --task_index), defined once here and linked into each main().
//
// Call only from main(), after absl::ParseCommandLine.
#ifndef TOWERPS_COMMON_CLUSTER_FLAGS_H_
#define TOWERPS_COMMON_CLUSTER_FLAGS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
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

// Makes --help and --helpshort list the flags towerps defines (in its own
// rooms' files), not only those of a file named after the binary, which is
// absl's default: `ps --help` printed "No flags matched". Call before
// absl::ParseCommandLine.
void ListOwnFlagsInHelp();

// Whether a flag defined in `file` (its __FILE__) is towerps's own.
bool IsOwnFlagFile(absl::string_view file);

}  // namespace towerps::common

#endif  // TOWERPS_COMMON_CLUSTER_FLAGS_H_
