// Virtual devices: the physical CPU and GPUs of one task, split into named
// virtual devices, each with an allocator that enforces its memory limit, and
// the placement logic that maps a requested device name to one of them.
//
// Everything here runs without a GPU: the physical devices are passed in (the
// real ones from DiscoverPhysicalDevices(), fakes in tests) and GPU memory
// comes from an injectable MemoryBackend (host memory until the CUDA backend
// exists). Flags and environment variables are read in main(), never here.
//
// Example: two 16 GB GPUs with --virtual_devices="GPU:0=1000x6;GPU:1=1000x6"
// give CPU:0 and GPU:0..GPU:11, where GPU:0..5 live on physical GPU 0 and
// GPU:6..11 on physical GPU 1, each limited to 1000 MB.
#ifndef TOWERPS_WORKER_DEVICE_DEVICE_MANAGER_H_
#define TOWERPS_WORKER_DEVICE_DEVICE_MANAGER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace towerps::worker {

inline constexpr int64_t kMegabyte = int64_t{1} << 20;

// A device as the hardware (or a test) reports it. Plain value type.
struct PhysicalDevice {
  std::string type;          // "CPU" or "GPU".
  int index = 0;             // GPU ordinal as CUDA reports it; 0 for the CPU.
  int64_t memory_bytes = 0;  // Total memory; 0 = unknown.
  std::string description;   // E.g. "NVIDIA H100 80GB HBM3" or "host".
};

// The CPU (memory from sysconf) followed by the GPUs QueryGpus() sees, in
// CUDA's order. No GPU is a normal answer. Thread-safe.
std::vector<PhysicalDevice> DiscoverPhysicalDevices();

// --virtual_devices, parsed. One entry per physical device named in the flag,
// in flag order. Plain value type.
struct VirtualDeviceSpec {
  std::string type;        // "CPU" or "GPU".
  int physical_index = 0;  // Which physical GPU; always 0 for the CPU.
  // One element per virtual device: its limit in MB, 0 = unlimited.
  std::vector<int64_t> memory_limits_mb;
};
struct VirtualDeviceConfig {
  std::vector<VirtualDeviceSpec> specs;  // Empty: one device per physical one.
};

// Parses --virtual_devices: entries separated by ';' (blanks around tokens and
// empty entries are ignored; the type is case-insensitive):
//   GPU:<i>=<MB>x<count>     physical GPU i split into <count> devices of <MB>
//   GPU:<i>=<MB>[,<MB>...]   one device per listed limit
//   CPU=<count>              <count> CPU devices, no limit ("CPU:0" also works)
//   CPU=<MB>x<count>         <count> CPU devices of <MB> each
// The size comes first for every type: "1000x6" is 6 devices of 1000 MB.
// The empty string gives an empty config. Returns InvalidArgument naming the
// entry and the reason: missing '=', unknown device type, missing or bad GPU
// index, bad number, zero count or limit, duplicate entry.
absl::StatusOr<VirtualDeviceConfig> ParseVirtualDevices(
    const std::string& flag);

// Where an allocator gets its bytes. Implementations must be thread-safe.
class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  // Returns at least `bytes` (may be 0) of memory, or ResourceExhausted.
  virtual absl::StatusOr<void*> Alloc(int64_t bytes) = 0;
  // Frees what Alloc returned.
  virtual void Free(void* p) = 0;
};

// Host memory, 64-byte aligned (Alloc(0) returns a unique non-null pointer).
std::unique_ptr<MemoryBackend> NewHostMemoryBackend();

// Memory accounting for one virtual device on top of a MemoryBackend.
// Thread-safe. The allocator must outlive the blocks it hands out.
class Allocator {
 public:
  // `device_name` appears in error messages; `limit_bytes` 0 = unlimited.
  Allocator(std::string device_name, int64_t limit_bytes,
            std::unique_ptr<MemoryBackend> backend);
  ~Allocator();  // Frees blocks still allocated (and logs how many).
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Returns a block of `bytes` (>= 0), or:
  //   InvalidArgument if bytes < 0;
  //   ResourceExhausted if the limit would be exceeded, e.g.
  //     "/job:worker/replica:0/task:0/device:GPU:2: cannot allocate 2097152
  //      bytes: 1048576 of 1048576000 bytes left"
  //   or if the backend fails (the backend's message, prefixed likewise).
  // Never blocks on other allocations while the backend runs.
  absl::StatusOr<void*> Allocate(int64_t bytes);
  // Returns a block from Allocate. nullptr is a no-op; a pointer this
  // allocator did not hand out is logged as an error and ignored.
  void Deallocate(void* p);

  int64_t limit_bytes() const { return limit_bytes_; }  // 0 = unlimited.
  int64_t bytes_in_use() const;
  int64_t peak_bytes_in_use() const;

 private:
  // Constant after construction.
  const std::string device_name_;
  const int64_t limit_bytes_;
  const std::unique_ptr<MemoryBackend> backend_;

  mutable absl::Mutex mu_;
  // Includes reservations for allocations whose backend call is in flight.
  int64_t bytes_in_use_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t peak_bytes_in_use_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<void*, int64_t> sizes_ ABSL_GUARDED_BY(mu_);
};

// One virtual device. Thread-safe: everything but the allocator's counters is
// constant after construction. Created and owned by DeviceManager.
class VirtualDevice {
 public:
  VirtualDevice(std::string task_name, std::string type, int index,
                int physical_index, std::unique_ptr<Allocator> allocator);
  VirtualDevice(const VirtualDevice&) = delete;
  VirtualDevice& operator=(const VirtualDevice&) = delete;

