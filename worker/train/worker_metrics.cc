#include "worker/train/worker_metrics.h"

namespace towerps::worker {

WorkerMetrics::WorkerMetrics(prometheus::Registry& registry, const std::string& task)
    : steps_(prometheus::BuildCounter()
                 .Name("towerps_worker_steps_total")
                 .Help("Training steps this worker ran (one pushed gradient each).")
                 .Labels({{"task", task}})
                 .Register(registry)),
      examples_(prometheus::BuildCounter()
                    .Name("towerps_worker_examples_total")
                    .Help("Training examples in this worker's pushed gradients.")
                    .Labels({{"task", task}})
                    .Register(registry)) {}

void WorkerMetrics::CountIteration(const std::string& training_job, int64_t examples) {
  steps_.Add({{"training_job", training_job}}).Increment();
  examples_.Add({{"training_job", training_job}}).Increment(static_cast<double>(examples));
}

}  // namespace towerps::worker
