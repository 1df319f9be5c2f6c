#include "worker/model/model_limits.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/checked_math.h"
#include "common/status.h"

namespace towerps::worker {

using common::SaturatingAdd;
using common::SaturatingMul;

namespace {

// Only the upper bound: Model::Create refuses values that are too small, in
// its own words. Estimates use max(value, 0).
absl::Status OutOfRange(const std::string& field, int64_t value, int64_t hi) {
  return absl::InvalidArgumentError(
      absl::StrCat("model.", field, " = ", value, " (limit ", hi, ")"));
}

}  // namespace

absl::StatusOr<ModelSize> CheckModelLimits(const v1::ModelSpec& spec, const ModelLimits& limits) {
  if (spec.layers_size() > limits.max_layers) {
    return absl::InvalidArgumentError(absl::StrCat("model.layers has ", spec.layers_size(),
                                                   " layers (limit ", limits.max_layers, ")"));
  }
  if (spec.input_dim() > limits.max_width) {
    return OutOfRange("input_dim", spec.input_dim(), limits.max_width);
  }
  ModelSize size;
  // The current rows: `width` floats per example; while image layers run,
  // `channels` x `pixels` of them.
  int64_t width = std::max(1, spec.input_dim());
  int64_t channels = width, height = 1, cols = 1;
  // Output side of a window over `side`: ceil(side / stride) with SAME
  // padding (and a residual block's one row and column each side), else
  // the windows that fit (at least 1: Model::Create refuses a window that
  // does not fit, in its own words).
  auto shrink = [](int64_t side, int64_t window, int64_t stride, bool same) {
    if (same) return (side + stride - 1) / stride;
    return side >= window ? (side - window) / stride + 1 : int64_t{1};
  };
  auto same = [](const v1::LayerSpec& l) { return l.padding() == v1::LayerSpec::PADDING_SAME; };
  bool image = false;
  if (spec.has_input_shape()) {
    const v1::ImageShape& in = spec.input_shape();
    for (const auto& [name, v] : {std::pair<const char*, int>{"channels", in.channels()},
                                  {"height", in.height()},
                                  {"width", in.width()}}) {
      if (v > limits.max_width) {
        return OutOfRange(absl::StrCat("input_shape.", name), v, limits.max_width);
      }
    }
    if (in.channels() > 0 && in.height() > 0 && in.width() > 0) {
      image = true;
      channels = in.channels();  // positive here
      height = in.height();
      cols = in.width();
    }
  }
  for (int i = 0; i < spec.layers_size(); ++i) {
    const v1::LayerSpec& l = spec.layers(i);
    const int64_t width_in = width;
    const int64_t channels_in = image ? channels : width;
    const std::string at = absl::StrCat("layers[", i, "].");
    auto within = [&](const char* field, int64_t v, int64_t hi) -> absl::Status {
      if (v > hi) return OutOfRange(at + field, v, hi);
      return absl::OkStatus();
    };
    auto pos = [](int64_t v) { return std::max<int64_t>(v, 0); };
    int64_t params = 0;
    const int64_t bias = l.no_bias() ? 0 : 1;  // per output channel or unit
    switch (l.type()) {
      case v1::LayerSpec::DENSE:
        TOWERPS_RETURN_IF_ERROR(within("units", l.units(), limits.max_width));
        params = SaturatingMul(SaturatingAdd(width, 1), pos(l.units()));
        size.floats_to_accumulate =
            SaturatingAdd(size.floats_to_accumulate, SaturatingMul(bias, pos(l.units())));
        width = pos(l.units());
        image = false;
        break;
      case v1::LayerSpec::CONV2D:
      case v1::LayerSpec::RESIDUAL_BLOCK: {
        TOWERPS_RETURN_IF_ERROR(within("filters", l.filters(), limits.max_width));
        TOWERPS_RETURN_IF_ERROR(within("strides", l.strides(), limits.max_kernel));
        const int64_t in_c = image ? channels : width;
        const int64_t f = pos(l.filters());
        int64_t kh = 3, kw = 3;  // a residual block's, padded to keep the side
        if (l.type() == v1::LayerSpec::CONV2D) {
          TOWERPS_RETURN_IF_ERROR(
              within("kernel_size", l.kernel_size(), limits.max_kernel));
          TOWERPS_RETURN_IF_ERROR(within("kernel_w", l.kernel_w(), limits.max_kernel));
          kh = pos(l.kernel_size());
          kw = l.kernel_w() == 0 ? kh : pos(l.kernel_w());
          params = SaturatingAdd(SaturatingMul(SaturatingMul(f, in_c), kh * kw), f);
          size.floats_to_accumulate = SaturatingAdd(
              size.floats_to_accumulate,
              SaturatingAdd(SaturatingMul(SaturatingMul(f, in_c), kh * kw), bias * f));
        } else {
          // Two 3x3 convolutions, two batch norms (4 per channel), a 1x1
          // shortcut, biases.
          params = SaturatingAdd(SaturatingMul(SaturatingMul(f, in_c), 9 + 1),
                                 SaturatingMul(SaturatingMul(f, f), 9));
          params = SaturatingAdd(params, SaturatingMul(f, 3 + 8));
          // Its convolutions' kernels and biases: conv1, conv2 and, where
          // the side or the channels change, the 1x1 projection.
          const int64_t projection = l.strides() > 1 || in_c != f ? 1 : 0;
          const int64_t kernels =
              SaturatingAdd(SaturatingMul(SaturatingMul(f, in_c), 9 + projection),
                            SaturatingMul(SaturatingMul(f, f), 9));
          size.floats_to_accumulate =
              SaturatingAdd(size.floats_to_accumulate,
                            SaturatingAdd(kernels, SaturatingMul(bias * (2 + projection), f)));
        }
        if (!image) height = cols = 1;
        const int64_t stride = l.strides() > 0 ? l.strides() : 1;
        const bool padded = l.type() == v1::LayerSpec::RESIDUAL_BLOCK || same(l);
        height = shrink(height, kh, stride, padded);
        cols = shrink(cols, kw, stride, padded);
        channels = f;
        image = true;
        width = SaturatingMul(channels, SaturatingMul(height, cols));
        break;
      }
      case v1::LayerSpec::MAX_POOL2D:
      case v1::LayerSpec::AVG_POOL2D:
        TOWERPS_RETURN_IF_ERROR(within("pool_size", l.pool_size(), limits.max_kernel));
        TOWERPS_RETURN_IF_ERROR(within("strides", l.strides(), limits.max_kernel));
        if (image) {
          const int64_t pool = l.pool_size() > 0 ? l.pool_size() : 2;
          const int64_t stride = l.strides() > 0 ? l.strides() : pool;
          height = shrink(height, pool, stride, same(l));
          cols = shrink(cols, pool, stride, same(l));
          width = SaturatingMul(channels, SaturatingMul(height, cols));
        }
        break;
      case v1::LayerSpec::GLOBAL_AVG_POOL2D:
        if (image) width = channels;
        image = false;
        break;
      case v1::LayerSpec::FLATTEN:
        image = false;
        break;
      case v1::LayerSpec::BATCH_NORM:
        params = SaturatingMul(4, image ? channels : width);
        break;
      default:  // ReLU, dropout: no parameters, same width. Unknown: Create says.
        break;
    }
    size.parameters = SaturatingAdd(size.parameters, params);
    // What a training step holds for the layer, as the layers do
    // (worker/model): its output and that output's gradient (Model's flow),
    // and a fused ReLU is a layer of its own; beyond those two, a max pool
    // keeps its workspace and recomputed output, a dropout its mask, and a
    // residual block its three intermediates, three gradients, and with a
    // projection the projection's input gradient. Batch norms (a residual
    // block has two) keep 4 floats per channel per step.
    int64_t per_example = 2;
    const bool fuses_relu = l.type() == v1::LayerSpec::DENSE ||
                            l.type() == v1::LayerSpec::CONV2D ||
                            l.type() == v1::LayerSpec::BATCH_NORM ||
                            l.type() == v1::LayerSpec::RESIDUAL_BLOCK;
    if (fuses_relu && l.activation() == v1::RELU) per_example += 2;
    switch (l.type()) {
      case v1::LayerSpec::MAX_POOL2D:
        if (image) per_example += 2;
        break;
      case v1::LayerSpec::DROPOUT:
        per_example += 1;
        break;
      case v1::LayerSpec::RESIDUAL_BLOCK:
        per_example += 6;
        if (l.strides() > 1 || channels_in != channels) {
          size.activations_per_example = SaturatingAdd(size.activations_per_example, width_in);
        }
        size.floats_per_step = SaturatingAdd(size.floats_per_step, SaturatingMul(8, channels));
        size.floats_per_micro_batch =
            SaturatingAdd(size.floats_per_micro_batch, SaturatingMul(4, channels));
        break;
      case v1::LayerSpec::BATCH_NORM:
        size.floats_per_step =
            SaturatingAdd(size.floats_per_step, SaturatingMul(4, image ? channels : width));
        size.floats_per_micro_batch =
            SaturatingAdd(size.floats_per_micro_batch, SaturatingMul(2, image ? channels : width));
        break;
      default:
        break;
    }
    size.activations_per_example =
        SaturatingAdd(size.activations_per_example, SaturatingMul(per_example, width));
    if (size.parameters > limits.max_parameters) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model: about ", size.parameters, " parameters up to model.layers[", i, "] (limit ",
          limits.max_parameters, " for the whole model)"));
    }
  }
  return size;
}

int64_t TowerBatch(int64_t global_batch, int num_workers, int num_towers) {
  const int64_t workers = std::max(1, num_workers);
  const int64_t towers = std::max(1, num_towers);
  return ((global_batch + workers - 1) / workers + towers - 1) / towers;
}

int64_t WorkerTrainingBytes(const ModelSize& size, int64_t examples_per_step, int towers,
                            int micro_batches) {
  int64_t per_tower = SaturatingAdd(
      SaturatingAdd(SaturatingMul(size.parameters, 2), size.floats_per_step),
      SaturatingMul(size.activations_per_example, std::max<int64_t>(1, examples_per_step)));
  if (micro_batches > 1) {
    per_tower = SaturatingAdd(
        per_tower, SaturatingAdd(size.floats_to_accumulate,
                                 SaturatingMul(size.floats_per_micro_batch, micro_batches - 1)));
  }
  return SaturatingMul(SaturatingMul(per_tower, sizeof(float)), std::max(1, towers));
}

}  // namespace towerps::worker
