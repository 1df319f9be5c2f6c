#include "worker/device_placer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace towerps::worker {

absl::Status ApplyClassicLayout(const std::vector<std::string>& devices,
                                v1::ModelSpec* spec) {
  if (devices.empty()) {
    return absl::InvalidArgumentError("classic layout: no devices to place layers on");
  }
  const int n = spec->layers_size();
  const int last = static_cast<int>(devices.size()) - 1;
  for (int j = 0; j < n; ++j) {
    int d;
    if (j == 0) {
      d = 0;
    } else if (j == n - 1) {
      d = last;
    } else {
      d = std::min(j, last);  // hidden layer i = j - 1 goes to min(i + 1, last)
    }
    spec->mutable_layers(j)->set_device(devices[d]);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MemoryReservation>> MemoryReservation::Reserve(
    const Model& model, const common::DeviceManager& devices, int64_t max_batch) {
  std::unique_ptr<MemoryReservation> r(new MemoryReservation());
  const std::vector<Model::LayerMemory> use = model.MemoryUse(max_batch);
  const std::vector<std::string>& where = model.layer_devices();
  for (size_t i = 0; i < use.size() && i < where.size(); ++i) {
    common::VirtualDevice* device = nullptr;
    for (common::VirtualDevice* d : devices.devices()) {
      if (d->name() == where[i]) device = d;
    }
    if (device == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "layer \"", use[i].layer, "\" is on \"", where[i], "\", not a device of this worker"));
    }
    auto p = device->allocator().Allocate(use[i].bytes);
    if (!p.ok()) {
      return common::Annotate(p.status(), absl::StrCat("layer \"", use[i].layer, "\""));
    }
    r->held_.emplace_back(&device->allocator(), *p);
  }
  return r;
}

MemoryReservation::~MemoryReservation() {
  for (auto& [allocator, p] : held_) allocator->Deallocate(p);
}

DevicePlacer::DevicePlacer(const common::DeviceManager& devices,
                           std::function<std::unique_ptr<Backend>()> make_backend)
    : devices_(devices), make_backend_(std::move(make_backend)) {}

Model::LayerPlacer DevicePlacer::Placer(const std::string& default_device) {
  return [this, default_device](const std::string& layer, const std::string& requested)
             -> absl::StatusOr<Model::LayerPlacement> {
    TOWERPS_ASSIGN_OR_RETURN(
        common::VirtualDevice * device,
        devices_.Resolve(requested.empty() ? default_device : requested,
                         absl::StrCat("layer \"", layer, "\"")));
    std::unique_ptr<Backend>& backend = backends_[device];
    if (!backend) backend = make_backend_();
    return Model::LayerPlacement{backend.get(), device->name()};
  };
}

}  // namespace towerps::worker
