#include "worker/chief/submission.h"

#include <algorithm>
#include <cctype>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/optimizer_spec.h"
#include "common/status.h"
#include "worker/device/backend.h"
#include "worker/model/dataset.h"
#include "worker/model/model.h"
#include "worker/model/model_limits.h"

namespace towerps::worker {

bool ValidJobId(const std::string& id) {
  if (id.empty() || id.size() > 64 || id[0] == '.') return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

absl::Status ValidateSubmission(const v1::JobSpec& job, int num_workers,
                                int64_t worker_budget_bytes) {
  TOWERPS_RETURN_IF_ERROR(ValidateJob(job, num_workers));
  TOWERPS_RETURN_IF_ERROR(common::Annotate(common::ValidateOptimizer(job.optimizer()), "job spec"));
  // Sizes before anything is allocated (Model::Create below allocates the
  // weights): the bounds, then a worker's budget.
  auto size = CheckModelLimits(job.model());
  if (!size.ok()) return common::Annotate(size.status(), "job spec");
  const int64_t towers = std::max(1, std::max(job.towers(), job.tower_devices_size()));
  const int64_t per_tower = TowerBatch(job.global_batch_size(), num_workers,
                                       static_cast<int>(towers));
  const int64_t need =
      WorkerTrainingBytes(*size, per_tower, static_cast<int>(towers), job.micro_batches());
  if (need > worker_budget_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job spec: the model needs about ", need, " bytes on each worker (", size->parameters,
        " parameters, ", size->activations_per_example, " activation floats per example x ",
        per_tower, " examples x ", towers, " towers, weights and gradients",
        job.micro_batches() > 1
            ? absl::StrCat(", and what adds up ", job.micro_batches(), " micro-batches")
            : "",
        "); a worker's budget is ", worker_budget_bytes, " bytes (--memory_budget_bytes)"));
  }
  // The model: layer types, units, names (Model::Create names the layer).
  std::unique_ptr<Backend> backend = NewCpuBackend();
  auto model = Model::Create(job.model(), *backend);
  if (!model.ok()) return common::Annotate(model.status(), "job spec: model");
  const v1::DataSpec& d = job.data();
  if (d.source() == v1::DataSpec::FASHION_MNIST || d.source() == v1::DataSpec::CIFAR10) {
    const bool cifar = d.source() == v1::DataSpec::CIFAR10;
    const char* name = cifar ? "CIFAR-10" : "Fashion-MNIST";
    const int features = cifar ? 3 * 32 * 32 : 28 * 28;
    constexpr int kClasses = 10;
    if ((*model)->input_dim() != features) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job spec: model.input_dim = ", (*model)->input_dim(), " but ", name, " examples have ",
          features, " features", cifar ? " (3x32x32)" : ""));
    }
    if (job.model().has_input_shape()) {
      const v1::ImageShape& in = job.model().input_shape();
      const int channels = cifar ? 3 : 1, side = cifar ? 32 : 28;
      if (in.channels() != channels || in.height() != side || in.width() != side) {
        return absl::InvalidArgumentError(absl::StrCat(
            "job spec: model.input_shape = ", in.channels(), "x", in.height(), "x", in.width(),
            " but ", name, " images are ", channels, "x", side, "x", side,
            " (channels x height x width)"));
      }
    }
    if (job.model().loss() == v1::SOFTMAX_CROSS_ENTROPY && (*model)->output_dim() != kClasses) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job spec: model.layers[", job.model().layers_size() - 1, "].units = ",
          (*model)->output_dim(), " but ", name, " has ", kClasses,
          " classes (softmax cross-entropy needs one output per class)"));
    }
    for (bool train : {true, false}) {
      const absl::Status found = cifar ? FindCifar10Files(d.dir(), train).status()
                                       : FindFashionMnistFiles(d.dir(), train).status();
      if (!found.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("job spec: data.dir = \"", d.dir(), "\": ", found.message()));
      }
    }
  } else if (d.source() == v1::DataSpec::ONES && d.ones_target_dim() > 0 &&
             d.ones_target_dim() != (*model)->output_dim()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job spec: data.ones_target_dim = ", d.ones_target_dim(), " but the model outputs ",
        (*model)->output_dim(), " values"));
  }
  return absl::OkStatus();
}

absl::Status ConfineJobPaths(const common::PathRoots& state, const common::PathRoots& data,
                             v1::JobSpec* job) {
  auto confine = [](const common::PathRoots& roots, const char* field,
                    std::string* path) -> absl::Status {
    if (path->empty()) return absl::OkStatus();
    auto resolved = roots.Resolve(field, *path);
    if (!resolved.ok()) return common::Annotate(resolved.status(), "job spec");
    *path = *resolved;
    return absl::OkStatus();
  };
  TOWERPS_RETURN_IF_ERROR(
      confine(state, "checkpoint.dir", job->mutable_checkpoint()->mutable_dir()));
  TOWERPS_RETURN_IF_ERROR(confine(state, "tensorboard_dir", job->mutable_tensorboard_dir()));
  const v1::DataSpec::Source source = job->data().source();
  if (source == v1::DataSpec::FASHION_MNIST || source == v1::DataSpec::CIFAR10) {
    TOWERPS_RETURN_IF_ERROR(confine(data, "data.dir", job->mutable_data()->mutable_dir()));
  }
  return absl::OkStatus();
}

}  // namespace towerps::worker
