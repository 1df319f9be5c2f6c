// ExportJob: streams the weights of a job's latest valid checkpoint,
// variable by variable in the model's order, for `towerctl export`.
//
// Thread-safe (no state); blocks reading the checkpoint's shards and calls
// `write` on the calling thread.
#ifndef TOWERPS_WORKER_CHIEF_EXPORTER_H_
#define TOWERPS_WORKER_CHIEF_EXPORTER_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "proto/job_service.pb.h"

namespace towerps::worker {

// Chunks of at most `chunk_bytes` (at least one value); the first chunk of
// each variable carries its definition. FailedPrecondition when the job has
// no usable checkpoint; DataLoss when the checkpoint lacks a variable of the
// model; CANCELLED when `write` returns false; a shard's read error.
absl::Status ExportJob(const v1::JobRecord& record, int64_t chunk_bytes,
                       const std::function<bool(const v1::ExportChunk&)>& write);

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_CHIEF_EXPORTER_H_
