// Fuzzes the cluster spec: TF_CONFIG (JSON) and the cluster flags
// (common/cluster_spec). The first byte picks which: even, the rest is a
// TF_CONFIG value; odd, the rest is up to four lines: --ps_hosts,
// --worker_hosts, --job_name, --task_index.
// Invariants: a refusal is InvalidArgument with a message; an accepted spec
// passes ValidateClusterSpec, its own address and task name are readable, and
// WorkersOnSameHost and PsOnSameHost count at most every task of their job
// and at least this one; a spec from flags, printed
// back as flags, parses to the same spec.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/cluster_spec.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using towerps::common::ClusterSpec;

void CheckAccepted(const ClusterSpec& spec) {
  const absl::Status valid = towerps::common::ValidateClusterSpec(spec);
  FUZZ_CHECK(valid.ok(), "an accepted spec does not validate: %s", valid.ToString().c_str());
  FUZZ_CHECK(!spec.self_address().empty(), "empty own address");
  FUZZ_CHECK(!spec.TaskName().empty(), "empty task name");
  const int same = spec.WorkersOnSameHost();
  FUZZ_CHECK(same >= 0 && same <= static_cast<int>(spec.worker.size()), "%d of %zu workers", same,
             spec.worker.size());
  if (spec.job_name == "worker") FUZZ_CHECK(same >= 1, "a worker not on its own host");
  const int ps_same = spec.PsOnSameHost();
  FUZZ_CHECK(ps_same >= 0 && ps_same <= static_cast<int>(spec.ps.size()), "%d of %zu ps", ps_same,
             spec.ps.size());
  if (spec.job_name == "ps") FUZZ_CHECK(ps_same >= 1, "a ps not on its own host");
}

void CheckRefusal(const absl::Status& s) {
  FUZZ_CHECK(s.code() == absl::StatusCode::kInvalidArgument, "%s", s.ToString().c_str());
  FUZZ_CHECK(!s.message().empty(), "a refusal without a message");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    auto spec = towerps::common::ClusterSpecFromTfConfig(rest);
    if (spec.ok()) {
      CheckAccepted(*spec);
    } else {
      CheckRefusal(spec.status());
    }
    auto role = towerps::common::ClusterSpecForRole("ps", "", "", "", 0, rest);
    if (role.ok()) {
      CheckAccepted(*role);
      FUZZ_CHECK(role->job_name == "ps", "role ps gave job %s", role->job_name.c_str());
    } else if (!rest.empty()) {
      CheckRefusal(role.status());
    }
    return 0;
  }
  std::vector<std::string> lines = absl::StrSplit(rest, absl::MaxSplits('\n', 3));
  lines.resize(4);
  int task_index = 0;
  if (!absl::SimpleAtoi(lines[3], &task_index)) task_index = 0;
  auto spec = towerps::common::ClusterSpecFromFlags(lines[0], lines[1], lines[2], task_index);
  if (!spec.ok()) {
    CheckRefusal(spec.status());
    return 0;
  }
  CheckAccepted(*spec);
  auto again = towerps::common::ClusterSpecFromFlags(
      absl::StrJoin(spec->ps, ","), absl::StrJoin(spec->worker, ","), spec->job_name,
      spec->task_index);
  FUZZ_CHECK(again.ok(), "flags printed back are refused: %s", again.status().ToString().c_str());
  FUZZ_CHECK(again->ps == spec->ps && again->worker == spec->worker &&
                 again->job_name == spec->job_name && again->task_index == spec->task_index,
             "flags printed back give another spec");
  return 0;
}
