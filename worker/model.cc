#include "worker/model.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/initializer.h"
#include "common/status.h"

namespace towerps::worker {
namespace {

// "269322" -> "269,322".
std::string WithThousands(int64_t v) {
  std::string digits = absl::StrCat(v < 0 ? -v : v);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return v < 0 ? "-" + out : out;
}

// The first of `base`, `base_1`, `base_2`, ... not in `used`.
std::string UniqueName(const std::string& base,
                       const std::set<std::string>& used) {
  if (used.count(base) == 0) return base;
  for (int i = 1;; ++i) {
    std::string candidate = absl::StrCat(base, "_", i);
    if (used.count(candidate) == 0) return candidate;
  }
}

std::string LayerLabel(int index, const std::string& name) {
  return name.empty() ? absl::StrCat("layer ", index)
                      : absl::StrCat("layer ", index, " ('", name, "')");
}

}  // namespace

uint64_t VariableSeed(uint64_t base_seed, int64_t index) {
  uint64_t z =
      base_seed + static_cast<uint64_t>(index + 1) * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

Model::Model(std::string name, v1::LossType loss, int64_t input_dim,
             uint64_t init_seed)
    : name_(std::move(name)),
      loss_(loss),
      input_dim_(input_dim),
      init_seed_(init_seed) {}

Model::~Model() = default;

absl::StatusOr<std::unique_ptr<Model>> Model::Create(const v1::ModelSpec& spec,
                                                     Backend& backend) {
  return Create(spec, [&backend](const std::string&, const std::string&)
                          -> absl::StatusOr<LayerPlacement> {
    return LayerPlacement{&backend, ""};
  });
}

absl::StatusOr<std::unique_ptr<Model>> Model::Create(const v1::ModelSpec& spec,
                                                     const LayerPlacer& placer) {
  const std::string model_label =
      spec.name().empty() ? "model" : absl::StrCat("model '", spec.name(), "'");
  if (spec.input_dim() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        model_label, ": input_dim must be > 0, got ", spec.input_dim()));
  }
  if (spec.layers_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_label, ": layers is empty; need at least one"));
  }
  switch (spec.loss()) {
    case v1::LOSS_UNSPECIFIED:
    case v1::SOFTMAX_CROSS_ENTROPY:
    case v1::MSE:
    case v1::MAE:
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          model_label, ": unknown loss ", static_cast<int>(spec.loss())));
  }

  // Explicit names first, so that defaults skip them.
  std::set<std::string> used;
  for (int i = 0; i < spec.layers_size(); ++i) {
    const std::string& name = spec.layers(i).name();
    if (name.empty()) continue;
    if (name.find('/') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(model_label, ": ", LayerLabel(i, name),
                       ": name must not contain '/'"));
    }
    if (!used.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(model_label, ": ", LayerLabel(i, name),
                       ": name is used by an earlier layer"));
    }
  }

  const uint64_t init_seed = spec.init_seed() == 0 ? 1 : spec.init_seed();
  auto model = std::unique_ptr<Model>(
      new Model(spec.name().empty() ? "sequential" : spec.name(), spec.loss(),
                spec.input_dim(), init_seed));
  int64_t width = spec.input_dim();
  for (int i = 0; i < spec.layers_size(); ++i) {
    const v1::LayerSpec& layer = spec.layers(i);
    std::string name = layer.name();
    const std::string label =
        absl::StrCat(model_label, ": ", LayerLabel(i, name));
    switch (layer.type()) {
      case v1::LayerSpec::DENSE: {
        if (layer.units() <= 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              label, ": DENSE units must be > 0, got ", layer.units()));
        }
        if (layer.activation() != v1::ACTIVATION_NONE &&
            layer.activation() != v1::RELU) {
          return absl::InvalidArgumentError(
              absl::StrCat(label, ": unknown activation ",
                           static_cast<int>(layer.activation())));
        }
        if (name.empty()) {
          name = UniqueName("dense", used);
          used.insert(name);
        }
        TOWERPS_ASSIGN_OR_RETURN(LayerPlacement where, placer(name, layer.device()));
        Backend& backend = *where.backend;
        model->layer_devices_.push_back(where.device);
        auto dense = std::make_unique<Dense>(backend, name, width,
                                             layer.units(), !layer.no_bias());
        const int64_t params =
            width * layer.units() + (layer.no_bias() ? 0 : layer.units());
        width = layer.units();
        model->layers_.push_back(std::move(dense));
        if (layer.activation() == v1::RELU) {
          model->layers_.push_back(
              std::make_unique<ReLU>(backend, absl::StrCat(name, "/relu")));
        }
        model->summary_rows_.push_back(
            {name, "Dense", width, params, layer.activation() == v1::RELU ? 2 : 1});
        model->num_parameters_ += params;
        break;
      }
      case v1::LayerSpec::RELU_LAYER:
        if (name.empty()) {
          name = UniqueName("re_lu", used);
          used.insert(name);
        }
        {
          TOWERPS_ASSIGN_OR_RETURN(LayerPlacement where, placer(name, layer.device()));
          model->layer_devices_.push_back(where.device);
          model->layers_.push_back(std::make_unique<ReLU>(*where.backend, name));
        }
        model->summary_rows_.push_back({name, "ReLU", width, 0, 1});
        break;
      case v1::LayerSpec::LAYER_UNSPECIFIED:
        return absl::InvalidArgumentError(
            absl::StrCat(label, ": type is unset (LAYER_UNSPECIFIED)"));
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            label, ": unknown layer type ", static_cast<int>(layer.type())));
    }
  }
  model->output_dim_ = width;
  model->activations_.resize(model->layers_.size());
  model->deltas_.resize(model->layers_.size());
  return model;
}