  // "/job:worker/replica:0/task:1/device:GPU:3".
  const std::string& name() const { return name_; }
  // "GPU:3".
  std::string short_name() const;
  // "CPU" or "GPU".
  const std::string& type() const { return type_; }
  // Number among the task's devices of the same type (the 3 in GPU:3).
  int index() const { return index_; }
  // PhysicalDevice::index of the device this one is carved from.
  int physical_index() const { return physical_index_; }
  // Bytes; 0 = unlimited.
  int64_t memory_limit() const { return allocator_->limit_bytes(); }
  int64_t bytes_in_use() const { return allocator_->bytes_in_use(); }
  int64_t peak_bytes_in_use() const { return allocator_->peak_bytes_in_use(); }
  Allocator& allocator() { return *allocator_; }

 private:
  const std::string name_;
  const std::string type_;
  const int index_;
  const int physical_index_;
  const std::unique_ptr<Allocator> allocator_;
};

struct DeviceManagerOptions {
  // This task's name, prefix of every device name.
  // Default: "/job:localhost/replica:0/task:0".
  std::string task_name = "/job:localhost/replica:0/task:0";
  // --virtual_devices (see ParseVirtualDevices). Physical devices it does not
  // name get one virtual device each. Default: "" (one per physical device).
  std::string virtual_devices;
  // Which physical GPUs to use, by PhysicalDevice::index: "0,2". Default: ""
  // (all). Every index must exist and not be hidden by cuda_visible_devices.
  std::string visible_devices;
  // CUDA_VISIBLE_DEVICES as main() read it, same syntax; "" = unset. Applied
  // like visible_devices (a GPU must be in both lists to be used); ids that
  // are not plain indices (UUIDs) make it ignored, with a warning.
  std::string cuda_visible_devices;
  // REQUIRES: at most one CPU and no duplicate GPU index. A missing CPU entry
  // means a CPU of unknown memory. Default: empty (CPU only).
  std::vector<PhysicalDevice> physical;
  // A missing device resolves to the default device (with a warning) instead
  // of failing. Default: false.
  bool allow_soft_placement = false;
  // Every successful Resolve logs "<what>: <device name>". Default: false.
  bool log_device_placement = false;
  // Per physical GPU: the share of its memory that its virtual devices may
  // use together; a GPU with no --virtual_devices entry gets one device with
  // that limit. 0 = grow on demand (no limit beyond the GPU's memory).
  // REQUIRES: 0 <= gpu_memory_fraction <= 1. Default: 0.
  double gpu_memory_fraction = 0;
  // Makes the backend for one virtual GPU device. Default: null (host memory).
  std::function<absl::StatusOr<std::unique_ptr<MemoryBackend>>(
      const PhysicalDevice&)>
      gpu_backend_factory;
  // Receives placement and soft-placement lines. Default: null, which logs
  // placements with TLOG(INFO) and fallbacks with TLOG(WARNING).
  std::function<void(const std::string&)> log_sink;
};

// The virtual devices of one task. Thread-safe: which devices exist is
// constant after construction; allocators are thread-safe themselves.
class DeviceManager {
 public:
  // Builds the devices: CPU ones first, then GPU ones, physical GPUs in index
  // order, each numbered per type from 0. Returns InvalidArgument for a bad
  // --virtual_devices or visible list, a spec for a GPU that does not exist
  // or is hidden, limits that add up to more than the GPU's memory (times
  // gpu_memory_fraction when set), e.g. "--virtual_devices GPU:0: 17000 MB
  // asked but the GPU has 16384 MB", or a bad memory fraction; the factory's
  // error if gpu_backend_factory fails.
  static absl::StatusOr<std::unique_ptr<DeviceManager>> Create(
      const DeviceManagerOptions& options);

  DeviceManager(const DeviceManager&) = delete;
  DeviceManager& operator=(const DeviceManager&) = delete;

  const std::string& task_name() const { return options_.task_name; }

  // All devices: CPU:0.., then GPU:0.. . Pointers live as long as the manager.
  std::vector<VirtualDevice*> devices() const;
  // Devices of `type` ("CPU"/"GPU", case-insensitive), in number order.
  std::vector<VirtualDevice*> DevicesOfType(const std::string& type) const;
  // GPU:0 if there is a GPU, else CPU:0.
  VirtualDevice* default_device() const;

  // Finds the device for `requested`: "GPU:3", "/device:GPU:3", "/gpu:3",
  // "cpu:0", or a full name of this task; "" = default_device(). `what`
  // says who asks, for messages: `layer "dense_3"`.
  // Returns InvalidArgument for a malformed name, and for a device that does
  // not exist (or is on another task) unless allow_soft_placement, e.g.
  //   no device GPU:7 for layer "dense_3"; devices: CPU:0, GPU:0, GPU:1
  // With allow_soft_placement such a request gets default_device() and a
  // warning line; with log_device_placement each success logs
  // "<what>: <full device name>".
  absl::StatusOr<VirtualDevice*> Resolve(const std::string& requested,
                                         const std::string& what) const;

  // One line per device: "<name> (physical GPU 0): limit 1000 MB, in use 0
  // bytes (peak 0)"; "limit unlimited" for devices without one.
  std::string Describe() const;

 private:
  explicit DeviceManager(const DeviceManagerOptions& options);
  void Log(bool warning, const std::string& line) const;

  // Constant after construction.
  const DeviceManagerOptions options_;
  std::vector<std::unique_ptr<VirtualDevice>> devices_;  // Filled by Create.
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_DEVICE_DEVICE_MANAGER_H_
