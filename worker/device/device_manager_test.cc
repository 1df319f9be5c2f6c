#include "worker/device/device_manager.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace towerps::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kGpuBytes = int64_t{16} << 30;  // 16 GB.
constexpr char kTask[] = "/job:worker/replica:0/task:1";

std::vector<PhysicalDevice> TwoGpus() {
  return {{"CPU", 0, int64_t{64} << 30, "host"},
          {"GPU", 0, kGpuBytes, "fake GPU 0"},
          {"GPU", 1, kGpuBytes, "fake GPU 1"}};
}

std::vector<PhysicalDevice> ThreeGpus() {
  std::vector<PhysicalDevice> devices = TwoGpus();
  devices.push_back({"GPU", 2, kGpuBytes, "fake GPU 2"});
  return devices;
}

DeviceManagerOptions Options(std::vector<PhysicalDevice> physical,
                             std::string virtual_devices = "") {
  DeviceManagerOptions options;
  options.task_name = kTask;
  options.physical = std::move(physical);
  options.virtual_devices = std::move(virtual_devices);
  return options;
}

std::unique_ptr<DeviceManager> MustCreate(const DeviceManagerOptions& options) {
  absl::StatusOr<std::unique_ptr<DeviceManager>> manager =
      DeviceManager::Create(options);
  EXPECT_TRUE(manager.ok()) << manager.status();
  return manager.ok() ? *std::move(manager) : nullptr;
}

std::vector<std::string> ShortNames(
    const std::vector<VirtualDevice*>& devices) {
  std::vector<std::string> names;
  for (const VirtualDevice* device : devices)
    names.push_back(device->short_name());
  return names;
}

// Host memory that counts blocks and can be told to fail.
class FakeBackend : public MemoryBackend {
 public:
  absl::StatusOr<void*> Alloc(int64_t bytes) override {
    if (fail_) return absl::ResourceExhaustedError("fake: out of memory");
    ++live_;
    return host_->Alloc(bytes);
  }
  void Free(void* p) override {
    --live_;
    host_->Free(p);
  }
  std::atomic<bool> fail_{false};
  std::atomic<int> live_{0};

 private:
  std::unique_ptr<MemoryBackend> host_ = NewHostMemoryBackend();
};

// ------------------------------------------------------- ParseVirtualDevices

TEST(ParseVirtualDevicesTest, EmptyIsEmpty) {
  absl::StatusOr<VirtualDeviceConfig> config = ParseVirtualDevices("");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->specs.empty());
}

TEST(ParseVirtualDevicesTest, GoodFlags) {
  absl::StatusOr<VirtualDeviceConfig> config =
      ParseVirtualDevices("GPU:0=1000x6; gpu:1 = 1000,2000 ;CPU=512x4;");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->specs.size(), 3);
  EXPECT_EQ(config->specs[0].type, "GPU");
  EXPECT_EQ(config->specs[0].physical_index, 0);
  EXPECT_EQ(config->specs[0].memory_limits_mb, std::vector<int64_t>(6, 1000));
  EXPECT_EQ(config->specs[1].type, "GPU");
  EXPECT_EQ(config->specs[1].physical_index, 1);
  EXPECT_THAT(config->specs[1].memory_limits_mb, ElementsAre(1000, 2000));
  EXPECT_EQ(config->specs[2].type, "CPU");
  EXPECT_THAT(config->specs[2].memory_limits_mb,
              ElementsAre(512, 512, 512, 512));

  config = ParseVirtualDevices("CPU:0=3");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_THAT(config->specs[0].memory_limits_mb, ElementsAre(0, 0, 0));
}

