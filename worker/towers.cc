#include "worker/towers.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace towerps::worker {
namespace {

class HostReducer : public GradientReducer {
 public:
  absl::Status Reduce(const std::vector<std::vector<common::Tensor*>>& grads,
                      const std::vector<int64_t>& examples) override {
    int64_t total = 0;
    for (int64_t n : examples) total += n;
    std::vector<common::Tensor*> out = grads[0];
    for (size_t v = 0; v < out.size(); ++v) {
      common::Tensor& acc = *out[v];
      const int n = static_cast<int>(acc.num_elements());
      cblas_sscal(n, static_cast<float>(examples[0]), acc.data(), 1);
      for (size_t t = 1; t < grads.size(); ++t) {
        if (grads[t][v]->num_elements() != acc.num_elements()) {
          return absl::InternalError(absl::StrCat("tower ", t, " gradient ", v,
                                                  " has a different shape"));
        }
        if (examples[t] > 0) {
          cblas_saxpy(n, static_cast<float>(examples[t]), grads[t][v]->data(), 1,
                      acc.data(), 1);
        }
      }
      if (total > 0) cblas_sscal(n, 1.0f / static_cast<float>(total), acc.data(), 1);
    }
    return absl::OkStatus();
  }
  std::string Name() const override { return "host (BLAS) reduction"; }
};

// Copies rows [begin, end) of `in` into `out`.
void SliceRows(const Batch& in, int64_t begin, int64_t end, Batch* out) {
  const int64_t rows = end - begin;
  const int64_t d = in.features.rank() == 2 ? in.features.dim(1) : 0;
  out->features.Resize({rows, d});
  std::memcpy(out->features.data(), in.features.data() + begin * d, rows * d * sizeof(float));
  out->labels.assign(in.labels.begin() + std::min<int64_t>(begin, in.labels.size()),
                     in.labels.begin() + std::min<int64_t>(end, in.labels.size()));
  if (in.targets.num_elements() > 0) {
    const int64_t k = in.targets.dim(1);
    out->targets.Resize({rows, k});
    std::memcpy(out->targets.data(), in.targets.data() + begin * k, rows * k * sizeof(float));
  } else {
    out->targets.Resize({0});
  }
}

}  // namespace

std::unique_ptr<GradientReducer> NewHostReducer() {
  return std::make_unique<HostReducer>();
}

int BlasThreadsPerTower(int cores, int towers) {
  return std::max(1, cores / std::max(1, towers));
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
  t->reducer_ = NewHostReducer();
  t->parts_.resize(num_towers);
  return t;
}

absl::StatusOr<LossResult> Towers::ComputeGradients(const Batch& batch) {
  const int n = num_towers();
  if (n == 1) return models_[0]->ComputeGradients(batch);
  // Same weights everywhere: broadcast tower 0's.
  std::vector<common::Tensor*> w0 = models_[0]->weights();
  for (int t = 1; t < n; ++t) {
    std::vector<common::Tensor*> wt = models_[t]->weights();
    for (size_t v = 0; v < w0.size(); ++v) {
      std::memcpy(wt[v]->data(), w0[v]->data(), w0[v]->num_bytes());
    }
  }
  const int64_t rows = batch.size();
  std::vector<int64_t> examples(n);
  int64_t begin = 0;
  for (int t = 0; t < n; ++t) {
    examples[t] = rows / n + (t < rows % n ? 1 : 0);
    SliceRows(batch, begin, begin + examples[t], &parts_[t]);
    begin += examples[t];
  }
  std::vector<absl::StatusOr<LossResult>> results(n, LossResult{});
  std::vector<std::thread> threads;
  for (int t = 1; t < n; ++t) {
    threads.emplace_back([&, t] { results[t] = models_[t]->ComputeGradients(parts_[t]); });
  }
  results[0] = models_[0]->ComputeGradients(parts_[0]);
  for (auto& th : threads) th.join();
  LossResult total;
  std::vector<std::vector<common::Tensor*>> grads(n);
  for (int t = 0; t < n; ++t) {
    if (!results[t].ok()) return common::Annotate(results[t].status(), absl::StrCat("tower ", t));
    total.loss_sum += results[t]->loss_sum;
    total.correct += results[t]->correct;
    grads[t] = models_[t]->gradients();
  }
  TOWERPS_RETURN_IF_ERROR(reducer_->Reduce(grads, examples));
  return total;
}

}  // namespace towerps::worker
