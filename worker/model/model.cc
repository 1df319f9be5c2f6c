#include "worker/model/model.h"

#include <algorithm>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/initializer.h"
#include "common/status.h"
#include "worker/model/conv_layers.h"
#include "worker/model/losses.h"
#include "worker/model/model_limits.h"
#include "worker/model/norm_layers.h"
#include "worker/model/pipeline_scheduler.h"
#include "worker/model/residual.h"

namespace towerps::worker {
namespace {

// Rows of micro-batch k when n rows are cut into m: sizes differ by at most
// one, the larger first (Run's cut, which PrepareBuffers reserves for).
int64_t MicroBatchRows(int64_t n, int m, int k) { return n / m + (k < n % m ? 1 : 0); }

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

Model::Model(std::string name, v1::LossType loss, LossKind loss_kind,
             int64_t input_dim, uint64_t init_seed)
    : name_(std::move(name)),
      loss_(loss),
      loss_kind_(loss_kind),
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

std::vector<v1::VariableDef> Model::VariableDefs() const {
  std::vector<v1::VariableDef> defs;
  for (const auto& layer : layers_) {
    for (const Layer::ParamSpec& p : layer->param_specs()) {
      v1::VariableDef def;
      def.set_name(absl::StrCat(layer->name(), "/", p.name));
      for (int64_t d : p.shape) def.add_shape(d);
      def.set_dtype(v1::DT_FLOAT32);
      v1::Initializer* init = def.mutable_initializer();
      switch (p.init) {
        case Layer::ParamSpec::Init::kGlorotUniform:
          init->set_type(v1::Initializer::GLOROT_UNIFORM);
          init->set_seed(VariableSeed(init_seed_, static_cast<int64_t>(defs.size())));
          init->set_fan_in(p.fan_in);
          init->set_fan_out(p.fan_out);
          break;
        case Layer::ParamSpec::Init::kZeros:
          init->set_type(v1::Initializer::ZEROS);
          break;
        case Layer::ParamSpec::Init::kOnes:
          init->set_type(v1::Initializer::CONSTANT);
          init->set_value(1.0f);
          break;
      }
      if (p.moving_average) {
        def.set_update(v1::VariableDef::MOVING_AVERAGE);
        def.set_moving_average_decay(p.decay);
      }
      defs.push_back(std::move(def));
    }
  }
  return defs;
}

std::vector<common::Tensor*> Model::weights() {
  std::vector<common::Tensor*> out;
  for (common::Tensor& t : host_weights_) out.push_back(&t);
  return out;
}

std::vector<common::Tensor*> Model::gradients() {
  std::vector<common::Tensor*> out;
  for (common::Tensor& t : host_grads_) out.push_back(&t);
  return out;
}

void Model::PlaceHostTensors(size_t v, float* weight, float* grad, bool keep_values) {
  if (keep_values) {
    host_weights_[v].MoveTo(weight);
    host_grads_[v].MoveTo(grad);
  } else {
    host_weights_[v].LiveAt(weight);
    host_grads_[v].LiveAt(grad);
  }
  // Views of the old buffers follow (the weights' also at the next
  // LoadWeights or OwnWeight; the gradients' only here).
  DeviceTensor* w = device_weights_[v];
  if (w->backend()->host_memory()) {
    w->ViewHost(host_weights_[v].shape(), host_weights_[v].data());
    device_grads_[v]->ViewHost(host_grads_[v].shape(), host_grads_[v].data());
  }
}

std::vector<DeviceTensor*> Model::device_gradients() { return device_grads_; }

void Model::InitializeWeights() {
  const std::vector<v1::VariableDef> defs = VariableDefs();
  for (size_t i = 0; i < defs.size(); ++i) {
    common::InitializeValues(defs[i].initializer(), host_weights_[i].span());
  }
}

absl::Status Model::OwnWeight(size_t v) {
  DeviceTensor* w = device_weights_[v];
  if (w->backend()->host_memory()) {
    if (w->data() != host_weights_[v].data()) {
      w->ViewHost(host_weights_[v].shape(), host_weights_[v].data());
    }
    return absl::OkStatus();
  }
  if (w->is_view()) return w->Resize(host_weights_[v].shape());
  return absl::OkStatus();
}

absl::Status Model::LoadWeights(const std::vector<common::Tensor*>& host) {
  if (host.size() != device_weights_.size()) {
    return absl::InternalError(absl::StrCat("model '", name_, "': ", host.size(),
                                            " weight tensors for ",
                                            device_weights_.size(), " variables"));
  }
  for (size_t v = 0; v < host.size(); ++v) {
    DeviceTensor* w = device_weights_[v];
    if (host[v]->num_elements() != host_weights_[v].num_elements()) {
      return absl::InternalError(absl::StrCat("model '", name_, "': weight ", v,
                                              " has shape ", host[v]->ShapeString(),
                                              ", want ", host_weights_[v].ShapeString()));
    }
    if (w->backend()->host_memory()) {
      if (w->data() != host[v]->data()) w->ViewHost(host[v]->shape(), host[v]->data());
    } else {
      TOWERPS_RETURN_IF_ERROR(OwnWeight(v));
      w->backend()->CopyFromHost(host[v]->data(), host[v]->num_elements(), w->data());
    }
  }
  return absl::OkStatus();
}

absl::Status Model::ShareWeights(const std::vector<Model*>& from) {
  for (const Model* m : from) {
    if (m->device_weights_.size() != device_weights_.size()) {
      return absl::InternalError(absl::StrCat("model '", name_, "': cannot share the weights of '",
                                              m->name_, "': different variables"));
    }
  }
  for (size_t v = 0; v < device_weights_.size(); ++v) {
    DeviceTensor* w = device_weights_[v];
    DeviceTensor* src = from[0]->device_weights_[v];
    for (const Model* m : from) {
      if (m->device_weights_[v]->backend()->memory_space() == w->backend()->memory_space()) {
        src = m->device_weights_[v];
        break;
      }
    }
    if (src->num_elements() != host_weights_[v].num_elements()) {
      return absl::InternalError(absl::StrCat("model '", name_, "': weight ", v, " has shape ",
                                              src->ShapeString(), ", want ",
                                              host_weights_[v].ShapeString()));
    }
    if (w->backend()->memory_space() == src->backend()->memory_space()) {
      if (w->data() != src->data()) w->View(src->shape(), src->data());
    } else {
      TOWERPS_RETURN_IF_ERROR(OwnWeight(v));
      TOWERPS_RETURN_IF_ERROR(
          w->backend()->CopyFrom(*src->backend(), src->data(), src->num_elements(), w->data()));
    }
  }
  return absl::OkStatus();
}

absl::Status Model::SynchronizeDevices() {
  for (const Stage& stage : stages_) {
    TOWERPS_RETURN_IF_ERROR(layers_[stage.first]->backend().Synchronize());
  }
  return absl::OkStatus();
}

absl::Status Model::DownloadGradients() {
  for (size_t v = 0; v < device_grads_.size(); ++v) {
    DeviceTensor* g = device_grads_[v];
    if (g->backend()->host_memory()) continue;
    TOWERPS_RETURN_IF_ERROR(
        g->backend()->CopyToHost(g->data(), g->num_elements(), host_grads_[v].data()));
  }
  return absl::OkStatus();
}

bool Model::SameSpace(size_t a, size_t b) const {
  Backend& x = layers_[a]->backend();
  Backend& y = layers_[b]->backend();
  return &x == &y || x.memory_space() == y.memory_space();
}

void Model::EnsureFlows(size_t n) {
  while (flows_.size() < n) {
    Flow f;
    for (const auto& layer : layers_) {
      Backend* b = &layer->backend();
      f.in.emplace_back(b);
      f.out.emplace_back(b);
      f.dout.emplace_back(b);
      f.din.emplace_back(b);
    }
    f.x.assign(layers_.size(), nullptr);
    f.labels = DeviceTensor(&layers_.back()->backend());
    f.targets = DeviceTensor(&layers_.back()->backend());
    flows_.push_back(std::move(f));
  }
}

absl::StatusOr<const DeviceTensor*> Model::Input(const Batch& batch, Flow& flow,
                                                 size_t i) {
  Backend& b = layers_[i]->backend();
  DeviceTensor& in = flow.in[i];
  if (i == 0) {
    const float* rows = batch.features.data() + flow.begin * input_dim_;
    if (b.host_memory()) {
      in.ViewHost({flow.rows, input_dim_}, rows);
    } else {
      TOWERPS_RETURN_IF_ERROR(in.Resize({flow.rows, input_dim_}));
      b.CopyFromHost(rows, flow.rows * input_dim_, in.data());
    }
    return &in;
  }
  const DeviceTensor& prev = flow.out[i - 1];
  if (SameSpace(i - 1, i)) return &prev;
  TOWERPS_RETURN_IF_ERROR(in.Resize(prev.shape()));
  TOWERPS_RETURN_IF_ERROR(
      b.CopyFrom(layers_[i - 1]->backend(), prev.data(), prev.num_elements(), in.data()));
  return &in;
}

absl::Status Model::LayerWeightsNeeded(size_t i) {
  const int first = layer_vars_[i], end = layer_vars_[i + 1];
  if (first == end) return absl::OkStatus();
  if (events_->weights_needed) {
    TOWERPS_RETURN_IF_ERROR(events_->weights_needed(first, end - first));
  }
  // Host-memory layers read weights() in place (their views were set before
  // the step); a GPU layer uploads its own now.
  for (int v = first; v < end; ++v) {
    DeviceTensor* w = device_weights_[v];
    if (w->backend()->host_memory()) continue;
    TOWERPS_RETURN_IF_ERROR(OwnWeight(v));
    w->backend()->CopyFromHost(host_weights_[v].data(), host_weights_[v].num_elements(),
                               w->data());
  }
  return absl::OkStatus();
}

absl::Status Model::LayerGradientsReady(size_t i) {
  const int first = layer_vars_[i], end = layer_vars_[i + 1];
  if (first == end) return absl::OkStatus();
  for (int v = first; v < end; ++v) {
    DeviceTensor* g = device_grads_[v];
    if (g->backend()->host_memory()) continue;
    TOWERPS_RETURN_IF_ERROR(
        g->backend()->CopyToHost(g->data(), g->num_elements(), host_grads_[v].data()));
  }
  if (!events_->gradients_ready) return absl::OkStatus();
  return events_->gradients_ready(first, end - first);
}

absl::Status Model::StageForward(const Batch& batch, size_t s, Flow& flow, int k,
                                 int64_t grad_count) {
  const Stage& stage = stages_[s];
  for (size_t i = stage.first; i < stage.end; ++i) {
    if (events_ != nullptr && k == 0) TOWERPS_RETURN_IF_ERROR(LayerWeightsNeeded(i));
    TOWERPS_ASSIGN_OR_RETURN(const DeviceTensor* x, Input(batch, flow, i));
    flow.x[i] = x;
    TOWERPS_RETURN_IF_ERROR(layers_[i]->Forward(*x, &flow.out[i]));
    // Sized by its owner now, so that the next device writes into it in
    // place during the backward pass.
    if (grad_count > 0) TOWERPS_RETURN_IF_ERROR(flow.dout[i].Resize(flow.out[i].shape()));
  }
  Backend& b = layers_[stage.end - 1]->backend();
  if (s + 1 < stages_.size()) return b.Synchronize();

  // The last stage: the loss of this micro-batch.
  const size_t last = layers_.size() - 1;
  const int64_t n = flow.rows;
  const int64_t d = output_dim_;
  const float* labels = nullptr;
  const float* targets = nullptr;
  if (loss_kind_ != LossKind::kSoftmaxCrossEntropy) {
    const float* rows = batch.targets.data() + flow.begin * d;
    if (b.host_memory()) {
      targets = rows;
    } else {
      TOWERPS_RETURN_IF_ERROR(flow.targets.Resize({n, d}));
      b.CopyFromHost(rows, n * d, flow.targets.data());
      targets = flow.targets.data();
    }
  } else {
    flow.host_labels.assign(batch.labels.begin() + flow.begin,
                            batch.labels.begin() + flow.begin + n);
    if (b.host_memory()) {
      labels = flow.host_labels.data();
    } else {
      TOWERPS_RETURN_IF_ERROR(flow.labels.Resize({n}));
      b.CopyFromHost(flow.host_labels.data(), n, flow.labels.data());
      labels = flow.labels.data();
    }
  }
  TOWERPS_ASSIGN_OR_RETURN(
      flow.loss, b.Loss(loss_kind_, n, d, flow.out[last].data(), labels, targets,
                        grad_count > 0 ? flow.dout[last].data() : nullptr,
                        grad_count > 0 ? grad_count : n));
  return absl::OkStatus();
}

absl::Status Model::StageBackward(const Batch& batch, size_t s, Flow& flow, int k,
                                  int m) {
  // Micro-batches after the first add to the gradients; the last one
  // finishes them.
  const bool accumulate = k > 0;
  const bool last = events_ != nullptr && k == m - 1;
  const Stage& stage = stages_[s];
  // The gradient of this stage's output, if it came from another device.
  const size_t top = stage.end - 1;
  if (top + 1 < layers_.size() && !SameSpace(top, top + 1)) {
    const DeviceTensor& g = flow.din[top + 1];
    TOWERPS_RETURN_IF_ERROR(flow.dout[top].Resize(g.shape()));
    TOWERPS_RETURN_IF_ERROR(layers_[top]->backend().CopyFrom(
        layers_[top + 1]->backend(), g.data(), g.num_elements(), flow.dout[top].data()));
  }
  for (size_t i = stage.end; i-- > stage.first;) {
    const DeviceTensor* x = flow.x[i];  // as in the forward pass
    DeviceTensor* dx = nullptr;
    if (i > 0) dx = SameSpace(i - 1, i) ? &flow.dout[i - 1] : &flow.din[i];
    if (static_cast<int>(i) == stage.deferred) {
      // Only backpropagated here; its gradients after the early layer's
      // (its own output gradient, dout, stays as it is until then).
      TOWERPS_RETURN_IF_ERROR(layers_[i]->BackwardInput(*x, flow.out[i], flow.dout[i], dx));
      continue;
    }
    TOWERPS_RETURN_IF_ERROR(
        layers_[i]->Backward(*x, flow.out[i], flow.dout[i], dx, accumulate));
    if (last) TOWERPS_RETURN_IF_ERROR(LayerGradientsReady(i));
    if (static_cast<int>(i) == stage.early) {
      const size_t d = static_cast<size_t>(stage.deferred);
      TOWERPS_RETURN_IF_ERROR(
          layers_[d]->BackwardParams(*flow.x[d], flow.out[d], flow.dout[d], accumulate));
      if (last) TOWERPS_RETURN_IF_ERROR(LayerGradientsReady(d));
    }
  }
  return layers_[stage.first]->backend().Synchronize();
}

absl::StatusOr<LossResult> Model::Run(const Batch& batch, bool train,
                                      const StepEvents* events) {
  if (batch.features.rank() != 2 || batch.features.dim(1) != input_dim_) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", name_, "': features have shape ",
                     batch.features.ShapeString(), ", want [n,", input_dim_, "]"));
  }
  const int64_t n = batch.features.dim(0);
  TOWERPS_RETURN_IF_ERROR(ValidateLossInputs(loss_, n, output_dim_, batch));
  // An evaluation is cut into micro-batches as training is: the same
  // buffers (PrepareBuffers), none larger.
  const int m = static_cast<int>(std::min<int64_t>(micro_batches_, n));
  EnsureFlows(m);
  int64_t begin = 0;
  for (int k = 0; k < m; ++k) {
    flows_[k].begin = begin;
    flows_[k].rows = MicroBatchRows(n, m, k);
    begin += flows_[k].rows;
  }
  const int64_t grad_count = train ? n : 0;
  const uint64_t seed = VariableSeed(init_seed_ ^ VariableSeed(random_stream_, 0),
                                     static_cast<int64_t>(passes_++));
  for (const auto& layer : layers_) layer->BeginPass(train, n, seed);
  // The scheduler decides when each stage runs which micro-batch (and on
  // which thread); the stages' steps are ours.
  PipelineScheduler pipeline(static_cast<int>(stages_.size()), m);
  const PipelineScheduler::Step forward = [&](int s, int k) {
    return StageForward(batch, s, flows_[k], k, grad_count);
  };
  const PipelineScheduler::Step backward = [&](int s, int k) {
    return StageBackward(batch, s, flows_[k], k, m);
  };
  events_ = events;
  const absl::Status run = pipeline.Run(forward, train ? backward : nullptr);
  events_ = nullptr;
  TOWERPS_RETURN_IF_ERROR(run);
  LossResult total;
  for (int k = 0; k < m; ++k) {
    total.loss_sum += flows_[k].loss.loss_sum;
    total.correct += flows_[k].loss.correct;
  }
  return total;
}

