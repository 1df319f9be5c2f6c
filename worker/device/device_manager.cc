#include "worker/device/device_manager.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/logging.h"
#include "common/status.h"
#include "worker/device/gpu_info.h"

namespace towerps::worker {
namespace {

constexpr int64_t kHostAlignment = 64;
// Far more than any machine needs; keeps a typo from making a million devices.
constexpr int64_t kMaxVirtualDevicesPerPhysical = 1024;

absl::Status EntryError(absl::string_view entry, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("--virtual_devices entry \"", entry, "\": ", why));
}

// Parses a count or a size in MB: a positive integer small enough that the
// size in bytes fits in int64.
absl::StatusOr<int64_t> ParsePositive(absl::string_view entry,
                                      absl::string_view text,
                                      absl::string_view what) {
  text = absl::StripAsciiWhitespace(text);
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < 0 ||
      value > std::numeric_limits<int64_t>::max() / kMegabyte) {
    return EntryError(entry, absl::StrCat("bad number \"", text, "\" for the ",
                                          what, " (want a positive integer)"));
  }
  if (value == 0) return EntryError(entry, absl::StrCat("zero ", what));
  return value;
}

// The value after '=' of one entry: the limits in MB, one per device.
absl::StatusOr<std::vector<int64_t>> ParseLimits(absl::string_view entry,
                                                 absl::string_view value,
                                                 bool is_gpu) {
  std::vector<int64_t> limits;
  if (absl::StrContains(value, 'x')) {
    std::vector<absl::string_view> parts = absl::StrSplit(value, 'x');
    if (parts.size() != 2) {
      return EntryError(entry, "want <a>x<b> with a single 'x'");
    }
    // <MB>x<count> for every device type (see the header).
    absl::string_view mb_text = parts[0];
    absl::string_view count_text = parts[1];
    TOWERPS_ASSIGN_OR_RETURN(int64_t mb,
                             ParsePositive(entry, mb_text, "memory limit"));
    TOWERPS_ASSIGN_OR_RETURN(int64_t count,
                             ParsePositive(entry, count_text, "count"));
    if (count > kMaxVirtualDevicesPerPhysical) {
      return EntryError(entry, absl::StrCat("count ", count, " is over ",
                                            kMaxVirtualDevicesPerPhysical));
    }
    limits.assign(count, mb);
  } else if (is_gpu) {
    for (absl::string_view mb_text : absl::StrSplit(value, ',')) {
      TOWERPS_ASSIGN_OR_RETURN(int64_t mb,
                               ParsePositive(entry, mb_text, "memory limit"));
      limits.push_back(mb);
    }
    if (limits.size() > kMaxVirtualDevicesPerPhysical) {
      return EntryError(entry, "too many devices");
    }
  } else {
    TOWERPS_ASSIGN_OR_RETURN(int64_t count,
                             ParsePositive(entry, value, "count"));
    if (count > kMaxVirtualDevicesPerPhysical) {
      return EntryError(entry, absl::StrCat("count ", count, " is over ",
                                            kMaxVirtualDevicesPerPhysical));
    }
    limits.assign(count, 0);
  }
  return limits;
}

// "0,2" -> {0, 2}. `flag` names the option in messages.
absl::StatusOr<std::set<int>> ParseIndexList(absl::string_view flag,
                                             absl::string_view list) {
  std::set<int> indices;
  for (absl::string_view item :
       absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    int index = 0;
    if (!absl::SimpleAtoi(item, &index) || index < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " \"", list, "\": bad GPU index \"", item, "\""));
    }
    indices.insert(index);
  }
  return indices;
}

std::string JoinIndices(const std::vector<int>& indices) {
  return indices.empty() ? "none" : absl::StrJoin(indices, ", ");
}

class HostMemoryBackend : public MemoryBackend {
 public:
  absl::StatusOr<void*> Alloc(int64_t bytes) override {
    // aligned_alloc wants a size that is a multiple of the alignment, and may
    // return null for 0; round up so Alloc(0) is a real, unique block.
    if (bytes > std::numeric_limits<int64_t>::max() - kHostAlignment) {
      return absl::ResourceExhaustedError(
          absl::StrCat("host memory: ", bytes, " bytes is too large"));
    }
    const int64_t rounded =
        std::max<int64_t>(kHostAlignment, (bytes + kHostAlignment - 1) /
                                              kHostAlignment * kHostAlignment);
    void* p = std::aligned_alloc(kHostAlignment, static_cast<size_t>(rounded));
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("host memory: out of memory for ", bytes, " bytes"));
    }
    return p;
  }
  void Free(void* p) override { std::free(p); }
};

}  // namespace