TEST(ParseVirtualDevicesTest, BadFlagsNameEntryAndReason) {
  struct Case {
    std::string flag;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"GPU:0", "entry \"GPU:0\": no '='"},
      {"TPU:0=1000", "entry \"TPU:0=1000\": unknown device type \"TPU\""},
      {"GPU=1000", "entry \"GPU=1000\": GPU needs an index"},
      {"GPU:x=1000", "entry \"GPU:x=1000\": bad device index \"x\""},
      {"GPU:0=abc", "entry \"GPU:0=abc\": bad number \"abc\" for the memory"},
      {"GPU:0=1000xabc", "bad number \"abc\" for the count"},
      {"GPU:0=1000x0", "entry \"GPU:0=1000x0\": zero count"},
      {"CPU=0", "entry \"CPU=0\": zero count"},
      {"GPU:0=0", "zero memory limit"},
      {"GPU:0=-5", "bad number \"-5\""},
      {"GPU:0=1x2x3", "single 'x'"},
      {"CPU:1=2", "the only CPU is CPU:0"},
      {"GPU:0=1000;GPU:0=2000",
       "entry \"GPU:0=2000\": duplicate entry for GPU:0"},
      {"CPU=2;cpu:0=3", "duplicate entry for CPU:0"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<VirtualDeviceConfig> config = ParseVirtualDevices(c.flag);
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument)
        << c.flag;
    EXPECT_THAT(config.status().message(), HasSubstr(c.message)) << c.flag;
  }
}

// -------------------------------------------------------------- Allocator