std::vector<v1::VariableDef> Model::VariableDefs() const {
  std::vector<v1::VariableDef> defs;
  for (const auto& layer : layers_) {
    const auto* dense = dynamic_cast<const Dense*>(layer.get());
    if (dense == nullptr) continue;
    v1::VariableDef kernel;
    kernel.set_name(absl::StrCat(dense->name(), "/kernel"));
    kernel.add_shape(dense->input_dim());
    kernel.add_shape(dense->units());
    kernel.set_dtype(v1::DT_FLOAT32);
    v1::Initializer* init = kernel.mutable_initializer();
    init->set_type(v1::Initializer::GLOROT_UNIFORM);
    init->set_seed(VariableSeed(init_seed_, static_cast<int64_t>(defs.size())));
    init->set_fan_in(dense->input_dim());
    init->set_fan_out(dense->units());
    defs.push_back(std::move(kernel));
    if (dense->use_bias()) {
      v1::VariableDef bias;
      bias.set_name(absl::StrCat(dense->name(), "/bias"));
      bias.add_shape(dense->units());
      bias.set_dtype(v1::DT_FLOAT32);
      bias.mutable_initializer()->set_type(v1::Initializer::ZEROS);
      defs.push_back(std::move(bias));
    }
  }
  return defs;
}

std::vector<common::Tensor*> Model::weights() {
  std::vector<common::Tensor*> out;
  for (const auto& layer : layers_) {
    for (common::Tensor* t : layer->params()) out.push_back(t);
  }
  return out;
}

std::vector<common::Tensor*> Model::gradients() {
  std::vector<common::Tensor*> out;
  for (const auto& layer : layers_) {
    for (common::Tensor* t : layer->grads()) out.push_back(t);
  }
  return out;
}

void Model::InitializeWeights() {
  const std::vector<v1::VariableDef> defs = VariableDefs();
  const std::vector<common::Tensor*> w = weights();
  for (size_t i = 0; i < defs.size(); ++i) {
    common::InitializeValues(defs[i].initializer(), w[i]->span());
  }
}

absl::Status Model::Forward(const common::Tensor& features) {
  if (features.rank() != 2 || features.dim(1) != input_dim_) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", name_, "': features have shape ",
                     features.ShapeString(), ", want [n,", input_dim_, "]"));
  }
  const common::Tensor* x = &features;
  for (size_t i = 0; i < layers_.size(); ++i) {
    TOWERPS_RETURN_IF_ERROR(layers_[i]->Forward(*x, &activations_[i]));
    x = &activations_[i];
  }
  return absl::OkStatus();
}

absl::StatusOr<LossResult> Model::ComputeGradients(const Batch& batch) {
  if (batch.size() == 0) {
    for (common::Tensor* g : gradients()) g->Fill(0.0f);
    return LossResult();
  }
  TOWERPS_RETURN_IF_ERROR(Forward(batch.features));
  const size_t last = layers_.size() - 1;
  LossResult result;
  TOWERPS_RETURN_IF_ERROR(
      ComputeLoss(loss_, activations_[last], batch, &deltas_[last], &result));
  for (size_t i = last + 1; i-- > 0;) {
    const common::Tensor& x = i == 0 ? batch.features : activations_[i - 1];
    TOWERPS_RETURN_IF_ERROR(layers_[i]->Backward(
        x, activations_[i], deltas_[i], i == 0 ? nullptr : &deltas_[i - 1]));
  }
  return result;
}

absl::StatusOr<LossResult> Model::Evaluate(const Batch& batch) {
  if (batch.size() == 0) return LossResult();
  TOWERPS_RETURN_IF_ERROR(Forward(batch.features));
  LossResult result;
  TOWERPS_RETURN_IF_ERROR(
      ComputeLoss(loss_, activations_.back(), batch, nullptr, &result));
  return result;
}

std::string Model::Summary() const {
  constexpr int kWidth = 65;
  // Column starts as in Keras' print_summary for sequential models.
  auto row = [](const std::string& a, const std::string& b,
                const std::string& c) {
    std::string line = " " + a;
    line.resize(std::max<size_t>(29, line.size() + 1), ' ');
    line += b;
    line.resize(std::max<size_t>(55, line.size() + 1), ' ');
    line += c;
    return line + "\n";
  };
  std::string out = absl::StrCat("Model: \"", name_, "\"\n");
  out += std::string(kWidth, '_') + "\n";
  out += row("Layer (type)", "Output Shape", "Param #");
  out += std::string(kWidth, '=') + "\n";
  for (const SummaryRow& r : summary_rows_) {
    out +=
        row(absl::StrCat(r.name, " (", r.type, ")"),
            absl::StrCat("(None, ", r.output_dim, ")"), absl::StrCat(r.params));
  }
  out += std::string(kWidth, '=') + "\n";
  out += absl::StrCat("Total params: ", WithThousands(num_parameters_), "\n");
  out +=
      absl::StrCat("Trainable params: ", WithThousands(num_parameters_), "\n");
  out += "Non-trainable params: 0\n";
  out += std::string(kWidth, '_') + "\n";
  return out;
}

std::vector<Model::LayerMemory> Model::MemoryUse(int64_t max_batch) const {
  std::vector<LayerMemory> out;
  for (const SummaryRow& r : summary_rows_) {
    const int64_t weights = 2 * r.params;                       // values + gradients
    const int64_t activations = 2 * r.layers * max_batch * r.output_dim;  // outputs + deltas
    out.push_back({r.name, (weights + activations) * static_cast<int64_t>(sizeof(float))});
  }
  return out;
}

}  // namespace towerps::worker
