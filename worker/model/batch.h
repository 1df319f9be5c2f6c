// One batch of examples as the model consumes it.
#ifndef TOWERPS_WORKER_MODEL_BATCH_H_
#define TOWERPS_WORKER_MODEL_BATCH_H_

#include <cstdint>
#include <vector>

#include "common/tensor.h"

namespace towerps::worker {

// A plain value; not thread-safe. Buffers are reused across steps (see
// GatherBatch in worker/model/dataset.h), so keep one Batch per loop.
struct Batch {
  // [n, input_dim].
  common::Tensor features;
  // Classification: n class indices. Empty for regression.
  std::vector<int32_t> labels;
  // Regression: [n, output_dim]. Empty (no elements) for classification.
  common::Tensor targets;

  // Number of examples: the first dimension of `features` (0 when unset).
  int64_t size() const { return features.rank() == 0 ? 0 : features.dim(0); }
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_MODEL_BATCH_H_
