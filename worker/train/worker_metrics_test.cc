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

TEST(DeviceMemoryCollectorTest, ReportsEachVirtualDeviceAtScrapeTime) {
  DeviceManagerOptions o;
  o.task_name = "/job:worker/replica:0/task:0";
  o.physical = {{"CPU", 0, int64_t{1} << 30, "host"}, {"GPU", 0, int64_t{1} << 30, "fake GPU"}};
  o.virtual_devices = "GPU:0=1,2";  // Two virtual GPUs of 1 MB and 2 MB.
  auto devices = DeviceManager::Create(o);
  ASSERT_TRUE(devices.ok()) << devices.status();
  DeviceMemoryCollector collector(**devices, "worker:0");
  VirtualDevice* gpu1 = (*devices)->DevicesOfType("GPU")[1];
  auto block = gpu1->allocator().Allocate(4096);
  ASSERT_TRUE(block.ok()) << block.status();
  // Read at scrape time: the block just allocated is there.
  std::string text = prometheus::TextSerializer().Serialize(collector.Collect());
  for (const char* want : {
           "towerps_worker_device_memory_bytes{task=\"worker:0\",device=\"GPU:1\"} 4096",
           "towerps_worker_device_memory_bytes{task=\"worker:0\",device=\"GPU:0\"} 0",
           "towerps_worker_device_memory_limit_bytes{task=\"worker:0\",device=\"GPU:1\"} 2097152",
           "towerps_worker_device_memory_peak_bytes{task=\"worker:0\",device=\"GPU:1\"} 4096",
       }) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
  // The CPU device has no limit: no limit series for it.
  EXPECT_EQ(text.find("towerps_worker_device_memory_limit_bytes{task=\"worker:0\",device=\"CPU:0\"}"),
            std::string::npos)
      << text;
  gpu1->allocator().Deallocate(*block);
  text = prometheus::TextSerializer().Serialize(collector.Collect());
  EXPECT_NE(text.find("towerps_worker_device_memory_bytes{task=\"worker:0\",device=\"GPU:1\"} 0"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace towerps::worker
