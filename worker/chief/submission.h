// Submission checks: what can be checked about a job before it runs, so that
// a bad spec is refused at submit time with the field named rather than
// failing on the cluster later.
//
// Thread-safe (no state). ValidateSubmission builds the model on a CPU
// backend and looks for the data files: it may take a moment, not an RPC.
#ifndef TOWERPS_WORKER_CHIEF_SUBMISSION_H_
#define TOWERPS_WORKER_CHIEF_SUBMISSION_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/paths.h"
#include "proto/job.pb.h"

namespace towerps::worker {

// 1-64 letters, digits, '-', '_' or '.', not starting with '.' (a job_id
// names a directory under the state dir).
bool ValidJobId(const std::string& id);

// Checks what can be checked before a job runs, naming the field:
// ValidateJob, the optimizer and schedule, the model (layers, units), the
// model's input and output widths against the data set, and that the data
// files exist. `job` has defaults applied. InvalidArgument otherwise.
// Also (issue 15, limits): the model's size bounds (CheckModelLimits) and,
// before the model is built here, what a worker would hold for it
// (WorkerTrainingBytes) against `worker_budget_bytes` (the chief's own
// --memory_budget_bytes, taken for every worker's): ResourceExhausted naming
// the flag when over it.
absl::Status ValidateSubmission(const v1::JobSpec& job, int num_workers,
                                int64_t worker_budget_bytes = INT64_MAX);

// Every path the spec names, resolved under the chief's roots and rewritten
// in its absolute normal form: checkpoint.dir and tensorboard_dir under
// `state` (--state_dir; a relative one below it), data.dir under `data`
// (--data_root) for the sources that read files. Empty dirs stay empty (the
// store puts them under the state dir). InvalidArgument naming the field,
// e.g. `job spec: checkpoint.dir "/etc/x" is outside --state_dir "/s"`.
absl::Status ConfineJobPaths(const common::PathRoots& state, const common::PathRoots& data,
                             v1::JobSpec* job);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_CHIEF_SUBMISSION_H_
