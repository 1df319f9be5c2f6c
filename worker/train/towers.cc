#include "worker/train/towers.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "worker/device/nccl_reduce.h"

namespace towerps::worker {
namespace {

// The physical GPU of a "cuda:<i>" memory space; -1 for anything else.
int GpuOf(const std::string& space) {
  if (space.rfind("cuda:", 0) != 0) return -1;
  return std::atoi(space.c_str() + 5);
}

class DeviceReducer : public GradientReducer {
 public:
  DeviceReducer(std::string name, bool use_nccl)
      : name_(std::move(name)), use_nccl_(use_nccl) {}

  // Three phases, each over every variable, so a device synchronizes twice
  // per step rather than twice per variable and NCCL gets every variable in
  // one group: (1) within each memory space, weighted sums onto the space's
  // first tower (its leader); (2) across spaces, NCCL all-reduce between
  // physical GPUs, else copies to tower 0's device; (3) division by the
  // total on tower 0's device.
  absl::Status Reduce(const std::vector<std::vector<DeviceTensor*>>& grads,
                      const std::vector<int64_t>& examples) override {
    int64_t total = 0;
    for (int64_t n : examples) total += n;
    const size_t towers = grads.size();
    const size_t vars = grads[0].size();
    if (staging_.size() < vars) staging_.resize(vars);
    std::vector<Backend*> involved;  // each backend once, in first-use order
    auto involve = [&involved](Backend* b) {
      if (std::find(involved.begin(), involved.end(), b) == involved.end()) {
        involved.push_back(b);
      }
    };
    // leaders[v]: the towers whose gradient of v leads a memory space;
    // leaders[v][0] == 0.
    std::vector<std::vector<size_t>> leaders(vars);
    for (size_t v = 0; v < vars; ++v) {
      DeviceTensor& acc = *grads[0][v];
      const int64_t n = acc.num_elements();
      std::map<std::string, size_t> leader_of;
      for (size_t t = 0; t < towers; ++t) {
        DeviceTensor& g = *grads[t][v];
        if (g.num_elements() != n) {
          return absl::InternalError(absl::StrCat("tower ", t, " gradient ", v,
                                                  " has shape ", g.ShapeString(),
                                                  ", tower 0's ", acc.ShapeString()));
        }
        auto [it, first] = leader_of.emplace(g.backend()->memory_space(), t);
        DeviceTensor& lead = *grads[it->second][v];
        involve(g.backend());
        if (first) {
          leaders[v].push_back(t);
          lead.backend()->Scale(n, static_cast<float>(examples[t]), lead.data());
        } else if (examples[t] > 0) {
          lead.backend()->Axpy(n, static_cast<float>(examples[t]), g.data(), lead.data());
        }
      }
    }
    for (Backend* b : involved) TOWERPS_RETURN_IF_ERROR(b->Synchronize());

    // NCCL ops by the GPUs they span (one group call per distinct set).
    std::map<std::vector<int>, std::vector<NcclGroup::Op>> nccl_ops;
    for (size_t v = 0; v < vars; ++v) {
      if (leaders[v].size() < 2) continue;
      DeviceTensor& acc = *grads[0][v];
      const int64_t n = acc.num_elements();
      std::vector<int> gpus;
      NcclGroup::Op op{{}, n};
      for (size_t t : leaders[v]) {
        gpus.push_back(GpuOf(grads[t][v]->backend()->memory_space()));
        op.buffers.push_back(grads[t][v]->data());
      }
      if (use_nccl_ && NcclGroup::Available() &&
          std::find(gpus.begin(), gpus.end(), -1) == gpus.end()) {
        nccl_ops[gpus].push_back(std::move(op));
        continue;
      }
      DeviceTensor& stage = staging_[v];
      if (stage.backend() != acc.backend()) stage = DeviceTensor(acc.backend());
      TOWERPS_RETURN_IF_ERROR(stage.Resize({n}));
      for (size_t i = 1; i < leaders[v].size(); ++i) {
        DeviceTensor& g = *grads[leaders[v][i]][v];
        TOWERPS_RETURN_IF_ERROR(
            acc.backend()->CopyFrom(*g.backend(), g.data(), n, stage.data()));
        acc.backend()->Axpy(n, 1.0f, stage.data(), acc.data());
      }
    }
    for (const auto& [gpus, ops] : nccl_ops) {
      TOWERPS_ASSIGN_OR_RETURN(NcclGroup * group, Group(gpus));
      TOWERPS_RETURN_IF_ERROR(group->AllReduceSum(ops));
    }

    if (total > 0) {
      for (size_t v = 0; v < vars; ++v) {
        DeviceTensor& acc = *grads[0][v];
        acc.backend()->Scale(acc.num_elements(), 1.0f / static_cast<float>(total), acc.data());
      }
    }
    for (Backend* b : involved) TOWERPS_RETURN_IF_ERROR(b->Synchronize());
    return absl::OkStatus();
  }

