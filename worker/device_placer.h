// Puts a model's layers on virtual devices: resolves each layer's `device`
// with the DeviceManager (which logs placements, applies soft placement and
// names the devices that exist when one is missing) and gives every device its
// own backend.
//
// Thread-compatible.
#ifndef TOWERPS_WORKER_DEVICE_PLACER_H_
#define TOWERPS_WORKER_DEVICE_PLACER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/device_manager.h"
#include "proto/towerps.pb.h"
#include "worker/backend.h"
#include "worker/model.h"

namespace towerps::worker {

// The layout of the classic many-small-GPUs example: the first layer on
// devices[0], hidden layer i (0-based) on devices[min(i + 1, last)], the last
// layer on devices.back(). Overwrites every layer's `device`.
// InvalidArgument if `devices` is empty.
absl::Status ApplyClassicLayout(const std::vector<std::string>& devices,
                                v1::ModelSpec* spec);

// Charges each layer's MemoryUse(max_batch) to the allocator of the device it
// was placed on and holds the bytes until destroyed, so a model that does not
// fit its virtual devices fails at start with the allocator's error (device,
// bytes asked, bytes left) instead of later.
class MemoryReservation {
 public:
  // ResourceExhausted (prefixed with the layer) if a device is too small;
  // nothing stays reserved then. REQUIRES: `model` was placed by a
  // DevicePlacer on `devices`.
  static absl::StatusOr<std::unique_ptr<MemoryReservation>> Reserve(
      const Model& model, const common::DeviceManager& devices, int64_t max_batch);
  ~MemoryReservation();
  MemoryReservation(const MemoryReservation&) = delete;
  MemoryReservation& operator=(const MemoryReservation&) = delete;

 private:
  MemoryReservation() = default;
  std::vector<std::pair<common::Allocator*, void*>> held_;
};

class DevicePlacer {
 public:
  // `devices` is not owned and must outlive this object and its models.
  DevicePlacer(const common::DeviceManager& devices,
               std::function<std::unique_ptr<Backend>()> make_backend);

  // A placer for Model::Create. Layers with an empty `device` go to
  // `default_device` (or the manager's default when empty).
  Model::LayerPlacer Placer(const std::string& default_device = "");

 private:
  const common::DeviceManager& devices_;
  const std::function<std::unique_ptr<Backend>()> make_backend_;
  std::map<const common::VirtualDevice*, std::unique_ptr<Backend>> backends_;
};

}  // namespace towerps::worker

#endif  // TOWERPS_WORKER_DEVICE_PLACER_H_