TEST(AllocatorTest, EnforcesLimitAndCountsBytes) {
  constexpr char kName[] = "/job:worker/replica:0/task:0/device:GPU:2";
  Allocator allocator(kName, 1000 * kMegabyte, NewHostMemoryBackend());
  const int64_t almost = 1000 * kMegabyte - kMegabyte;

  absl::StatusOr<void*> big = allocator.Allocate(almost);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*big) % 64, 0);
  absl::StatusOr<void*> too_much = allocator.Allocate(2 * kMegabyte);
  EXPECT_EQ(too_much.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(too_much.status().message(),
            "/job:worker/replica:0/task:0/device:GPU:2: cannot allocate "
            "2097152 bytes: 1048576 of 1048576000 bytes left");

  // Exactly up to the limit, then one byte more fails.
  absl::StatusOr<void*> rest = allocator.Allocate(kMegabyte);
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_EQ(allocator.bytes_in_use(), 1000 * kMegabyte);
  absl::StatusOr<void*> one = allocator.Allocate(1);
  EXPECT_EQ(one.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(one.status().message(),
              HasSubstr("cannot allocate 1 bytes: 0 of 1048576000 bytes left"));

  allocator.Deallocate(*rest);
  EXPECT_EQ(allocator.bytes_in_use(), almost);
  one = allocator.Allocate(1);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(allocator.bytes_in_use(), almost + 1);

  allocator.Deallocate(*one);
  allocator.Deallocate(*big);
  EXPECT_EQ(allocator.bytes_in_use(), 0);
  EXPECT_EQ(allocator.peak_bytes_in_use(), 1000 * kMegabyte);
}

TEST(AllocatorTest, NegativeAndZeroAndUnknownPointers) {
  Allocator allocator("dev", 0, NewHostMemoryBackend());
  EXPECT_EQ(allocator.Allocate(-1).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<void*> a = allocator.Allocate(0);
  absl::StatusOr<void*> b = allocator.Allocate(0);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  int not_ours = 0;
  allocator.Deallocate(&not_ours);  // Logged and ignored.
  allocator.Deallocate(nullptr);
  allocator.Deallocate(*a);
  allocator.Deallocate(*b);
  EXPECT_EQ(allocator.bytes_in_use(), 0);
}

TEST(AllocatorTest, BackendFailureIsAnnotatedAndUnreserved) {
  auto backend = std::make_unique<FakeBackend>();
  FakeBackend* fake = backend.get();
  Allocator allocator("dev", 100, std::move(backend));
  fake->fail_ = true;
  absl::StatusOr<void*> p = allocator.Allocate(10);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(p.status().message(),
            "dev: cannot allocate 10 bytes: fake: out of memory");
  EXPECT_EQ(allocator.bytes_in_use(), 0);
  fake->fail_ = false;
  p = allocator.Allocate(100);
  ASSERT_TRUE(p.ok()) << p.status();
  allocator.Deallocate(*p);
  EXPECT_EQ(fake->live_, 0);
}

TEST(AllocatorTest, ConcurrentAllocationsNeverExceedLimit) {
  constexpr int64_t kBlock = 1000;
  constexpr int64_t kLimit = 32 * kBlock + 500;  // Room for 32 blocks.
  Allocator allocator("dev", kLimit, NewHostMemoryBackend());
  // Counted independently of the allocator: what the threads hold.
  std::atomic<int64_t> held_bytes{0};
  std::atomic<int64_t> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      // Allocate until refused, then give back half; each thread alone
      // reaches the limit, together they race for it.
      std::vector<void*> held;
      for (int i = 0; i < 2000; ++i) {
        absl::StatusOr<void*> p = allocator.Allocate(kBlock);
        if (p.ok()) {
          EXPECT_LE(held_bytes += kBlock, kLimit);
          held.push_back(*p);
          continue;
        }
        EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
        ++failures;
        for (size_t n = (held.size() + 1) / 2; n > 0; --n) {
          held_bytes -= kBlock;
          allocator.Deallocate(held.back());
          held.pop_back();
        }
      }
      for (void* p : held) {
        held_bytes -= kBlock;
        allocator.Deallocate(p);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(allocator.bytes_in_use(), 0);
  EXPECT_EQ(allocator.peak_bytes_in_use(), 32 * kBlock);
  EXPECT_GT(failures, 0);
}

// ---------------------------------------------------------- DeviceManager

TEST(DeviceManagerTest, DefaultIsOneDevicePerPhysical) {
  std::unique_ptr<DeviceManager> manager = MustCreate(Options(TwoGpus()));
  ASSERT_NE(manager, nullptr);
  EXPECT_THAT(ShortNames(manager->devices()),
              ElementsAre("CPU:0", "GPU:0", "GPU:1"));
  EXPECT_EQ(manager->devices()[1]->memory_limit(), 0);  // Grow on demand.
  EXPECT_EQ(manager->default_device()->short_name(), "GPU:0");
}

TEST(DeviceManagerTest, CpuSplitGivesTfNames) {
  std::unique_ptr<DeviceManager> manager =
      MustCreate(Options({{"CPU", 0, 0, "host"}}, "CPU=4"));
  ASSERT_NE(manager, nullptr);
  std::vector<VirtualDevice*> cpus = manager->DevicesOfType("cpu");
  ASSERT_EQ(cpus.size(), 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(cpus[i]->name(),
              "/job:worker/replica:0/task:1/device:CPU:" + std::to_string(i));
    EXPECT_EQ(cpus[i]->short_name(), "CPU:" + std::to_string(i));
    EXPECT_EQ(cpus[i]->type(), "CPU");
    EXPECT_EQ(cpus[i]->memory_limit(), 0);
  }
  EXPECT_TRUE(manager->DevicesOfType("GPU").empty());
  EXPECT_EQ(manager->default_device()->short_name(), "CPU:0");

  manager = MustCreate(Options({}, "CPU=512x2"));
  ASSERT_NE(manager, nullptr);
  EXPECT_EQ(manager->devices()[1]->memory_limit(), 512 * kMegabyte);
}

TEST(DeviceManagerTest, GpuSplitMapsToPhysical) {
  std::unique_ptr<DeviceManager> manager =
      MustCreate(Options(TwoGpus(), "GPU:0=1000x6;GPU:1=1000x6"));
  ASSERT_NE(manager, nullptr);
  std::vector<VirtualDevice*> gpus = manager->DevicesOfType("GPU");
  ASSERT_EQ(gpus.size(), 12);
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(gpus[i]->name(),
              "/job:worker/replica:0/task:1/device:GPU:" + std::to_string(i));
    EXPECT_EQ(gpus[i]->index(), i);
    EXPECT_EQ(gpus[i]->physical_index(), i < 6 ? 0 : 1);
    EXPECT_EQ(gpus[i]->memory_limit(), 1000 * kMegabyte);
  }
  EXPECT_EQ(manager->devices().size(), 13);
  EXPECT_THAT(manager->Describe(),
              HasSubstr("/job:worker/replica:0/task:1/device:GPU:7 (physical "
                        "GPU 1): limit 1000 MB, in use 0 bytes (peak 0)\n"));
  EXPECT_THAT(manager->Describe(),
              HasSubstr("device:CPU:0 (physical CPU 0): limit unlimited"));
}

TEST(DeviceManagerTest, GpuAllocatorUsesInjectedBackend) {
  DeviceManagerOptions options = Options(TwoGpus(), "GPU:1=1,2");
  std::vector<int> made_for;
  options.gpu_backend_factory = [&](const PhysicalDevice& gpu)
      -> absl::StatusOr<std::unique_ptr<MemoryBackend>> {
    made_for.push_back(gpu.index);
    return std::unique_ptr<MemoryBackend>(std::make_unique<FakeBackend>());
  };
  std::unique_ptr<DeviceManager> manager = MustCreate(options);
  ASSERT_NE(manager, nullptr);
  EXPECT_THAT(made_for, ElementsAre(0, 1, 1));
  VirtualDevice* gpu2 = manager->DevicesOfType("GPU")[2];
  EXPECT_EQ(gpu2->memory_limit(), 2 * kMegabyte);
  absl::StatusOr<void*> p = gpu2->allocator().Allocate(kMegabyte);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(gpu2->bytes_in_use(), kMegabyte);
  gpu2->allocator().Deallocate(*p);

  options.gpu_backend_factory = [](const PhysicalDevice&)
      -> absl::StatusOr<std::unique_ptr<MemoryBackend>> {
    return absl::UnavailableError("no driver");
  };
  EXPECT_EQ(DeviceManager::Create(options).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(DeviceManagerTest, OverSubscribedGpuIsAnError) {
  absl::StatusOr<std::unique_ptr<DeviceManager>> manager =
      DeviceManager::Create(Options(TwoGpus(), "GPU:1=8000,9000"));
  EXPECT_EQ(manager.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(manager.status().message(),
            "--virtual_devices GPU:1: 17000 MB asked but the GPU has 16384 MB");

  DeviceManagerOptions options = Options(TwoGpus(), "GPU:0=1000x9");
  options.gpu_memory_fraction = 0.5;
  manager = DeviceManager::Create(options);
  EXPECT_EQ(manager.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(manager.status().message(),
            "--virtual_devices GPU:0: 9000 MB asked but the GPU has 16384 MB "
            "(8192 MB with gpu_memory_fraction 0.5)");
}

TEST(DeviceManagerTest, MemoryFractionLimitsUnsplitGpus) {
  DeviceManagerOptions options = Options(TwoGpus());
  options.gpu_memory_fraction = 0.25;
  std::unique_ptr<DeviceManager> manager = MustCreate(options);
  ASSERT_NE(manager, nullptr);
  EXPECT_EQ(manager->DevicesOfType("GPU")[0]->memory_limit(), kGpuBytes / 4);

  options.gpu_memory_fraction = 1.5;
  EXPECT_EQ(DeviceManager::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DeviceManagerTest, SpecForMissingGpuIsAnError) {
  absl::StatusOr<std::unique_ptr<DeviceManager>> manager =
      DeviceManager::Create(Options(TwoGpus(), "GPU:3=1000"));
  EXPECT_EQ(manager.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(manager.status().message(),
            "--virtual_devices GPU:3: no physical GPU 3 (GPUs: 0, 1)");

  manager = DeviceManager::Create(Options(TwoGpus(), "GPU:0=abc"));
  EXPECT_EQ(manager.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DeviceManagerTest, VisibleDevicesHideGpusAndNumberingFollows) {
  DeviceManagerOptions options = Options(ThreeGpus(), "GPU:2=1000x2");
  options.visible_devices = "0,2";
  std::unique_ptr<DeviceManager> manager = MustCreate(options);
  ASSERT_NE(manager, nullptr);
  std::vector<VirtualDevice*> gpus = manager->DevicesOfType("GPU");
  ASSERT_EQ(gpus.size(), 3);
  EXPECT_EQ(gpus[0]->physical_index(), 0);
  EXPECT_EQ(gpus[1]->short_name(), "GPU:1");
  EXPECT_EQ(gpus[1]->physical_index(), 2);
  EXPECT_EQ(gpus[2]->short_name(), "GPU:2");
  EXPECT_EQ(gpus[2]->physical_index(), 2);

  options.virtual_devices = "GPU:1=1000";
  absl::StatusOr<std::unique_ptr<DeviceManager>> bad =
      DeviceManager::Create(options);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "--virtual_devices GPU:1: physical GPU 1 is not visible "
            "(visible: 0, 2)");

  options.virtual_devices = "";
  options.visible_devices = "0,5";
  bad = DeviceManager::Create(options);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("no physical GPU 5"));

  options.visible_devices = "0,x";
  EXPECT_EQ(DeviceManager::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DeviceManagerTest, CudaVisibleDevicesIsHonoured) {
  DeviceManagerOptions options = Options(ThreeGpus());
  options.cuda_visible_devices = "1,2";
  std::unique_ptr<DeviceManager> manager = MustCreate(options);
  ASSERT_NE(manager, nullptr);
  std::vector<VirtualDevice*> gpus = manager->DevicesOfType("GPU");
  ASSERT_EQ(gpus.size(), 2);
  EXPECT_EQ(gpus[0]->physical_index(), 1);
  EXPECT_EQ(gpus[1]->physical_index(), 2);

  options.visible_devices = "0";
  absl::StatusOr<std::unique_ptr<DeviceManager>> bad =
      DeviceManager::Create(options);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              HasSubstr("GPU 0 is hidden by CUDA_VISIBLE_DEVICES=1,2"));

  // UUIDs cannot be matched against indices: not filtered.
  options.visible_devices = "";
  options.cuda_visible_devices = "GPU-8f2a";
  manager = MustCreate(options);
  ASSERT_NE(manager, nullptr);
  EXPECT_EQ(manager->DevicesOfType("GPU").size(), 3);
}

TEST(DeviceManagerTest, BadPhysicalListIsAnError) {
  std::vector<PhysicalDevice> physical = TwoGpus();
  physical.push_back({"GPU", 1, kGpuBytes, "twin"});
  EXPECT_EQ(DeviceManager::Create(Options(physical)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DeviceManager::Create(Options({{"TPU", 0, 0, ""}})).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ----------------------------------------------------------------- Resolve

TEST(ResolveTest, AcceptsAllSpellings) {
  std::unique_ptr<DeviceManager> manager =
      MustCreate(Options(TwoGpus(), "GPU:0=1000x2;GPU:1=1000x2"));
  ASSERT_NE(manager, nullptr);
  const std::string gpu3 = "/job:worker/replica:0/task:1/device:GPU:3";
  for (const std::string& spelling :
       {std::string("GPU:3"), std::string("/device:GPU:3"),
        std::string("/gpu:3"), std::string("gpu:3"), gpu3}) {
    absl::StatusOr<VirtualDevice*> device = manager->Resolve(spelling, "test");
    ASSERT_TRUE(device.ok()) << spelling << ": " << device.status();
    EXPECT_EQ((*device)->name(), gpu3) << spelling;
  }
  absl::StatusOr<VirtualDevice*> cpu = manager->Resolve("cpu:0", "test");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ((*cpu)->short_name(), "CPU:0");
  absl::StatusOr<VirtualDevice*> dflt = manager->Resolve("", "test");
  ASSERT_TRUE(dflt.ok()) << dflt.status();
  EXPECT_EQ((*dflt)->short_name(), "GPU:0");
}

TEST(ResolveTest, MissingDeviceListsDevices) {
  std::unique_ptr<DeviceManager> manager = MustCreate(Options(TwoGpus()));
  ASSERT_NE(manager, nullptr);
  absl::StatusOr<VirtualDevice*> device =
      manager->Resolve("/gpu:7", "layer \"dense_3\"");
  EXPECT_EQ(device.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device.status().message(),
            "no device GPU:7 for layer \"dense_3\"; devices: CPU:0, GPU:0, "
            "GPU:1");

  device = manager->Resolve("/job:ps/replica:0/task:0/device:CPU:0", "x");
  EXPECT_EQ(device.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(device.status().message(),
              HasSubstr("no device /job:ps/replica:0/task:0/device:CPU:0"));

  for (const std::string bad : {"GPU", "GPU:x", "/device:", "GPU:1:2"}) {
    device = manager->Resolve(bad, "layer d");
    EXPECT_EQ(device.status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
    EXPECT_THAT(device.status().message(),
                HasSubstr("malformed device \"" + bad + "\" for layer d"));
  }
}

TEST(ResolveTest, SoftPlacementFallsBackAndLogs) {
  DeviceManagerOptions options = Options(TwoGpus());
  options.allow_soft_placement = true;
  std::vector<std::string> lines;
  options.log_sink = [&](const std::string& line) { lines.push_back(line); };
  std::unique_ptr<DeviceManager> manager = MustCreate(options);
  ASSERT_NE(manager, nullptr);
  absl::StatusOr<VirtualDevice*> device = manager->Resolve("GPU:7", "layer d");
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_EQ((*device)->short_name(), "GPU:0");
  EXPECT_THAT(lines, ElementsAre("layer d: no device GPU:7; using "
                                 "/job:worker/replica:0/task:1/device:GPU:0 "
                                 "(allow_soft_placement)"));

  // CPU-only: the fallback is CPU:0. Malformed names still fail.
  options.physical = {};
  manager = MustCreate(options);
  ASSERT_NE(manager, nullptr);
  device = manager->Resolve("GPU:0", "layer d");
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_EQ((*device)->short_name(), "CPU:0");
  EXPECT_EQ(manager->Resolve("bogus", "layer d").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ResolveTest, LogDevicePlacement) {
  DeviceManagerOptions options = Options(TwoGpus());
  options.task_name = "/job:worker/replica:0/task:0";
  options.log_device_placement = true;
  std::vector<std::string> lines;
  options.log_sink = [&](const std::string& line) { lines.push_back(line); };
  std::unique_ptr<DeviceManager> manager = MustCreate(options);
  ASSERT_NE(manager, nullptr);
  ASSERT_TRUE(manager->Resolve("/gpu:1", "layer dense_1").ok());
  ASSERT_TRUE(manager->Resolve("", "layer dense_2").ok());
  EXPECT_FALSE(manager->Resolve("GPU:9", "layer dense_3").ok());
  EXPECT_THAT(
      lines,
      ElementsAre("layer dense_1: /job:worker/replica:0/task:0/device:GPU:1",
                  "layer dense_2: /job:worker/replica:0/task:0/device:GPU:0"));
}

TEST(DiscoverPhysicalDevicesTest, HasTheCpuFirst) {
  std::vector<PhysicalDevice> devices = DiscoverPhysicalDevices();
  ASSERT_FALSE(devices.empty());
  EXPECT_EQ(devices[0].type, "CPU");
  EXPECT_GT(devices[0].memory_bytes, 0);
  for (size_t i = 1; i < devices.size(); ++i) EXPECT_EQ(devices[i].type, "GPU");
  // Whatever is found, a manager can be built on it.
  DeviceManagerOptions options;
  options.physical = devices;
  EXPECT_TRUE(DeviceManager::Create(options).ok());
}

}  // namespace
}  // namespace towerps::worker