std::vector<PhysicalDevice> DiscoverPhysicalDevices() {
  std::vector<PhysicalDevice> devices;
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  devices.push_back(
      {"CPU", 0,
       pages > 0 && page_size > 0 ? int64_t{pages} * int64_t{page_size} : 0,
       "host"});
  for (const GpuDevice& gpu : QueryGpus().devices) {
    devices.push_back({"GPU", gpu.index, gpu.memory_bytes, gpu.name});
  }
  return devices;
}

absl::StatusOr<VirtualDeviceConfig> ParseVirtualDevices(
    const std::string& flag) {
  VirtualDeviceConfig config;
  std::set<std::pair<std::string, int>> seen;
  for (absl::string_view entry :
       absl::StrSplit(flag, ';', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    const size_t eq = entry.find('=');
    if (eq == absl::string_view::npos) return EntryError(entry, "no '='");
    const absl::string_view key =
        absl::StripAsciiWhitespace(entry.substr(0, eq));
    const absl::string_view value =
        absl::StripAsciiWhitespace(entry.substr(eq + 1));

    VirtualDeviceSpec spec;
    std::vector<absl::string_view> key_parts = absl::StrSplit(key, ':');
    spec.type = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(key_parts[0]));
    if (spec.type != "CPU" && spec.type != "GPU") {
      return EntryError(entry,
                        absl::StrCat("unknown device type \"", key_parts[0],
                                     "\" (want CPU or GPU)"));
    }
    if (key_parts.size() > 2) return EntryError(entry, "bad device name");
    if (key_parts.size() == 2) {
      const absl::string_view index_text =
          absl::StripAsciiWhitespace(key_parts[1]);
      if (!absl::SimpleAtoi(index_text, &spec.physical_index) ||
          spec.physical_index < 0) {
        return EntryError(
            entry, absl::StrCat("bad device index \"", index_text, "\""));
      }
      if (spec.type == "CPU" && spec.physical_index != 0) {
        return EntryError(entry, "the only CPU is CPU:0");
      }
    } else if (spec.type == "GPU") {
      return EntryError(entry, "GPU needs an index, e.g. GPU:0");
    }
    if (!seen.insert({spec.type, spec.physical_index}).second) {
      return EntryError(entry, absl::StrCat("duplicate entry for ", spec.type,
                                            ":", spec.physical_index));
    }
    TOWERPS_ASSIGN_OR_RETURN(spec.memory_limits_mb,
                             ParseLimits(entry, value, spec.type == "GPU"));
    config.specs.push_back(std::move(spec));
  }
  return config;
}

std::unique_ptr<MemoryBackend> NewHostMemoryBackend() {
  return std::make_unique<HostMemoryBackend>();
}

// ---------------------------------------------------------------- Allocator

Allocator::Allocator(std::string device_name, int64_t limit_bytes,
                     std::unique_ptr<MemoryBackend> backend)
    : device_name_(std::move(device_name)),
      limit_bytes_(limit_bytes),
      backend_(std::move(backend)) {}

Allocator::~Allocator() {
  absl::flat_hash_map<void*, int64_t> leaked;
  {
    absl::MutexLock lock(&mu_);
    leaked.swap(sizes_);
  }
  if (leaked.empty()) return;
  int64_t bytes = 0;
  for (const auto& [p, size] : leaked) {
    bytes += size;
    backend_->Free(p);
  }
  TLOG(WARNING) << device_name_ << ": freed " << leaked.size()
                << " block(s) still allocated at destruction (" << bytes
                << " bytes)";
}