absl::StatusOr<LossResult> Model::ComputeDeviceGradients(const Batch& batch) {
  if (batch.size() == 0) {
    for (DeviceTensor* g : device_grads_) g->backend()->Zero(g->num_elements(), g->data());
    for (const auto& layer : layers_) TOWERPS_RETURN_IF_ERROR(layer->backend().Synchronize());
    return LossResult();
  }
  return Run(batch, /*train=*/true);
}

absl::StatusOr<LossResult> Model::ComputeGradients(const Batch& batch) {
  TOWERPS_RETURN_IF_ERROR(LoadWeights(weights()));
  TOWERPS_ASSIGN_OR_RETURN(LossResult r, ComputeDeviceGradients(batch));
  TOWERPS_RETURN_IF_ERROR(DownloadGradients());
  return r;
}

absl::StatusOr<LossResult> Model::ComputeGradients(const Batch& batch,
                                                   const StepEvents& events) {
  const int all = static_cast<int>(host_weights_.size());
  if (batch.size() == 0) {
    if (events.weights_needed) TOWERPS_RETURN_IF_ERROR(events.weights_needed(0, all));
    TOWERPS_ASSIGN_OR_RETURN(LossResult r, ComputeDeviceGradients(batch));
    TOWERPS_RETURN_IF_ERROR(DownloadGradients());
    if (events.gradients_ready) TOWERPS_RETURN_IF_ERROR(events.gradients_ready(0, all));
    return r;
  }
  // Host-memory layers read weights() in place: point them there now (no
  // values are read until each layer's wait).
  for (int v = 0; v < all; ++v) {
    DeviceTensor* w = device_weights_[v];
    if (w->backend()->host_memory() && w->data() != host_weights_[v].data()) {
      w->ViewHost(host_weights_[v].shape(), host_weights_[v].data());
    }
  }
  return Run(batch, /*train=*/true, &events);
}