  std::string Name() const override { return name_; }

 private:
  absl::StatusOr<NcclGroup*> Group(const std::vector<int>& gpus) {
    std::unique_ptr<NcclGroup>& g = groups_[gpus];
    if (!g) {
      TOWERPS_ASSIGN_OR_RETURN(g, NcclGroup::Create(gpus));
    }
    return g.get();
  }

  const std::string name_;
  const bool use_nccl_;
  std::vector<DeviceTensor> staging_;  // per variable, on tower 0's device
  std::map<std::vector<int>, std::unique_ptr<NcclGroup>> groups_;
};

// Copies rows [begin, end) of `in` into `out`.
void SliceRows(const Batch& in, int64_t begin, int64_t end, Batch* out) {
  const int64_t rows = end - begin;
  const int64_t d = in.features.rank() == 2 ? in.features.dim(1) : 0;
  out->features.Resize({rows, d});
  // An idle tower's slice is empty and its buffer may be null, which memcpy
  // must not be given even for zero bytes.
  if (rows * d > 0) {
    std::memcpy(out->features.data(), in.features.data() + begin * d, rows * d * sizeof(float));
  }
  out->labels.assign(in.labels.begin() + std::min<int64_t>(begin, in.labels.size()),
                     in.labels.begin() + std::min<int64_t>(end, in.labels.size()));
  if (in.targets.num_elements() > 0) {
    const int64_t k = in.targets.dim(1);
    out->targets.Resize({rows, k});
    if (rows * k > 0) {
      std::memcpy(out->targets.data(), in.targets.data() + begin * k, rows * k * sizeof(float));
    }
  } else {
    out->targets.Resize({0});
  }
}

}  // namespace

std::unique_ptr<GradientReducer> NewReducer(
    const std::vector<std::vector<DeviceTensor*>>& grads, bool use_nccl) {
  // Describe where the towers are: towers per memory space (by variable 0's
  // gradient; per-layer devices may add spaces for other variables).
  std::map<std::string, int> per_space;
  std::vector<std::string> order;
  for (const auto& g : grads) {
    if (g.empty()) continue;
    const std::string space = g[0]->backend()->memory_space();
    if (per_space[space]++ == 0) order.push_back(space);
  }
  std::vector<std::string> parts;
  int gpus = 0;
  bool cpu = false;
  for (const std::string& s : order) {
    parts.push_back(absl::StrCat(per_space[s], " on ", s));
    if (GpuOf(s) >= 0) ++gpus; else cpu = true;
  }
  std::string name = absl::StrCat(order.size() == 1 && cpu ? "host (BLAS) sums"
                                                           : "on-device sums",
                                   " (", absl::StrJoin(parts, ", "), ")");
  if (order.size() > 1) {
    std::string why;
    const bool nccl = use_nccl && !cpu && NcclGroup::Available(&why);
    name += nccl ? absl::StrCat(" + NCCL all-reduce over ", gpus, " GPUs")
                 : " + copies to tower 0's device";
    if (use_nccl && !cpu && !nccl) absl::StrAppend(&name, " (NCCL unavailable: ", why, ")");
  }
  return std::make_unique<DeviceReducer>(name, use_nccl);
}

absl::StatusOr<std::unique_ptr<Towers>> Towers::Create(
    const v1::ModelSpec& spec, int num_towers,
    const std::function<std::unique_ptr<Backend>()>& make_backend) {
  // One backend per tower, owned by the towers and handed to every layer.
  std::vector<std::unique_ptr<Backend>> backends;
  for (int i = 0; i < std::max(num_towers, 0); ++i) backends.push_back(make_backend());
  TOWERPS_ASSIGN_OR_RETURN(
      std::unique_ptr<Towers> t,
      Create(spec, num_towers, [&backends](int tower) -> Model::LayerPlacer {
        Backend* backend = backends[tower].get();
        return [backend](const std::string&, const std::string&)
                   -> absl::StatusOr<Model::LayerPlacement> {
          return Model::LayerPlacement{backend, ""};
        };
      }));
  t->backends_ = std::move(backends);
  return t;
}

absl::StatusOr<std::unique_ptr<Towers>> Towers::Create(
    const v1::ModelSpec& spec, int num_towers,
    const std::function<Model::LayerPlacer(int tower)>& placer_for_tower) {
  if (num_towers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("towers = ", num_towers, " (want >= 1)"));
  }
  std::unique_ptr<Towers> t(new Towers());
  for (int i = 0; i < num_towers; ++i) {
    TOWERPS_ASSIGN_OR_RETURN(std::unique_ptr<Model> m,
                             Model::Create(spec, placer_for_tower(i)));
    t->models_.push_back(std::move(m));
  }
  std::vector<std::vector<DeviceTensor*>> grads;
  for (auto& m : t->models_) grads.push_back(m->device_gradients());
  t->reducer_ = NewReducer(grads);
  t->parts_.resize(num_towers);
  return t;
}