absl::StatusOr<void*> Allocator::Allocate(int64_t bytes) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        device_name_, ": cannot allocate ", bytes, " bytes (negative)"));
  }
  {
    // Reserve first, so that concurrent callers never exceed the limit while
    // the backend call runs outside the lock.
    absl::MutexLock lock(&mu_);
    if (limit_bytes_ > 0 && bytes > limit_bytes_ - bytes_in_use_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          device_name_, ": cannot allocate ", bytes, " bytes: ",
          limit_bytes_ - bytes_in_use_, " of ", limit_bytes_, " bytes left"));
    }
    bytes_in_use_ += bytes;
    peak_bytes_in_use_ = std::max(peak_bytes_in_use_, bytes_in_use_);
  }
  absl::StatusOr<void*> p = backend_->Alloc(bytes);
  absl::MutexLock lock(&mu_);
  if (!p.ok()) {
    bytes_in_use_ -= bytes;
    return common::Annotate(p.status(), absl::StrCat(device_name_, ": cannot allocate ",
                                             bytes, " bytes"));
  }
  sizes_[*p] = bytes;
  return *p;
}

void Allocator::Deallocate(void* p) {
  if (p == nullptr) return;
  {
    absl::MutexLock lock(&mu_);
    auto it = sizes_.find(p);
    if (it == sizes_.end()) {
      TLOG(ERROR) << device_name_ << ": Deallocate of " << p
                  << ", which this allocator did not hand out; ignored";
      return;
    }
    bytes_in_use_ -= it->second;
    sizes_.erase(it);
  }
  backend_->Free(p);
}

int64_t Allocator::bytes_in_use() const {
  absl::MutexLock lock(&mu_);
  return bytes_in_use_;
}

int64_t Allocator::peak_bytes_in_use() const {
  absl::MutexLock lock(&mu_);
  return peak_bytes_in_use_;
}

// ------------------------------------------------------------ VirtualDevice

VirtualDevice::VirtualDevice(std::string task_name, std::string type, int index,
                             int physical_index,
                             std::unique_ptr<Allocator> allocator)
    : name_(absl::StrCat(task_name, "/device:", type, ":", index)),
      type_(std::move(type)),
      index_(index),
      physical_index_(physical_index),
      allocator_(std::move(allocator)) {}

std::string VirtualDevice::short_name() const {
  return absl::StrCat(type_, ":", index_);
}

// ------------------------------------------------------------ DeviceManager

DeviceManager::DeviceManager(const DeviceManagerOptions& options)
    : options_(options) {}

