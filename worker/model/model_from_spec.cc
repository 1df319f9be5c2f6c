// Model::Create: a Model built from its ModelSpec, checked layer by layer.
#include "worker/model/model.h"

#include <algorithm>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/model/conv_layers.h"
#include "worker/model/losses.h"
#include "worker/model/model_limits.h"
#include "worker/model/norm_layers.h"
#include "worker/model/residual.h"

namespace towerps::worker {
namespace {

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
  // Sizes first: nothing below may allocate for a spec over the limits.
  if (absl::StatusOr<ModelSize> size = CheckModelLimits(spec); !size.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(model_label, ": ", size.status().message()));
  }
  const absl::StatusOr<LossKind> loss_kind = ToLossKind(spec.loss());
  if (!loss_kind.ok()) {
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
                *loss_kind, spec.input_dim(), init_seed));
  int64_t width = spec.input_dim();
  // The image the current rows hold (CHW), while image layers run; nullopt
  // once a Dense or Flatten has made them plain features.
  std::optional<ImageDims> image;
  if (spec.has_input_shape()) {
    const v1::ImageShape& in = spec.input_shape();
    const ImageDims dims{in.channels(), in.height(), in.width()};
    if (dims.channels <= 0 || dims.height <= 0 || dims.width <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          model_label, ": input_shape must be positive, got channels ", dims.channels,
          ", height ", dims.height, ", width ", dims.width));
    }
    if (dims.size() != spec.input_dim()) {
      return absl::InvalidArgumentError(absl::StrCat(
          model_label, ": input_shape ", dims.channels, "x", dims.height, "x", dims.width,
          " has ", dims.size(), " elements but input_dim is ", spec.input_dim()));
    }
    image = dims;
  }
  // Adds an image layer built for spec layer `name` (and its fused ReLU) with
  // its device and summary row (a row of width w reads "(None, w)"); returns
  // its output image.
  auto append = [&](std::unique_ptr<ImageLayer> built, Backend& backend, const std::string& device,
                    const std::string& name, bool relu) {
    model->layer_devices_.push_back(device);
    const int64_t params = built->num_params();
    const ImageDims out = built->output_image();
    model->summary_rows_.push_back({name, built->TypeName(), out.ShapeString(), params});
    model->num_parameters_ += params;
    width = out.size();
    model->layers_.push_back(std::move(built));
    if (relu) model->layers_.push_back(std::make_unique<ReLU>(backend, absl::StrCat(name, "/relu")));
    return out;
  };
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
        const int64_t params = dense->num_params();
        width = layer.units();
        model->layers_.push_back(std::move(dense));
        if (layer.activation() == v1::RELU) {
          model->layers_.push_back(
              std::make_unique<ReLU>(backend, absl::StrCat(name, "/relu")));
        }
        image.reset();
        model->summary_rows_.push_back(
            {name, "Dense", absl::StrCat("(None, ", width, ")"), params});
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
        model->summary_rows_.push_back(
            {name, "ReLU",
             image ? image->ShapeString() : absl::StrCat("(None, ", width, ")"), 0});
        break;
      case v1::LayerSpec::CONV2D:
      case v1::LayerSpec::MAX_POOL2D:
      case v1::LayerSpec::AVG_POOL2D:
      case v1::LayerSpec::GLOBAL_AVG_POOL2D:
      case v1::LayerSpec::FLATTEN: {
        const v1::LayerSpec::Type type = layer.type();
        if (!image && type == v1::LayerSpec::FLATTEN) image = ImageDims{width, 1, 1};
        if (!image) {
          return absl::InvalidArgumentError(absl::StrCat(
              label, ": ", v1::LayerSpec::Type_Name(type), " needs an image input, but ",
              i == 0 ? "model.input_shape is unset"
                     : "the layer before it outputs plain features (DENSE or FLATTEN)"));
        }
        if (layer.strides() < 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(label, ": strides must be >= 0 (0: the default), got ",
                           layer.strides()));
        }
        if (layer.padding() != v1::LayerSpec::PADDING_VALID &&
            layer.padding() != v1::LayerSpec::PADDING_SAME) {
          return absl::InvalidArgumentError(absl::StrCat(
              label, ": unknown padding ", static_cast<int>(layer.padding())));
        }
        const Padding padding =
            layer.padding() == v1::LayerSpec::PADDING_SAME ? Padding::kSame : Padding::kValid;
        const char* default_name = type == v1::LayerSpec::CONV2D       ? "conv2d"
                                   : type == v1::LayerSpec::MAX_POOL2D ? "max_pooling2d"
                                   : type == v1::LayerSpec::AVG_POOL2D ? "average_pooling2d"
                                   : type == v1::LayerSpec::FLATTEN    ? "flatten"
                                                                       : "global_average_pooling2d";
        if (name.empty()) {
          name = UniqueName(default_name, used);
          used.insert(name);
        }
        if (type == v1::LayerSpec::CONV2D) {
          if (layer.kernel_size() <= 0 || layer.kernel_w() < 0) {
            return absl::InvalidArgumentError(absl::StrCat(
                label, ": CONV2D kernel_size must be > 0 and kernel_w >= 0, got ",
                layer.kernel_size(), " and ", layer.kernel_w()));
          }
          if (layer.activation() != v1::ACTIVATION_NONE && layer.activation() != v1::RELU) {
            return absl::InvalidArgumentError(absl::StrCat(
                label, ": unknown activation ", static_cast<int>(layer.activation())));
          }
        }
        TOWERPS_ASSIGN_OR_RETURN(LayerPlacement where, placer(name, layer.device()));
        Backend& backend = *where.backend;
        std::unique_ptr<ImageLayer> built;
        const std::string where_label = absl::StrCat(model_label, ": layer ", i);
        if (type == v1::LayerSpec::CONV2D) {
          Conv2D::Options o;
          o.filters = layer.filters();
          o.kernel_h = layer.kernel_size();
          o.kernel_w = layer.kernel_w() == 0 ? layer.kernel_size() : layer.kernel_w();
          o.stride = layer.strides() == 0 ? 1 : layer.strides();
          o.padding = padding;
          o.use_bias = !layer.no_bias();
          auto conv = Conv2D::Create(backend, name, *image, o);
          if (!conv.ok()) return common::Annotate(conv.status(), where_label);
          built = std::move(*conv);
        } else if (type == v1::LayerSpec::FLATTEN) {
          built = std::make_unique<Flatten>(backend, name, *image);
        } else {
          Pool2D::Options o;
          o.kind = type == v1::LayerSpec::MAX_POOL2D   ? Pool2D::Kind::kMax
                   : type == v1::LayerSpec::AVG_POOL2D ? Pool2D::Kind::kAvg
                                                       : Pool2D::Kind::kGlobalAvg;
          o.pool_size = layer.pool_size() == 0 ? 2 : layer.pool_size();
          o.stride = layer.strides();
          o.padding = padding;
          auto pool = Pool2D::Create(backend, name, *image, o);
          if (!pool.ok()) return common::Annotate(pool.status(), where_label);
          built = std::move(*pool);
        }
        const ImageDims out =
            append(std::move(built), backend, where.device, name,
                   type == v1::LayerSpec::CONV2D && layer.activation() == v1::RELU);
        // GlobalAveragePooling2D and Flatten end the image.
        if (type == v1::LayerSpec::FLATTEN || type == v1::LayerSpec::GLOBAL_AVG_POOL2D) {
          image.reset();
        } else {
          image = out;
        }
        break;
      }
      case v1::LayerSpec::BATCH_NORM:
      case v1::LayerSpec::DROPOUT:
      case v1::LayerSpec::RESIDUAL_BLOCK: {
        const v1::LayerSpec::Type type = layer.type();
        // Batch norm and dropout also take plain features, as a d x 1 x 1
        // image; a residual block needs an image.
        if (type == v1::LayerSpec::RESIDUAL_BLOCK && !image) {
          return absl::InvalidArgumentError(absl::StrCat(
              label, ": RESIDUAL_BLOCK needs an image input, but ",
              i == 0 ? "model.input_shape is unset"
                     : "the layer before it outputs plain features (DENSE or FLATTEN)"));
        }
        const ImageDims in = image ? *image : ImageDims{width, 1, 1};
        if (layer.activation() != v1::ACTIVATION_NONE && layer.activation() != v1::RELU) {
          return absl::InvalidArgumentError(absl::StrCat(
              label, ": unknown activation ", static_cast<int>(layer.activation())));
        }
        BatchNorm::Options bn;
        bn.momentum = layer.momentum() == 0.0f ? 0.99f : layer.momentum();
        bn.epsilon = layer.epsilon() == 0.0f ? 1e-3f : layer.epsilon();
        const char* default_name = type == v1::LayerSpec::BATCH_NORM ? "batch_normalization"
                                   : type == v1::LayerSpec::DROPOUT  ? "dropout"
                                                                     : "residual";
        if (name.empty()) {
          name = UniqueName(default_name, used);
          used.insert(name);
        }
        TOWERPS_ASSIGN_OR_RETURN(LayerPlacement where, placer(name, layer.device()));
        Backend& backend = *where.backend;
        const std::string where_label = absl::StrCat(model_label, ": layer ", i);
        std::unique_ptr<ImageLayer> built;
        if (type == v1::LayerSpec::BATCH_NORM) {
          auto made = BatchNorm::Create(backend, name, in, bn);
          if (!made.ok()) return common::Annotate(made.status(), where_label);
          built = std::move(*made);
        } else if (type == v1::LayerSpec::DROPOUT) {
          auto made = Dropout::Create(backend, name, in, layer.rate());
          if (!made.ok()) return common::Annotate(made.status(), where_label);
          built = std::move(*made);
        } else {
          if (layer.strides() < 0) {
            return absl::InvalidArgumentError(
                absl::StrCat(label, ": strides must be >= 0 (0: the default, 1), got ",
                             layer.strides()));
          }
          ResidualBlock::Options o;
          o.filters = layer.filters();
          o.stride = layer.strides() == 0 ? 1 : layer.strides();
          o.use_bias = !layer.no_bias();
          o.batch_norm = bn;
          auto made = ResidualBlock::Create(backend, name, in, o);
          if (!made.ok()) return common::Annotate(made.status(), where_label);
          built = std::move(*made);
        }
        const ImageDims out = append(std::move(built), backend, where.device, name,
                                     layer.activation() == v1::RELU);
        if (image) image = out;
        break;
      }
      case v1::LayerSpec::LAYER_UNSPECIFIED:
        return absl::InvalidArgumentError(
            absl::StrCat(label, ": type is unset (LAYER_UNSPECIFIED)"));
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            label, ": unknown layer type ", static_cast<int>(layer.type())));
    }
  }
  model->output_dim_ = width;
  for (const auto& l : model->layers_) {
    for (const Layer::ParamSpec& p : l->param_specs()) {
      if (p.moving_average) continue;
      int64_t n = 1;
      for (int64_t d : p.shape) n *= d;
      model->num_trainable_ += n;
    }
  }

  // Host weights and gradients, and their homes in the layers: a view for
  // layers on host memory, a device buffer otherwise (allocated now, so a
  // device too small for its weights fails here).
  for (size_t i = 0; i < model->layers_.size(); ++i) {
    Layer& layer = *model->layers_[i];
    model->layer_vars_.push_back(static_cast<int>(model->host_weights_.size()));
    const std::vector<std::vector<int64_t>> shapes = layer.param_shapes();
    const std::vector<DeviceTensor*> params = layer.params();
    const std::vector<DeviceTensor*> grads = layer.grads();
    for (size_t k = 0; k < shapes.size(); ++k) {
      model->host_weights_.emplace_back(shapes[k]);
      model->host_grads_.emplace_back(shapes[k]);
      model->device_weights_.push_back(params[k]);
      model->device_grads_.push_back(grads[k]);
      if (!layer.backend().host_memory()) {
        for (DeviceTensor* t : {params[k], grads[k]}) {
          absl::Status st = t->Resize(shapes[k]);
          if (!st.ok()) {
            return common::Annotate(st, absl::StrCat("layer \"", layer.name(), "\""));
          }
        }
      }
    }
  }
  model->layer_vars_.push_back(static_cast<int>(model->host_weights_.size()));
  for (size_t v = 0; v < model->host_weights_.size(); ++v) {
    DeviceTensor* w = model->device_weights_[v];
    if (w->backend()->host_memory()) {
      w->ViewHost(model->host_weights_[v].shape(), model->host_weights_[v].data());
      model->device_grads_[v]->ViewHost(model->host_grads_[v].shape(),
                                        model->host_grads_[v].data());
    }
  }
  // Pipeline stages: runs of layers on one backend.
  for (size_t i = 0; i < model->layers_.size(); ++i) {
    if (i == 0 || &model->layers_[i]->backend() != &model->layers_[i - 1]->backend()) {
      model->stages_.push_back({i, i + 1});
    } else {
      model->stages_.back().end = i + 1;
    }
  }
  // Each stage's first two layers with parameters: the first one's
  // gradients first when it is the larger (StepEvents).
  auto elements = [&](size_t layer) {
    int64_t n = 0;
    for (int v = model->layer_vars_[layer]; v < model->layer_vars_[layer + 1]; ++v) {
      n += model->host_weights_[v].num_elements();
    }
    return n;
  };
  for (Stage& stage : model->stages_) {
    std::vector<size_t> with_params;
    for (size_t i = stage.first; i < stage.end && with_params.size() < 2; ++i) {
      if (model->layer_vars_[i + 1] > model->layer_vars_[i]) with_params.push_back(i);
    }
    if (with_params.size() == 2 && model->layers_[with_params[0]]->SplitsBackward() &&
        model->layers_[with_params[1]]->SplitsBackward() &&
        elements(with_params[0]) > elements(with_params[1])) {
      stage.early = static_cast<int>(with_params[0]);
      stage.deferred = static_cast<int>(with_params[1]);
    }
  }
  return model;
}

}  // namespace towerps::worker
