// Puts a model's layers on virtual devices: resolves each layer's `device`
// with the DeviceManager (which logs placements, applies soft placement and
// names the devices that exist when one is missing) and gives every device its
// own backend.
//
// Thread-compatible.
#ifndef TOWERPS_WORKER_MODEL_DEVICE_PLACER_H_
#define TOWERPS_WORKER_MODEL_DEVICE_PLACER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/job.pb.h"
#include "worker/device/backend.h"
#include "worker/device/device_manager.h"
#include "worker/model/model.h"

namespace towerps::worker {

// The layout of the classic many-small-GPUs example: the first layer on
// devices[0], hidden layer i (0-based) on devices[min(i + 1, last)], the last
// layer on devices.back(). Overwrites every layer's `device`.
// InvalidArgument if `devices` is empty.
absl::Status ApplyClassicLayout(const std::vector<std::string>& devices,
                                v1::ModelSpec* spec);

// Charges a model's memory to the allocators of the devices its layers were
// placed on, so that a model that does not fit its virtual devices fails at
// start with the allocator's error (device, bytes asked, bytes left) instead
// of later: the activation buffers for `max_batch` examples are allocated
// (through each device's backend, so they are charged as they exist), and
// for layers on host memory, whose weights and gradients are the model's
// host tensors, those bytes are reserved too (on a GPU they were allocated
// on the device when the model was built). Held until destroyed.
class MemoryReservation {
 public:
  // ResourceExhausted (prefixed with the layer) if a device is too small;
  // nothing stays reserved then. REQUIRES: `model` was placed by a
  // DevicePlacer on `devices`.
  static absl::StatusOr<std::unique_ptr<MemoryReservation>> Reserve(
      Model& model, const DeviceManager& devices, int64_t max_batch);
  ~MemoryReservation();
  MemoryReservation(const MemoryReservation&) = delete;
  MemoryReservation& operator=(const MemoryReservation&) = delete;

 private:
  MemoryReservation() = default;
  std::vector<std::pair<Allocator*, void*>> held_;
};

// The backend of a virtual device: the CPU backend for CPU devices, the GPU
// backend on the device's physical GPU for GPU devices; both allocate through
// the device's allocator, so its limit holds. Unavailable for a GPU device in
// a CPU-only build.
absl::StatusOr<std::unique_ptr<Backend>> NewBackendForDevice(VirtualDevice& device);

// Devices for tower `tower` of `towers` when layers name devices: the
// worker's devices of each type are split into `towers` equal consecutive
// groups, a layer's device names a device of tower 0's group, and tower t
// uses the device at the same position in group t. E.g. with CPU=6 and 2
// towers, "CPU:1" is CPU:1 for tower 0 and CPU:4 for tower 1.
// InvalidArgument (naming the counts) when a type has fewer devices than
// towers or the device is outside tower 0's group.
absl::StatusOr<std::string> TowerDevice(const DeviceManager& devices,
                                        const std::string& requested, int tower,
                                        int towers);

class DevicePlacer {
 public:
  using BackendFactory =
      std::function<absl::StatusOr<std::unique_ptr<Backend>>(VirtualDevice&)>;
  // `devices` is not owned and must outlive this object and its models.
  // `make_backend` makes the backend of one device (default:
  // NewBackendForDevice).
  explicit DevicePlacer(const DeviceManager& devices,
                        BackendFactory make_backend = nullptr);

  // A placer for Model::Create. Layers with an empty `device` go to
  // `default_device` (or the manager's default when empty).
  Model::LayerPlacer Placer(const std::string& default_device = "");
  // As above for tower `tower` of `towers`: layer devices map through
  // TowerDevice.
  Model::LayerPlacer TowerPlacer(int tower, int towers);

 private:
  const DeviceManager& devices_;
  const BackendFactory make_backend_;
  std::map<const VirtualDevice*, std::unique_ptr<Backend>> backends_;
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_MODEL_DEVICE_PLACER_H_