absl::StatusOr<LossResult> Towers::ComputeGradients(const Batch& batch,
                                                    const Model::StepEvents& events) {
  if (num_towers() == 1) return models_[0]->ComputeGradients(batch, events);
  const int all = static_cast<int>(models_[0]->weights().size());
  if (events.weights_needed) TOWERPS_RETURN_IF_ERROR(events.weights_needed(0, all));
  TOWERPS_ASSIGN_OR_RETURN(LossResult r, ComputeGradients(batch));
  if (events.gradients_ready) TOWERPS_RETURN_IF_ERROR(events.gradients_ready(0, all));
  return r;
}

absl::StatusOr<LossResult> Towers::ComputeGradients(const Batch& batch) {
  const int n = num_towers();
  if (n == 1) return models_[0]->ComputeGradients(batch);
  const std::vector<common::Tensor*> w0 = models_[0]->weights();
  const int64_t rows = batch.size();
  std::vector<int64_t> examples(n);
  int64_t begin = 0;
  for (int t = 0; t < n; ++t) {
    examples[t] = rows / n + (t < rows % n ? 1 : 0);
    SliceRows(batch, begin, begin + examples[t], &parts_[t]);
    begin += examples[t];
  }
  // Every tower computes with tower 0's weights: loaded once (in place on
  // the host, uploaded to a GPU), then read in place by towers in a memory
  // space that has them already, and copied device to device once into each
  // other space.
  // (Before the towers' threads start: a copy waits for tower 0's devices,
  // which must not be in use by another thread then.)
  TOWERPS_RETURN_IF_ERROR(models_[0]->LoadWeights(w0));
  TOWERPS_RETURN_IF_ERROR(models_[0]->SynchronizeDevices());
  std::vector<Model*> loaded = {models_[0].get()};
  for (int t = 1; t < n; ++t) {
    TOWERPS_RETURN_IF_ERROR(
        common::Annotate(models_[t]->ShareWeights(loaded), absl::StrCat("tower ", t)));
    loaded.push_back(models_[t].get());
  }
  std::vector<absl::StatusOr<LossResult>> results(n, LossResult{});
  auto run = [&](int t) { results[t] = models_[t]->ComputeDeviceGradients(parts_[t]); };
  std::vector<std::thread> threads;
  for (int t = 1; t < n; ++t) threads.emplace_back(run, t);
  run(0);
  for (auto& th : threads) th.join();
  LossResult total;
  std::vector<std::vector<DeviceTensor*>> grads(n);
  for (int t = 0; t < n; ++t) {
    if (!results[t].ok()) return common::Annotate(results[t].status(), absl::StrCat("tower ", t));
    total.loss_sum += results[t]->loss_sum;
    total.correct += results[t]->correct;
    grads[t] = models_[t]->device_gradients();
  }
  TOWERPS_RETURN_IF_ERROR(reducer_->Reduce(grads, examples));
  TOWERPS_RETURN_IF_ERROR(models_[0]->DownloadGradients());
  return total;
}

}  // namespace towerps::worker
