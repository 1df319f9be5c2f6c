#include "worker/train/worker_metrics.h"

#include <string>

#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"

namespace towerps::worker {
namespace {

TEST(WorkerMetricsTest, CountsStepsAndExamplesPerJob) {
  prometheus::Registry registry;
  WorkerMetrics m(registry, "worker:0");
  m.CountIteration("a", 32);
  m.CountIteration("a", 32);
  m.CountIteration("b", 10);
  const std::string text = prometheus::TextSerializer().Serialize(registry.Collect());
  for (const char* want : {
           "towerps_worker_steps_total{task=\"worker:0\",training_job=\"a\"} 2",
           "towerps_worker_examples_total{task=\"worker:0\",training_job=\"a\"} 64",
           "towerps_worker_steps_total{task=\"worker:0\",training_job=\"b\"} 1",
           "towerps_worker_examples_total{task=\"worker:0\",training_job=\"b\"} 10",
       }) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
}

}  // namespace
}  // namespace towerps::worker