absl::StatusOr<std::unique_ptr<DeviceManager>> DeviceManager::Create(
    const DeviceManagerOptions& options) {
  if (!(options.gpu_memory_fraction >= 0 && options.gpu_memory_fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("gpu_memory_fraction ",
                                                   options.gpu_memory_fraction,
                                                   " is not in [0, 1]"));
  }

  // The physical devices, GPUs by index.
  PhysicalDevice cpu{"CPU", 0, 0, "host"};
  int cpus = 0;
  std::map<int, PhysicalDevice> gpus;
  for (const PhysicalDevice& device : options.physical) {
    if (device.type == "CPU") {
      if (++cpus > 1) {
        return absl::InvalidArgumentError("more than one physical CPU listed");
      }
      cpu = device;
    } else if (device.type == "GPU") {
      if (!gpus.emplace(device.index, device).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("physical GPU ", device.index, " listed twice"));
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "physical device of unknown type \"", device.type, "\""));
    }
  }
  std::vector<int> all_gpus;
  for (const auto& [index, gpu] : gpus) all_gpus.push_back(index);

  // Which GPUs are used: in visible_devices (if set) and in
  // cuda_visible_devices (if set and made of plain indices).
  std::set<int> cuda_visible(all_gpus.begin(), all_gpus.end());
  if (!options.cuda_visible_devices.empty()) {
    absl::StatusOr<std::set<int>> parsed =
        ParseIndexList("CUDA_VISIBLE_DEVICES", options.cuda_visible_devices);
    if (parsed.ok()) {
      cuda_visible = *std::move(parsed);
    } else {
      // CUDA also accepts UUIDs and MIG names; CUDA itself has applied them
      // to what it reports, so there is nothing left to filter here.
      TLOG(WARNING) << parsed.status().message() << "; not filtering on it";
    }
  }
  std::set<int> visible;
  if (options.visible_devices.empty()) {
    for (int index : all_gpus) {
      if (cuda_visible.count(index) > 0) visible.insert(index);
    }
  } else {
    TOWERPS_ASSIGN_OR_RETURN(
        std::set<int> requested,
        ParseIndexList("--visible_devices", options.visible_devices));
    for (int index : requested) {
      if (gpus.count(index) == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--visible_devices \"", options.visible_devices,
                         "\": no physical GPU ", index,
                         " (GPUs: ", JoinIndices(all_gpus), ")"));
      }
      if (cuda_visible.count(index) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--visible_devices \"", options.visible_devices, "\": GPU ", index,
            " is hidden by CUDA_VISIBLE_DEVICES=",
            options.cuda_visible_devices));
      }
    }
    visible = std::move(requested);
  }
  const std::vector<int> visible_list(visible.begin(), visible.end());

  // Limits in MB per physical device, from --virtual_devices.
  TOWERPS_ASSIGN_OR_RETURN(VirtualDeviceConfig config,
                           ParseVirtualDevices(options.virtual_devices));
  std::vector<int64_t> cpu_limits_mb = {0};
  std::map<int, std::vector<int64_t>> gpu_limits_mb;
  for (const VirtualDeviceSpec& spec : config.specs) {
    if (spec.type == "CPU") {
      cpu_limits_mb = spec.memory_limits_mb;
      continue;
    }
    const std::string name =
        absl::StrCat("--virtual_devices GPU:", spec.physical_index);
    if (gpus.count(spec.physical_index) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": no physical GPU ", spec.physical_index,
                       " (GPUs: ", JoinIndices(all_gpus), ")"));
    }
    if (visible.count(spec.physical_index) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": physical GPU ", spec.physical_index,
          " is not visible (visible: ", JoinIndices(visible_list), ")"));
    }
    const int64_t memory = gpus[spec.physical_index].memory_bytes;
    if (memory > 0) {
      int64_t asked_mb = 0;
      for (int64_t mb : spec.memory_limits_mb) asked_mb += mb;
      const int64_t memory_mb = memory / kMegabyte;
      const double fraction = options.gpu_memory_fraction;
      const int64_t budget_mb =
          fraction > 0 ? static_cast<int64_t>(memory_mb * fraction) : memory_mb;
      if (asked_mb > budget_mb) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, ": ", asked_mb, " MB asked but the GPU has ", memory_mb,
            " MB",
            fraction > 0
                ? absl::StrCat(" (", budget_mb, " MB with gpu_memory_fraction ",
                               fraction, ")")
                : ""));
      }
    }
    gpu_limits_mb[spec.physical_index] = spec.memory_limits_mb;
  }

  // The devices: CPUs, then the visible GPUs in index order.
  std::unique_ptr<DeviceManager> manager(new DeviceManager(options));
  const std::string& task = options.task_name;
  for (size_t i = 0; i < cpu_limits_mb.size(); ++i) {
    const std::string name = absl::StrCat(task, "/device:CPU:", i);
    manager->devices_.push_back(std::make_unique<VirtualDevice>(
        task, "CPU", static_cast<int>(i), cpu.index,
        std::make_unique<Allocator>(name, cpu_limits_mb[i] * kMegabyte,
                                    NewHostMemoryBackend())));
  }
  int gpu_number = 0;
  for (int physical_index : visible_list) {
    const PhysicalDevice& gpu = gpus[physical_index];
    std::vector<int64_t> limits_bytes;
    if (auto it = gpu_limits_mb.find(physical_index);
        it != gpu_limits_mb.end()) {
      for (int64_t mb : it->second) limits_bytes.push_back(mb * kMegabyte);
    } else {
      // 0 (unlimited) is grow on demand.
      limits_bytes.push_back(
          static_cast<int64_t>(gpu.memory_bytes * options.gpu_memory_fraction));
    }
    for (int64_t limit : limits_bytes) {
      std::unique_ptr<MemoryBackend> backend;
      if (options.gpu_backend_factory) {
        TOWERPS_ASSIGN_OR_RETURN(backend, options.gpu_backend_factory(gpu));
      } else {
        backend = NewHostMemoryBackend();
      }
      const std::string name = absl::StrCat(task, "/device:GPU:", gpu_number);
      manager->devices_.push_back(std::make_unique<VirtualDevice>(
          task, "GPU", gpu_number, physical_index,
          std::make_unique<Allocator>(name, limit, std::move(backend))));
      ++gpu_number;
    }
  }
  return manager;
}