absl::StatusOr<LossResult> Model::Evaluate(const Batch& batch) {
  if (batch.size() == 0) return LossResult();
  TOWERPS_RETURN_IF_ERROR(LoadWeights(weights()));
  return Run(batch, /*train=*/false);
}

absl::Status Model::PrepareBuffers(int64_t max_batch) {
  if (max_batch <= 0) return absl::OkStatus();
  // One flow per micro-batch, each for its rows of the batch (Run's cut).
  const int m = static_cast<int>(std::min<int64_t>(micro_batches_, max_batch));
  EnsureFlows(m);
  for (int k = 0; k < m; ++k) {
    Flow& f = flows_[k];
    const int64_t rows = MicroBatchRows(max_batch, m, k);
    int64_t width = input_dim_;
    for (size_t i = 0; i < layers_.size(); ++i) {
      const int64_t out = layers_[i]->OutputDim(width);
      absl::Status st = f.out[i].Resize({rows, out});
      if (st.ok()) st = f.dout[i].Resize({rows, out});
      if (st.ok() && i == 0 && !layers_[i]->backend().host_memory()) {
        st = f.in[i].Resize({rows, width});
      }
      if (st.ok() && i > 0 && !SameSpace(i - 1, i)) {
        st = f.in[i].Resize({rows, width});
        if (st.ok()) st = f.din[i].Resize({rows, width});
      }
      if (!st.ok()) {
        return common::Annotate(st, absl::StrCat("layer \"", layers_[i]->name(), "\""));
      }
      width = out;
    }
  }
  return absl::OkStatus();
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
            r.output_shape, absl::StrCat(r.params));
  }
  out += std::string(kWidth, '=') + "\n";
  out += absl::StrCat("Total params: ", WithThousands(num_parameters_), "\n");
  out += absl::StrCat("Trainable params: ", WithThousands(num_trainable_), "\n");
  out += absl::StrCat("Non-trainable params: ", WithThousands(num_parameters_ - num_trainable_),
                      "\n");
  out += std::string(kWidth, '_') + "\n";
  return out;
}

std::vector<Model::LayerMemory> Model::ParamMemory() const {
  std::vector<LayerMemory> out;
  for (const SummaryRow& r : summary_rows_) {
    out.push_back({r.name, 2 * r.params * static_cast<int64_t>(sizeof(float))});
  }
  return out;
}

}  // namespace towerps::worker
