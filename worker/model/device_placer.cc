#include "worker/model/device_placer.h"

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
    Model& model, const DeviceManager& devices, int64_t max_batch) {
  std::unique_ptr<MemoryReservation> r(new MemoryReservation());
  const std::vector<Model::LayerMemory> use = model.ParamMemory();
  const std::vector<std::string>& where = model.layer_devices();
  for (size_t i = 0; i < use.size() && i < where.size(); ++i) {
    VirtualDevice* device = nullptr;
    for (VirtualDevice* d : devices.devices()) {
      if (d->name() == where[i]) device = d;
    }
    if (device == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "layer \"", use[i].layer, "\" is on \"", where[i], "\", not a device of this worker"));
    }
    if (device->type() != "CPU") continue;  // weights live in device memory
    auto p = device->allocator().Allocate(use[i].bytes);
    if (!p.ok()) {
      return common::Annotate(p.status(), absl::StrCat("layer \"", use[i].layer, "\""));
    }
    r->held_.emplace_back(&device->allocator(), *p);
  }
  TOWERPS_RETURN_IF_ERROR(model.PrepareBuffers(max_batch));
  return r;
}

MemoryReservation::~MemoryReservation() {
  for (auto& [allocator, p] : held_) allocator->Deallocate(p);
}

absl::StatusOr<std::unique_ptr<Backend>> NewBackendForDevice(VirtualDevice& device) {
  if (device.type() == "GPU") {
    auto b = NewCudaBackend(device.physical_index(), &device.allocator());
    if (!b.ok()) return common::Annotate(b.status(), device.name());
    return b;
  }
  return NewCpuBackend(&device.allocator());
}

absl::StatusOr<std::string> TowerDevice(const DeviceManager& devices,
                                        const std::string& requested, int tower,
                                        int towers) {
  TOWERPS_ASSIGN_OR_RETURN(VirtualDevice * d,
                           devices.Resolve(requested, absl::StrCat("tower ", tower)));
  const int count = static_cast<int>(devices.DevicesOfType(d->type()).size());
  const int group = count / std::max(towers, 1);
  if (group < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        towers, " towers with layers on ", d->type(), " devices need at least ", towers,
        " ", d->type(), " devices (one group per tower); this worker has ", count));
  }
  if (d->index() >= group) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device ", d->short_name(), ": with ", towers, " towers each tower has ", group, " ",
        d->type(), " device(s), and layers name tower 0's: ", d->type(), ":0..", group - 1));
  }
  return absl::StrCat(d->type(), ":", tower * group + d->index());
}

DevicePlacer::DevicePlacer(const DeviceManager& devices, BackendFactory make_backend)
    : devices_(devices),
      make_backend_(make_backend ? std::move(make_backend) : BackendFactory(NewBackendForDevice)) {}

Model::LayerPlacer DevicePlacer::Placer(const std::string& default_device) {
  return [this, default_device](const std::string& layer, const std::string& requested)
             -> absl::StatusOr<Model::LayerPlacement> {
    TOWERPS_ASSIGN_OR_RETURN(
        VirtualDevice * device,
        devices_.Resolve(requested.empty() ? default_device : requested,
                         absl::StrCat("layer \"", layer, "\"")));
    std::unique_ptr<Backend>& backend = backends_[device];
    if (!backend) {
      TOWERPS_ASSIGN_OR_RETURN(backend, make_backend_(*device));
    }
    return Model::LayerPlacement{backend.get(), device->name()};
  };
}

Model::LayerPlacer DevicePlacer::TowerPlacer(int tower, int towers) {
  Model::LayerPlacer inner = Placer();
  return [this, inner, tower, towers](const std::string& layer, const std::string& requested)
             -> absl::StatusOr<Model::LayerPlacement> {
    std::string device = requested;
    if (!device.empty()) {
      auto mapped = TowerDevice(devices_, requested, tower, towers);
      if (!mapped.ok()) return common::Annotate(mapped.status(), absl::StrCat("layer \"", layer, "\""));
      device = *mapped;
    }
    return inner(layer, device);
  };
}

}  // namespace towerps::worker
