// What dataset.cc (shards) and dataset_files.cc (a shard streamed from its
// file) both check about a DataShard. Private to :dataset; internal.
#ifndef TOWERPS_WORKER_MODEL_DATASET_INTERNAL_H_
#define TOWERPS_WORKER_MODEL_DATASET_INTERNAL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "worker/model/dataset.h"

namespace towerps::worker::dataset_internal {

// InvalidArgument unless `shard` names one worker of a positive global batch.
absl::Status CheckShard(const DataShard& shard);

// InvalidArgument: `shard`'s worker owns none of the set's `n` examples.
absl::Status EmptyShardError(const DataShard& shard, int64_t n);

}  // namespace towerps::worker::dataset_internal

#endif  // TOWERPS_WORKER_MODEL_DATASET_INTERNAL_H_