std::vector<VirtualDevice*> DeviceManager::devices() const {
  std::vector<VirtualDevice*> result;
  for (const auto& device : devices_) result.push_back(device.get());
  return result;
}

std::vector<VirtualDevice*> DeviceManager::DevicesOfType(
    const std::string& type) const {
  const std::string upper = absl::AsciiStrToUpper(type);
  std::vector<VirtualDevice*> result;
  for (const auto& device : devices_) {
    if (device->type() == upper) result.push_back(device.get());
  }
  return result;
}

VirtualDevice* DeviceManager::default_device() const {
  // devices_ holds the CPUs first; Create always makes at least CPU:0.
  for (const auto& device : devices_) {
    if (device->type() == "GPU") return device.get();
  }
  return devices_.front().get();
}

absl::StatusOr<VirtualDevice*> DeviceManager::Resolve(
    const std::string& requested, const std::string& what) const {
  VirtualDevice* found = nullptr;
  std::string missing;  // How the missing device is named in messages.
  if (requested.empty()) {
    found = default_device();
  } else {
    absl::string_view rest = requested;
    const std::string own_prefix = options_.task_name + "/";
    if (absl::StartsWith(rest, "/job:") &&
        !absl::StartsWith(rest, own_prefix)) {
      missing = requested;  // Another task's device.
    } else {
      absl::ConsumePrefix(&rest, options_.task_name);
      if (!absl::ConsumePrefix(&rest, "/device:"))
        absl::ConsumePrefix(&rest, "/");
      std::vector<absl::string_view> parts = absl::StrSplit(rest, ':');
      int index = -1;
      if (parts.size() != 2 || parts[0].empty() ||
          !std::all_of(parts[0].begin(), parts[0].end(), absl::ascii_isalpha) ||
          !absl::SimpleAtoi(parts[1], &index) || index < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "malformed device \"", requested, "\" for ", what,
            ": want e.g. GPU:0, /device:GPU:0, /gpu:0 or a full device name"));
      }
      const std::string type = absl::AsciiStrToUpper(parts[0]);
      for (const auto& device : devices_) {
        if (device->type() == type && device->index() == index) {
          found = device.get();
        }
      }
      if (found == nullptr) missing = absl::StrCat(type, ":", index);
    }
  }

  if (found == nullptr) {
    if (!options_.allow_soft_placement) {
      std::vector<std::string> names;
      for (const auto& device : devices_) names.push_back(device->short_name());
      return absl::InvalidArgumentError(
          absl::StrCat("no device ", missing, " for ", what,
                       "; devices: ", absl::StrJoin(names, ", ")));
    }
    found = default_device();
    Log(/*warning=*/true,
        absl::StrCat(what, ": no device ", missing, "; using ", found->name(),
                     " (allow_soft_placement)"));
  }
  if (options_.log_device_placement) {
    Log(/*warning=*/false, absl::StrCat(what, ": ", found->name()));
  }
  return found;
}

std::string DeviceManager::Describe() const {
  std::string out;
  for (const auto& device : devices_) {
    const int64_t limit = device->memory_limit();
    std::string limit_text = "unlimited";
    if (limit > 0) {
      limit_text = limit % kMegabyte == 0
                       ? absl::StrCat(limit / kMegabyte, " MB")
                       : absl::StrCat(limit, " bytes");
    }
    absl::StrAppend(&out, device->name(), " (physical ", device->type(), " ",
                    device->physical_index(), "): limit ", limit_text,
                    ", in use ", device->bytes_in_use(), " bytes (peak ",
                    device->peak_bytes_in_use(), ")\n");
  }
  return out;
}

void DeviceManager::Log(bool warning, const std::string& line) const {
  if (options_.log_sink) {
    options_.log_sink(line);
  } else if (warning) {
    TLOG(WARNING) << line;
  } else {
    TLOG(INFO) << line;
  }
}

}  // namespace towerps::worker
